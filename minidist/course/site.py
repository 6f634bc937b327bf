"""Build the course as a static website: `python -m minidist site [--out build/site]`.

Every `notebooks/*.ipynb` becomes one page, rendered from its committed outputs (nothing
is re-executed) by nbconvert's HTML exporter with its JupyterLab template; the README is
the landing page and the lessons, in file order, are the table of contents, so a new
lesson notebook is a new page with no edit here. Each lesson page links to its package's
source files (the packages whose `__init__` docstring says "Lesson NN", or whose checkers
its exercises import), to its exercise notebook and to Colab, all built from the
`Repository` URL in pyproject.toml's `[project.urls]`.

Offline by construction: nbconvert ships its templates and CSS, figures are embedded in
the pages as data URIs, and MathJax 2 is copied from the `jupyter-server-mathjax` package
into the site (nbconvert's template would load it, and require.js, from a CDN). The pages
load nothing from another host.

Every figure gets alternative text (`site_assets.alt_text`): the summary line of the course
plotting function the cell calls, which says what the figure shows, else the first sentence
of the text that introduces it; nbconvert's inlined theme is written once and linked.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from .site_assets import _has_figure, _shared_styles, _with_alt_texts, alt_text  # noqa: F401
from .site_template import TEMPLATE

BRANCH = "main"
MATHJAX = "_static/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"
HREF = re.compile(r'(<a\s[^>]*?href=")([^"]*)(")')
COLAB = "https://colab.research.google.com/github/{slug}/blob/{branch}/{path}"


@dataclass
class Page:
    """One page of the site: where it comes from and what it links to."""

    source: Path  # the notebook, or README.md for the landing page
    html_name: str
    title: str
    packages: list[str] = field(default_factory=list)
    exercise: Path | None = None


def repository_url(root: Path) -> str:
    """`Repository` of pyproject.toml's [project.urls] (the one place the URL is written)."""
    text = (root / "pyproject.toml").read_text()
    section = re.search(r"^\[project\.urls\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    url = section and re.search(r'^Repository\s*=\s*"([^"]+)"', section.group(1), re.M)
    if not url or not url.group(1).startswith("https://github.com/"):
        raise ValueError(
            'pyproject.toml needs [project.urls] Repository = "https://github.com/OWNER/NAME" '
            "(the site's source, exercise and Colab links are built from it)"
        )
    return url.group(1).rstrip("/")


def notebook_title(path: Path) -> str:
    """The first level-1 heading of the notebook's first markdown cell."""
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            src = "".join(cell["source"])
            found = re.search(r"^#\s+(.+)$", src, re.M)
            if found:
                return found.group(1).strip()
    raise ValueError(f"{path} must start with a markdown cell holding a '# title' heading")


def lesson_packages(root: Path, notebook: Path) -> list[str]:
    """Packages of lesson NN: their docstring says "Lesson NN", or NN's checks import them."""
    number = notebook.name[:2]
    found = set()
    for init in sorted((root / "minidist").glob("*/__init__.py")):
        docstring = init.read_text().split('"""')[1:2]
        if docstring and re.search(rf"\bLesson {number}\b", docstring[0]):
            found.add(init.parent.name)
    exercise = root / "exercises" / notebook.name
    if exercise.exists():
        found |= set(re.findall(r"minidist\.(\w+)\.check\b", exercise.read_text()))
    return sorted(found)


def pages(root: Path) -> list[Page]:
    """The landing page, then one page per notebooks/*.ipynb in file order."""
    out = [Page(root / "README.md", "index.html", "minidist")]
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        exercise = root / "exercises" / nb.name
        out.append(
            Page(
                nb,
                f"{nb.stem}.html",
                notebook_title(nb),
                lesson_packages(root, nb),
                exercise if exercise.exists() else None,
            )
        )
    return out


def _rewrite_links(body: str, page: Page, lessons: dict[Path, str], root: Path, repo: str) -> str:
    """Relative links of the README and notebooks: lessons to their pages, files to GitHub."""

    def fix(match: re.Match) -> str:
        href = html.unescape(match.group(2))
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^//", href, re.I) or not href:
            return match.group(0)
        path, _, anchor = href.partition("#")
        if path in lessons.values() or path.startswith("_downloads/"):
            return match.group(0)  # the template's own links
        target = (page.source.parent / path).resolve()
        if not target.is_relative_to(root):
            return match.group(0)
        if target in lessons:
            new = lessons[target] + (f"#{anchor}" if anchor else "")
        else:
            rel = target.relative_to(root).as_posix()
            new = f"{repo}/blob/{BRANCH}/{quote(rel)}" + (f"#{anchor}" if anchor else "")
        return match.group(1) + html.escape(new) + match.group(3)

    return HREF.sub(fix, body)


def _links(page: Page, root: Path, repo: str) -> dict:
    """What the template puts above a lesson: Colab, exercises, source files."""
    slug = repo.removeprefix("https://github.com/")
    rel = page.source.relative_to(root).as_posix()
    links = {"colab": COLAB.format(slug=slug, branch=BRANCH, path=rel), "repo": repo}
    links["notebook_github"] = f"{repo}/blob/{BRANCH}/{rel}"
    if page.exercise is not None:
        ex = page.exercise.relative_to(root).as_posix()
        links["exercise"] = {
            "name": page.exercise.name,
            "download": f"_downloads/exercises/{page.exercise.name}",
            "colab": COLAB.format(slug=slug, branch=BRANCH, path=ex),
            "github": f"{repo}/blob/{BRANCH}/{ex}",
        }
    links["packages"] = []
    for name in page.packages:
        pkg = root / "minidist" / name
        files = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py"))
        links["packages"].append(
            {
                "name": f"minidist/{name}/",
                "url": f"{repo}/tree/{BRANCH}/minidist/{name}",
                "files": [(f, f"{repo}/blob/{BRANCH}/minidist/{name}/{f}") for f in files],
            }
        )
    return links


def _notebook_for(page: Page):
    import nbformat

    if page.source.suffix == ".ipynb":
        nb = nbformat.read(page.source, as_version=4)
    else:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_markdown_cell(page.source.read_text())]
    nb.metadata["title"] = page.title
    intro = ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            intro = cell.source
        elif _has_figure(cell) and "alt" not in cell.metadata:
            cell.metadata["alt"] = alt_text(cell.source, nb, intro, page.title)
    return nb


def build_site(root: Path, out: Path) -> list[Page]:
    """Write the site into `out` (replaced); returns its pages."""
    import importlib.util

    import jinja2
    from nbconvert import HTMLExporter

    root = root.resolve()
    repo = repository_url(root)
    site = pages(root)
    lessons = {p.source.resolve(): p.html_name for p in site}
    exporter = HTMLExporter(
        template_name="lab",
        template_file="minidist_site.html.j2",
        extra_loaders=[jinja2.DictLoader({"minidist_site.html.j2": TEMPLATE})],
        mathjax_url=MATHJAX,
        exclude_anchor_links=False,
    )
    if out.exists():
        shutil.rmtree(out)
    (out / "_static").mkdir(parents=True)
    # Found, not imported: importing it would import jupyter_server (seconds).
    spec = importlib.util.find_spec("jupyter_server_mathjax")
    if spec is None:
        raise ModuleNotFoundError("the site needs MathJax: pip install jupyter-server-mathjax")
    mathjax = Path(spec.submodule_search_locations[0]) / "static"
    shutil.copytree(mathjax, out / "_static" / "mathjax")
    toc = [(p.html_name, p.title) for p in site[1:]]
    for i, page in enumerate(site):
        resources = {
            "minidist": {
                "page": page.html_name,
                "toc": toc,
                "prev": site[i - 1].html_name if i > 0 else None,
                "next": site[i + 1].html_name if i + 1 < len(site) else None,
                "links": _links(page, root, repo) if i > 0 else None,
                "repo": repo,
            }
        }
        nb = _notebook_for(page)
        body, _ = exporter.from_notebook_node(nb, resources=resources)
        body = _shared_styles(_with_alt_texts(body, nb), out)
        (out / page.html_name).write_text(_rewrite_links(body, page, lessons, root, repo))
        if page.exercise is not None:
            (out / "_downloads" / "exercises").mkdir(parents=True, exist_ok=True)
            shutil.copy(page.exercise, out / "_downloads" / "exercises" / page.exercise.name)
    return site


def run_site(root: Path, out: Path) -> int:
    """The CLI: build, say where and how long."""
    start = time.perf_counter()
    site = build_site(root, out)
    seconds = time.perf_counter() - start
    print(f"wrote {len(site)} pages to {out}/ in {seconds:.1f} s (open {out}/index.html)")
    return 0
