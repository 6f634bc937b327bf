"""The course site (`make site`), built and opened page by page in headless Chromium.

The site is served on 127.0.0.1 and every page is checked in the browser: no console error
and no request to another host (the site must work offline), every image loaded, the math
typeset by MathJax with no error, every internal link and anchor resolving, the lesson's
title in <title> and <h1>. Links into the repository on GitHub (source files, exercises,
Colab) are checked against the files of this checkout. Screenshots of the landing page and
one lesson (its top and its first figure), and of the first typeset math, go to
build/site-screenshots/.

Needs Chromium (`apt-get install -y chromium`) and Playwright (the dev extra); it drives
the system's Chromium, so Playwright's own browser download is never used.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

from minidist.course import site

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "build" / "site-screenshots"
SHOT_LESSON = "02_zero.html"
INSTALL = "apt-get install -y chromium (and pip install playwright, in the dev extra)"


def _chromium() -> str | None:
    found = os.environ.get("MINIDIST_CHROMIUM") or shutil.which("chromium")
    return found or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser():
    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(f"the browser test needs Playwright and Chromium: {INSTALL}")
    if chromium is None:
        pytest.skip(f"the browser test needs Chromium: {INSTALL}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    pages = site.build_site(ROOT, out)
    handler = functools.partial(Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", out, pages
    server.shutdown()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


# Every math element MathJax 2 found has a rendered frame of non-zero width.
MATH = """() => {
  const scripts = [...document.querySelectorAll('script[type^="math/tex"]')];
  const drawn = scripts.filter(s => {
    const f = document.getElementById(s.id + '-Frame');
    return f && f.getBoundingClientRect().width > 0;
  });
  return {found: scripts.length, drawn: drawn.length,
          errors: document.querySelectorAll('.MathJax_Error, .noError, .merror').length};
}"""
PAGE = """() => ({
  images: [...document.images].map(i => [i.currentSrc.slice(0, 60), i.complete, i.naturalWidth]),
  alts: [...document.images].map(i => i.alt),
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id], a[name]')].map(e => e.id || e.name),
  title: document.title,
  h1: [...document.querySelectorAll('h1')].map(h => h.textContent.replace('¶', '').trim()),
})"""


def test_every_page_in_chromium(browser, served):
    base, out, pages = served
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    seen: dict[str, dict] = {}
    expected = {p.html_name: p for p in pages}
    assert sorted(expected) == sorted(p.name for p in out.glob("*.html"))
    assert len(pages) == 1 + len(list((ROOT / "notebooks").glob("*.ipynb")))
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    for name, page in expected.items():
        tab = context.new_page()
        problems: list[str] = []
        tab.on("console", lambda m, p=problems: m.type == "error" and p.append(m.text))
        tab.on("pageerror", lambda e, p=problems: p.append(str(e)))
        tab.on(
            "response", lambda r, p=problems: r.status >= 400 and p.append(f"{r.status} {r.url}")
        )
        tab.route(re.compile(r"^(?!http://127\.0\.0\.1:)"), lambda r, p=problems: _block(r, p))
        tab.goto(base + name, wait_until="load")
        tab.wait_for_selector("html[data-mathjax=done]", timeout=60_000)
        info, math = tab.evaluate(PAGE), tab.evaluate(MATH)
        assert problems == [], f"{name}: console errors or outside requests: {problems}"
        assert all(done and w > 0 for _, done, w in info["images"]), (name, info["images"])
        assert len(info["images"]) >= _figures(page.source), f"{name}: figures missing"
        assert all(a.startswith("Figure: ") for a in info["alts"]), (name, info["alts"])
        _check_math(name, page, math)
        assert page.title in info["title"] and page.title in info["h1"], (name, info)
        seen[name] = info
        if name in ("index.html", SHOT_LESSON):
            tab.screenshot(path=str(SHOTS / name.replace(".html", ".png")))
        if name == SHOT_LESSON:  # further down: its first figure
            tab.locator("img").first.scroll_into_view_if_needed()
            tab.screenshot(path=str(SHOTS / name.replace(".html", "_figure.png")))
        if math["found"] and not any(SHOTS.glob("math_*.png")):  # the first typeset math
            tab.locator(".MathJax_Display, span.MathJax").first.scroll_into_view_if_needed()
            tab.screenshot(path=str(SHOTS / f"math_{name.replace('.html', '.png')}"))
        tab.close()
    context.close()
    _check_links(base, out, seen)


def _figures(source: Path) -> int:
    """How many image outputs the notebook holds (README: none)."""
    if source.suffix != ".ipynb":
        return 0
    cells = json.loads(source.read_text())["cells"]
    outputs = [o for c in cells for o in c.get("outputs", [])]
    return sum(any(k.startswith("image/") for k in o.get("data", {})) for o in outputs)


def _bad_status(response, problems: list[str]) -> None:
    if response.status >= 400:
        problems.append(f"{response.status} {response.url}")


def _block(route, problems: list[str]) -> None:
    problems.append(f"request to another host: {route.request.url}")
    route.abort()


def _check_math(name: str, page, math: dict) -> None:
    assert math["errors"] == 0, f"{name}: MathJax errors: {math}"
    assert math["drawn"] == math["found"], f"{name}: math not typeset: {math}"
    if page.source.suffix == ".ipynb" and re.search(r"\$[^$\n]+\$", page.source.read_text()):
        assert math["found"] > 0, f"{name}: its notebook has $math$ but none was typeset"


def _check_links(base: str, out: Path, seen: dict[str, dict]) -> None:
    repo = site.repository_url(ROOT)
    prefixes = [f"{repo}/blob/{site.BRANCH}/", f"{repo}/tree/{site.BRANCH}/"]
    colab = site.COLAB.format(slug=repo.removeprefix("https://github.com/"), branch="", path="")
    colab = colab.replace("/blob//", f"/blob/{site.BRANCH}/")
    checked = 0
    for name, info in seen.items():
        for href in info["links"]:
            url, anchor = urldefrag(href)
            if url.startswith(base):
                target = unquote(urlsplit(url).path).lstrip("/") or "index.html"
                assert (out / target).is_file(), f"{name}: link to a missing page {href}"
                if anchor and target.endswith(".html"):
                    # as the browser looks it up: the fragment as written, then decoded
                    ids = seen[target]["ids"]
                    assert anchor in ids or unquote(anchor) in ids, f"{name}: no anchor {href}"
                checked += 1
            for prefix in [*prefixes, colab]:
                if url.startswith(prefix):
                    path = unquote(url.removeprefix(prefix))
                    assert (ROOT / path).exists(), f"{name}: link to a missing file {href}"
                    checked += 1
    lessons = len(seen) - 1
    assert checked > 10 * lessons  # table of contents, Colab, exercise and source links


def test_pages_follow_the_notebooks_folder(tmp_path):
    """A new lesson is a new page, title, TOC entry and links included, with no edit here."""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[project.urls]\nRepository = "https://github.com/o/r"\n'
    )
    (tmp_path / "README.md").write_text("# x\n\nStart with [lesson 14](notebooks/14_new.ipynb).\n")
    pkg = tmp_path / "minidist" / "newthing"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Lesson 14, something new."""\n')
    (pkg / "core.py").write_text("")
    cell = {"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# 14 · New: $a^2$"]}
    nb = json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    for folder in ("notebooks", "exercises"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "14_new.ipynb").write_text(nb)
    pages = site.build_site(tmp_path, tmp_path / "out")
    assert [(p.html_name, p.title, p.packages) for p in pages] == [
        ("index.html", "minidist", []),
        ("14_new.html", "14 · New: $a^2$", ["newthing"]),
    ]
    index = (tmp_path / "out" / "index.html").read_text()
    assert 'href="14_new.html"' in index  # README's link and the table of contents
    lesson = (tmp_path / "out" / "14_new.html").read_text()
    for link in (
        "https://colab.research.google.com/github/o/r/blob/main/notebooks/14_new.ipynb",
        "https://github.com/o/r/blob/main/minidist/newthing/core.py",
        "_downloads/exercises/14_new.ipynb",
    ):
        assert f'href="{link}"' in lesson, link
    assert (tmp_path / "out" / "_downloads" / "exercises" / "14_new.ipynb").is_file()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(ValueError, match=r"needs \[project.urls\] Repository"):
        site.build_site(tmp_path, tmp_path / "out")


