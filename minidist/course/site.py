"""Build the course as a static website: `python -m minidist site [--out build/site]`.

Every `notebooks/*.ipynb` becomes one page, rendered from its committed outputs (nothing
is re-executed) by nbconvert's HTML exporter with its JupyterLab template; the README is
the landing page and the lessons, in file order, are the table of contents, so a new
lesson notebook is a new page with no edit here. Each lesson page offers its notebook and
its exercises to download, and shows its packages' source files (the packages whose
`__init__` docstring says "Lesson NN", or whose checkers its exercises import; every file,
subpackages included) as pages of the site (`site_links`). GitHub and Colab links, and
Colab's install cell in the downloads, come only from the `Repository` of pyproject.toml's
`[project.urls]`: no address is invented.

A page has the lessons' menu with an offline search (an index built with the site), its
own table of contents, heading anchors, a copy button on each code cell, figures that open
full size, and the previous and next lessons by title (`site_pages`, `site_static`); it
reads on a phone (code scrolls sideways, the menu collapses).

Offline by construction: nbconvert ships its templates and CSS, figures are files of the
site, and MathJax 2 is copied from the `jupyter-server-mathjax` package into the site
(nbconvert's template would load it, and require.js, from a CDN), and loaded only by pages
with TeX. The pages load nothing from another host.

Every figure gets alternative text (`site_assets.alt_text`): the summary line of the course
plotting function the cell calls, which says what the figure shows, else the first sentence
of the text that introduces it; nbconvert's inlined theme is written once and linked.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import site_links, site_pages
from .site_assets import _has_figure, _shared_styles, _with_alt_texts, alt_text  # noqa: F401
from .site_links import BRANCH, COLAB, package_files, repository_url  # noqa: F401
from .site_output import SiteError, check_checkout, check_output, staging, swap_in
from .site_static import CSS, JS
from .site_template import TEMPLATE

MATHJAX = "_static/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"


@dataclass
class Page:
    """One page of the site: where it comes from and what it links to."""

    source: Path  # the notebook, or README.md for the landing page
    html_name: str
    title: str
    packages: list[str] = field(default_factory=list)
    exercise: Path | None = None


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


def _links(page: Page, root: Path, out: Path, repo: str | None) -> dict:
    """What the template puts above a lesson: downloads (and Colab), the source files."""
    links = {"downloads": site_links.downloads(page, root, out, repo), "packages": []}
    for name in page.packages:
        files = package_files(root, name)
        site_links.write_source_pages(root, out, files, repo)
        prefix = f"minidist/{name}/"
        pairs = [(f.removeprefix(prefix), site_links.source_page(f)) for f in files]
        links["packages"].append({"name": prefix, "files": pairs})
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
    """Write the site into `out` (replaced only when empty or a previous build: see
    `site_output`); returns its pages."""
    import jinja2
    from nbconvert import HTMLExporter

    root = root.resolve()
    check_checkout(root)
    target = check_output(root, out)
    repo = repository_url(root)
    site = pages(root)
    exporter = HTMLExporter(
        template_name="lab",
        template_file="minidist_site.html.j2",
        extra_loaders=[jinja2.DictLoader({"minidist_site.html.j2": TEMPLATE})],
        mathjax_url=MATHJAX,
        exclude_anchor_links=False,
    )
    out = staging(target)
    try:
        _write(root, out, site, repo, exporter)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    swap_in(out, target)
    return site


def _write(root: Path, out: Path, site: list[Page], repo: str | None, exporter) -> None:
    import importlib.util

    lessons = {p.source.resolve(): p.html_name for p in site}
    (out / "_static").mkdir(parents=True)
    (out / "_static" / "site.css").write_text(CSS)
    (out / "_static" / "site.js").write_text(JS)
    # Found, not imported: importing it would import jupyter_server (seconds).
    spec = importlib.util.find_spec("jupyter_server_mathjax")
    if spec is None:
        raise ModuleNotFoundError("the site needs MathJax: pip install jupyter-server-mathjax")
    mathjax = Path(spec.submodule_search_locations[0]) / "static"
    shutil.copytree(mathjax, out / "_static" / "mathjax")
    toc = [(p.html_name, p.title) for p in site[1:]]
    index: list[dict] = []
    for i, page in enumerate(site):
        nb = _notebook_for(page)
        resources = {
            "minidist": {
                "page": page.html_name,
                "toc": toc,
                "prev": (site[i - 1].html_name, site[i - 1].title) if i > 0 else None,
                "next": (site[i + 1].html_name, site[i + 1].title) if i + 1 < len(site) else None,
                "links": _links(page, root, out, repo) if i > 0 else None,
                "tex": site_pages.needs_mathjax(nb),
            }
        }
        body, _ = exporter.from_notebook_node(nb, resources=resources)
        body = _shared_styles(_with_alt_texts(body, nb), out)
        body = site_pages.figures_to_files(body, out, page.html_name.removesuffix(".html"))
        body = site_pages.with_page_toc(body)
        body = site_links.rewrite_links(body, page, lessons, root, repo, out)
        (out / page.html_name).write_text(body)
        index += site_pages.search_entries(body, page.html_name, page.title)
    site_pages.write_search_index(out, index)


def run_site(root: Path, out: Path) -> int:
    """The CLI: build, say where and how long; a refused invocation is one line on stderr
    and exit status 2."""
    start = time.perf_counter()
    try:
        site = build_site(root, out)
    except SiteError as exc:
        print(f"minidist site: error: {exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    print(f"wrote {len(site)} pages to {out}/ in {seconds:.1f} s (open {out}/index.html)")
    if repository_url(root.resolve()) is None:
        print(
            "(pyproject.toml's [project.urls] names no Repository: no GitHub or Colab links)",
            file=sys.stderr,
        )
    return 0
