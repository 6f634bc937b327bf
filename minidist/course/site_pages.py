"""What the site builder does to each page nbconvert wrote (`site.build_site`): figures moved
to files and linked full size, the page's table of contents, its entries in the search
index, and whether it needs MathJax."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

TOC_SLOT = "<!--minidist-page-toc-->"
IMG = re.compile(r'<img ([^>]*?)src="data:image/(png|jpeg|gif);base64,([^"]+)"([^>]*)>')
HEADING = re.compile(r'<h([1-3]) id="([^"]+)">(.*?)<a class="anchor-link"[^>]*>¶</a></h\1>', re.S)
TAG = re.compile(r"<[^>]+>")
# TeX in a markdown cell: $...$, $$, \(, \[ or an environment.
TEX = re.compile(r"\$[^$\n]+\$|\$\$|\\\(|\\\[|\\begin\{")


def needs_mathjax(nb) -> bool:
    """Whether any markdown cell holds TeX (the other pages load no MathJax)."""
    return any(c.cell_type == "markdown" and TEX.search(c.source) for c in nb.cells)


def figures_to_files(body: str, out: Path, stem: str) -> str:
    """Each embedded figure written to `_images/` and shown as a link to itself, full size
    (a data URI cannot be opened as a page)."""
    count = 0

    def move(match: re.Match) -> str:
        nonlocal count
        count += 1
        ext = {"jpeg": "jpg"}.get(match.group(2), match.group(2))
        name = f"_images/{stem}-{count}.{ext}"
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(base64.b64decode(match.group(3)))
        img = f'<img {match.group(1)}src="{name}"{match.group(4)}>'
        return f'<a class="md-figure" href="{name}" title="open the figure full size">{img}</a>'

    return IMG.sub(move, body)


def _text(fragment: str) -> str:
    return " ".join(html.unescape(TAG.sub(" ", fragment)).split())


def headings(body: str) -> list[tuple[int, str, str]]:
    """[(level, id, text)] of the page's h1-h3 headings, in order."""
    return [(int(m.group(1)), m.group(2), _text(m.group(3))) for m in HEADING.finditer(body)]


def with_page_toc(body: str) -> str:
    """The page's own table of contents (its h2 and h3) where the template left the slot."""
    items = [(level, hid, text) for level, hid, text in headings(body) if level > 1]
    if len(items) < 2:
        return body.replace(TOC_SLOT, "")
    lines = ['<details class="md-pagetoc" open><summary>On this page</summary><ul>']
    for level, hid, text in items:
        lines.append(f'<li class="md-toc-h{level}"><a href="#{hid}">{html.escape(text)}</a></li>')
    lines.append("</ul></details>")
    return body.replace(TOC_SLOT, "\n".join(lines))


def search_entries(body: str, page: str, title: str) -> list[dict]:
    """One entry per section, its whole text (from a heading to the next, prose, code and
    printed output): what the search reads."""
    main = body.split('<main class="md-main">', 1)[-1].split('<nav class="md-pager"', 1)[0]
    marks = list(HEADING.finditer(main))
    entries = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(main)
        text = _text(main[m.end() : end])
        heading = _text(m.group(3))
        href = page if m.group(1) == "1" else f"{page}#{m.group(2)}"
        entries.append({"page": title, "title": heading, "href": href, "text": text})
    return entries


def write_search_index(out: Path, entries: list[dict]) -> None:
    """A script, not JSON to fetch: pages opened from the disk (file://) cannot fetch."""
    data = json.dumps(entries, ensure_ascii=False, separators=(",", ":"))
    (out / "_static" / "search-index.js").write_text(f"window.MINIDIST_SEARCH = {data};\n")