def test_lesson_packages_of_the_course():
    nb = ROOT / "notebooks"
    assert site.lesson_packages(ROOT, nb / "12_parameter_servers_and_topology.ipynb") == [
        "network",
        "parameter_server",
    ]
    assert site.lesson_packages(ROOT, nb / "08_parallel_layout.ipynb") == ["megatron"]


def test_pages_share_one_copy_of_nbconvert_css(tmp_path):
    """The theme nbconvert inlines in every page is written once and linked."""
    import re

    out = tmp_path / "site"
    site.build_site(ROOT, out)
    sheets = sorted(out.glob("_static/nbconvert-*.css"))
    assert sheets and all(s.stat().st_size > 3000 for s in sheets)
    for page in out.glob("*.html"):
        text = page.read_text()
        assert all(len(css) < 3000 for css in re.findall(r"<style[^>]*>(.*?)</style>", text, re.S))
        linked = re.findall(
            r'<link rel="stylesheet" href="(_static/nbconvert-[0-9a-f]+\.css)">', text
        )
        assert sorted(out / name for name in linked) == sheets, page.name


def test_every_figure_says_what_it_shows():
    """Alternative text for every figure of every lesson: the plotting function's summary,
    or the sentence that introduces the figure; never nbconvert's placeholder."""
    from minidist.expert_parallel.plots import plot_padding

    for page in site.pages(ROOT)[1:]:
        nb = site._notebook_for(page)
        figures = [c for c in nb.cells if site._has_figure(c)]
        assert len(figures) == sum(1 for c in nb.cells if "alt" in c.metadata) > 0, page.title
        for cell in figures:
            alt = cell.metadata["alt"]
            assert alt.startswith("Figure: ") and len(alt) > 20, (page.title, alt)
    import nbformat

    code = "from minidist.expert_parallel.plots import plot_padding\nfig = plot_padding(1)"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    summary = plot_padding.__doc__.split(":")[0]
    assert site.alt_text(code, nb, "", "16").startswith("Figure: " + summary)
    intro = "## The loss\n\nThe loss per `step`. More text."
    assert site.alt_text("fig = f()", nb, intro, "t") == "Figure: The loss: The loss per step."
    assert site.alt_text("fig = f()", nb, "", "t") == "Figure: one of t"
