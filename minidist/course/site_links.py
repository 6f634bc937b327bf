"""The site's links to files (`site.build_site`): the lesson's packages as local source pages
(every file, at any depth), the notebooks to download (with Colab's install cell when the
repository is known), the README's and notebooks' relative links rewritten, and GitHub and
Colab links only when pyproject.toml names the repository."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path
from urllib.parse import quote

BRANCH = "main"
HREF = re.compile(r'(<a\s[^>]*?href=")([^"]*)(")')
COLAB = "https://colab.research.google.com/github/{slug}/blob/{branch}/{path}"
INSTALL_CELL = (
    "# On Colab, install minidist first (elsewhere this cell does nothing).\n"
    "import sys\n\n"
    'if "google.colab" in sys.modules:\n'
    '    %pip install --quiet "minidist @ git+{repo}"'
)
SOURCE_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{name} · minidist</title><link rel="icon" href="data:,">
<link rel="stylesheet" href="{up}_static/source.css"></head>
<body><p><a href="{up}index.html">minidist</a> · <code>{name}</code>{github}</p>
{code}</body></html>
"""


def source_page(name: str) -> str:
    """Where the site keeps the highlighted copy of a repository file."""
    return f"_source/{quote(name)}.html"


def write_source_pages(root: Path, out: Path, files: list[str], repo: str | None) -> None:
    """Each file highlighted (pygments, line numbers as anchors #line-N) on a page of its own."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_for_filename
    from pygments.util import ClassNotFound

    formatter = HtmlFormatter(linenos="inline", anchorlinenos=True, lineanchors="line")
    for name in files:
        text = (root / name).read_text(encoding="utf-8")
        try:
            lexer = get_lexer_for_filename(name)
        except ClassNotFound:
            lexer = get_lexer_for_filename("x.txt")
        page = out / "_source" / f"{name}.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        up = "../" * name.count("/") + "../"
        github = f' · <a href="{repo}/blob/{BRANCH}/{quote(name)}">on GitHub</a>' if repo else ""
        code = highlight(text, lexer, formatter)
        page.write_text(SOURCE_PAGE.format(name=html.escape(name), up=up, github=github, code=code))
    css = formatter.get_style_defs(".highlight")
    css += "\nbody{font:0.95rem/1.5 system-ui,sans-serif;margin:1rem}.highlight{overflow-x:auto}"
    (out / "_static" / "source.css").write_text(css)


def package_files(root: Path, name: str) -> list[str]:
    """Every .py file of minidist/<name>/, subpackages included, relative to the root."""
    pkg = root / "minidist" / name
    return sorted(p.relative_to(root).as_posix() for p in pkg.rglob("*.py"))


def downloads(page, root: Path, out: Path, repo: str | None) -> dict:
    """The lesson's notebook and its exercises to download (each with Colab's install cell
    first when the repository is known), and the links the template shows above it."""
    import nbformat

    found = {}
    for kind, source in (("notebook", page.source), ("exercise", page.exercise)):
        if source is None:
            continue
        target = out / "_downloads" / f"{kind}s" / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if repo:
            nb = nbformat.read(source, as_version=4)
            cell = nbformat.v4.new_code_cell(INSTALL_CELL.format(repo=repo))
            cell.id = "minidist-install"
            nb.cells.insert(0, cell)
            nbformat.write(nb, target)
        else:
            shutil.copy(source, target)
        rel = source.relative_to(root).as_posix()
        found[kind] = {"name": source.name, "download": target.relative_to(out).as_posix()}
        if repo:
            slug = repo.removeprefix("https://github.com/")
            found[kind]["colab"] = COLAB.format(slug=slug, branch=BRANCH, path=rel)
            found[kind]["github"] = f"{repo}/blob/{BRANCH}/{rel}"
    return found


def rewrite_links(
    body: str, page, lessons: dict[Path, str], root: Path, repo: str | None, out: Path
) -> str:
    """Relative links of the README and notebooks: lessons to their pages, files to their
    source pages (or GitHub, for files the site does not render, when the repository is
    known; else a copy in `_files/`)."""

    def fix(match: re.Match) -> str:
        href = html.unescape(match.group(2))
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^//", href, re.I) or not href:
            return match.group(0)
        path, _, anchor = href.partition("#")
        if path in lessons.values() or path.startswith(("_downloads/", "_source/", "_images/")):
            return match.group(0)  # the template's own links
        target = (page.source.parent / path).resolve()
        if not target.is_relative_to(root) or not target.exists():
            return match.group(0)
        rel = target.relative_to(root).as_posix()
        if target in lessons:
            new = lessons[target]
        elif target.is_file() and target.suffix == ".py":
            new = source_page(rel)
            if not (out / "_source" / f"{rel}.html").exists():
                write_source_pages(root, out, [rel], repo)
        elif repo:
            new = f"{repo}/{'tree' if target.is_dir() else 'blob'}/{BRANCH}/{quote(rel)}"
        elif target.is_file():
            new = f"_files/{quote(rel)}"
            (out / "_files" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(target, out / "_files" / rel)
        else:
            return match.group(0)
        new += f"#{anchor}" if anchor else ""
        return match.group(1) + html.escape(new) + match.group(3)

    return HREF.sub(fix, body)


def repository_url(root: Path) -> str | None:
    """`Repository` of pyproject.toml's [project.urls], or None when it names none (the site
    then has no GitHub or Colab links); a Repository that is not a GitHub URL is refused."""
    from .site_output import SiteError

    text = (root / "pyproject.toml").read_text()
    section = re.search(r"^\[project\.urls\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    url = section and re.search(r'^Repository\s*=\s*"([^"]*)"', section.group(1), re.M)
    if not url:
        return None
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/?", url.group(1)):
        raise SiteError(
            f"pyproject.toml's [project.urls] Repository = {json.dumps(url.group(1))}: must be "
            '"https://github.com/OWNER/NAME" (the site builds its GitHub and Colab links from it)'
        )
    return url.group(1).rstrip("/")
