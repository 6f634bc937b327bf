"""What the site builder adds to nbconvert's pages: alternative text for every figure, and one
shared copy of the theme nbconvert inlines in each page (`site.build_site` calls both)."""

from __future__ import annotations

import html
import re
from pathlib import Path

NO_ALT = 'alt="No description has been provided for this image"'  # nbconvert's placeholder


def _with_alt_texts(body: str, nb) -> str:
    """nbconvert's lab template writes no alt attribute (it then puts its placeholder on
    every output image): each image output gets its cell's `alt`, in order."""
    alts = iter(
        html.escape(c.metadata["alt"], quote=True)
        for c in nb.cells
        if "alt" in c.metadata
        for o in c.get("outputs", [])
        if _is_image(o)
    )
    return re.sub(re.escape(NO_ALT), lambda m: f'alt="{next(alts, "")}"', body)


STYLE = re.compile(r"<style[^>]*>(.*?)</style>", re.S)


def _shared_styles(body: str, out: Path) -> str:
    """nbconvert inlines its theme in every page (about 260 KB): each large style block goes
    to one file in `_static/`, named by its content's hash, and the page links it where
    the block stood (the order of the rules is kept)."""
    import hashlib

    def link(match: re.Match) -> str:
        css = match.group(1)
        if len(css) < 3000:
            return match.group(0)
        name = f"_static/nbconvert-{hashlib.sha256(css.encode()).hexdigest()[:16]}.css"
        if not (out / name).exists():
            (out / name).write_text(css)
        return f'<link rel="stylesheet" href="{name}">'

    return STYLE.sub(link, body)


PLOT_CALL = re.compile(r"\b(plot_\w+|draw_\w+)\(")


def _is_image(output) -> bool:
    return any(k.startswith("image/") for k in output.get("data", {}))


def _has_figure(cell) -> bool:
    return any(_is_image(o) for o in cell.get("outputs", []))


def _first_sentence(text: str, limit: int = 300) -> str:
    """The first paragraph's first sentence (a docstring's summary), markup dropped."""
    paragraph = text.strip().split("\n\n")[0]
    paragraph = re.sub(r"[#*`$]", "", " ".join(paragraph.split())).strip()
    sentence = re.split(r"(?<=[.?!])\s+(?=[A-Z])", paragraph, maxsplit=1)[0]
    return sentence if len(sentence) <= limit else sentence[: limit - 1].rsplit(" ", 1)[0] + "…"


def alt_text(source: str, nb, intro: str, title: str) -> str:
    """What a figure shows, for readers who cannot see it: the first sentence of the plotting
    function's docstring (found through the notebook's `from minidist... import` lines), else
    of the markdown just before the cell, else the lesson's title."""
    import importlib

    names = PLOT_CALL.findall(source)
    imports = re.findall(
        r"from (minidist[\w.]*) import \(?([^)\n]*(?:\n[^)\n]*)*?)\)?$",
        "\n".join(c.source for c in nb.cells if c.cell_type == "code"),
        re.M,
    )
    for name in names:
        for module, what in imports:
            if re.search(rf"\b{name}\b", what):
                doc = getattr(importlib.import_module(module), name, None).__doc__
                if doc:
                    return "Figure: " + _first_sentence(doc)
    paragraphs = [p.strip() for p in intro.split("\n\n") if p.strip()]
    heading = next((_first_sentence(p) for p in paragraphs[:1] if p.startswith("#")), "")
    body = next((_first_sentence(p) for p in paragraphs if not p.startswith("#")), "")
    words = ": ".join(w for w in (heading, body) if w)
    return f"Figure: {words}" if words else f"Figure: one of {title}"
