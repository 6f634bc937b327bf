"""The course site (`make site`), built and opened page by page in headless Chromium.

The site is served on 127.0.0.1 and every page is checked in the browser at 1280 px: no
console error and no request to another host (the site must work offline), every image
loaded, the math typeset by MathJax with no error (and MathJax not even loaded on pages
without TeX), every internal link and anchor resolving (source pages, downloads, figures),
the lesson's title in <title> and <h1>. Links into the repository on GitHub (when
pyproject.toml names it) are checked against the files of this checkout. At 390 px (a
phone) a few pages are checked for what a learner does there: the menu collapsed and
opened, code and printed output scrolling sideways, figures opening full size, the page's
table of contents, the search, the copy button, the pager. Screenshots at both widths go to
build/site-screenshots/.

Needs Chromium (`apt-get install -y chromium`) and Playwright (the dev extra); it drives
the system's Chromium, so Playwright's own browser download is never used.
"""

from __future__ import annotations

import functools
import hashlib
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
        requested: list[str] = []
        tab.on("request", lambda r, q=requested: q.append(r.url))
        tab.goto(base + name, wait_until="load")
        tab.wait_for_selector("html[data-mathjax=done], html[data-mathjax=none]", timeout=60_000)
        info, math = tab.evaluate(PAGE), tab.evaluate(MATH)
        assert problems == [], f"{name}: console errors or outside requests: {problems}"
        tex = tab.evaluate("document.documentElement.dataset.mathjax") == "done"
        assert tex == any("MathJax.js" in u for u in requested), name  # only pages with TeX
        assert all(done and w > 0 for _, done, w in info["images"]), (name, info["images"])
        assert len(info["images"]) >= _figures(page.source), f"{name}: figures missing"
        assert all(a.startswith("Figure: ") for a in info["alts"]), (name, info["alts"])
        _check_math(name, page, math)
        assert page.title in info["title"] and page.title in info["h1"], (name, info)
        seen[name] = info
        if name in ("index.html", SHOT_LESSON):
            tab.screenshot(path=str(SHOTS / name.replace(".html", "_1280.png")))
        if name == SHOT_LESSON:  # further down: its first figure
            tab.locator("img").first.scroll_into_view_if_needed()
            tab.screenshot(path=str(SHOTS / name.replace(".html", "_figure_1280.png")))
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
    prefixes = []
    if repo:
        prefixes = [f"{repo}/blob/{site.BRANCH}/", f"{repo}/tree/{site.BRANCH}/"]
        colab = site.COLAB.format(slug=repo.removeprefix("https://github.com/"), branch="", path="")
        prefixes.append(colab.replace("/blob//", f"/blob/{site.BRANCH}/"))
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
            for prefix in prefixes:
                if url.startswith(prefix):
                    path = unquote(url.removeprefix(prefix))
                    assert (ROOT / path).exists(), f"{name}: link to a missing file {href}"
                    checked += 1
    lessons = len(seen) - 1
    assert checked > 10 * lessons  # menu, page contents, downloads and source links


def test_pages_follow_the_notebooks_folder(tmp_path):
    """A new lesson is a new page, title, menu entry and links included, with no edit here;
    every file of its package is listed, at any depth; GitHub and Colab links, and Colab's
    install cell in the downloads, only when pyproject.toml names the repository."""
    toml = '[project]\nname = "x"\n\n[project.urls]\nRepository = "https://github.com/o/r"\n'
    (tmp_path / "pyproject.toml").write_text(toml)
    (tmp_path / "README.md").write_text("# x\n\nStart with [lesson 14](notebooks/14_new.ipynb).\n")
    pkg = tmp_path / "minidist" / "newthing"
    (pkg / "check").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Lesson 14, something new."""\n')
    (pkg / "core.py").write_text("")
    (pkg / "check" / "ex1.py").write_text("def check_x(): ...\n")
    cell = {"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# 14 · New: $a^2$"]}
    nb = json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    for folder in ("notebooks", "exercises"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "14_new.ipynb").write_text(nb)
    out = tmp_path / "out"
    pages = site.build_site(tmp_path, out)
    assert [(p.html_name, p.title, p.packages) for p in pages] == [
        ("index.html", "minidist", []),
        ("14_new.html", "14 · New: $a^2$", ["newthing"]),
    ]
    index = (out / "index.html").read_text()
    assert 'href="14_new.html"' in index  # README's link and the menu
    lesson = (out / "14_new.html").read_text()
    sources = ["minidist/newthing/__init__.py", "minidist/newthing/check/ex1.py"]
    sources.append("minidist/newthing/core.py")
    for link in (
        "https://colab.research.google.com/github/o/r/blob/main/notebooks/14_new.ipynb",
        "https://colab.research.google.com/github/o/r/blob/main/exercises/14_new.ipynb",
        "_downloads/exercises/14_new.ipynb",
        "_downloads/notebooks/14_new.ipynb",
        *(f"_source/{f}.html" for f in sources),
    ):
        assert f'href="{link}"' in lesson, link
    assert "(3 files)" in lesson
    for f in sources:
        page = (out / "_source" / f"{f}.html").read_text()
        assert f'href="https://github.com/o/r/blob/main/{f}"' in page
    for kind in ("notebooks", "exercises"):
        got = json.loads((out / "_downloads" / kind / "14_new.ipynb").read_text())["cells"]
        assert 'pip install --quiet "minidist @ git+https://github.com/o/r"' in "".join(
            got[0]["source"]
        )
        assert got[1]["source"] == cell["source"]
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    site.build_site(tmp_path, out)
    lesson = (out / "14_new.html").read_text()
    assert "github.com" not in lesson and "colab" not in lesson.lower()
    assert (out / "_downloads/notebooks/14_new.ipynb").read_text() == nb  # as it is
    assert 'href="_source/minidist/newthing/check/ex1.py.html"' in lesson
    (tmp_path / "pyproject.toml").write_text(toml.replace("https://github.com/o/r", "o/r"))
    with pytest.raises(ValueError, match=r'Repository = "o/r": must be "https://github.com/'):
        site.build_site(tmp_path, out)


def test_lesson_packages_of_the_course():
    nb = ROOT / "notebooks"
    assert site.lesson_packages(ROOT, nb / "12_parameter_servers_and_topology.ipynb") == [
        "network",
        "parameter_server",
    ]
    assert site.lesson_packages(ROOT, nb / "08_parallel_layout.ipynb") == ["megatron"]


def test_pages_share_one_copy_of_nbconvert_css(served):
    """The theme nbconvert inlines in every page is written once and linked."""
    out = served[1]
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


def _one_notebook_course(root) -> None:
    """A checkout the site builds from: a pyproject, a README and one notebook."""
    (root / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (root / "README.md").write_text("# x\n")
    (root / "notebooks").mkdir()
    cell = {"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# 00 · A"]}
    nb = json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    (root / "notebooks" / "00_a.ipynb").write_text(nb)


def test_output_folder_is_never_a_source(tmp_path, capsys, monkeypatch):
    """`site --out` refuses a folder that holds or lies inside a source, the checkout, a
    folder no build wrote, a file or an unwritable place (one line, status 2), before
    anything is read or removed; a rebuild removes only the files the previous build wrote
    (a .git or CNAME added since stays); a failed build leaves the previous one."""
    from minidist.__main__ import main
    from minidist.course import site_output

    _one_notebook_course(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    (tmp_path / "afile").write_text("")
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    refused = {
        "notebooks": "is the site's source notebooks",
        "notebooks/x": "lies inside the site's source notebooks",
        ".": "would hold the checkout",
        str(tmp_path.parent): "would hold the checkout",
        "README.md": "is the site's source README.md",
        "mine": "holds files that no site build wrote",
        "afile": "exists and is not a folder",
        "afile/x": "cannot be written",
    }
    for out, said in refused.items():
        assert main(["site", "--out", out]) == 2, out
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], (out, err)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing touched
    (tmp_path / "notebooks" / "01_b.ipynb").write_text(
        (tmp_path / "notebooks" / "00_a.ipynb").read_text().replace("00 · A", "01 · B")
    )
    assert main(["site", "--out", "empty"]) == 0  # an empty folder is a new one
    assert (tmp_path / "empty" / "00_a.html").is_file()
    assert main(["site", "--out", "build/site"]) == 0
    built = tmp_path / "build/site"
    assert (built / "01_b.html").is_file()
    assert (built / "_static" / "site.css").is_file()
    # A GitHub Pages folder: the user adds a repository and a CNAME, a lesson goes away.
    (built / ".git").mkdir()
    (built / ".git" / "HEAD").write_text("ref: refs/heads/gh-pages\n")
    (built / "CNAME").write_text("course.example.org\n")
    (built / "_static" / "extra.css").write_text("/* mine */")
    (tmp_path / "notebooks" / "01_b.ipynb").unlink()
    assert main(["site", "--out", "build/site"]) == 0  # only the previous build's files go
    assert (built / ".git" / "HEAD").read_text() == "ref: refs/heads/gh-pages\n"
    assert (built / "CNAME").read_text() == "course.example.org\n"
    assert (built / "_static" / "extra.css").read_text() == "/* mine */"
    assert not (built / "01_b.html").exists() and (built / "00_a.html").is_file()
    assert "01_b.html" not in site_output.read_manifest(built)
    # A file no build wrote where the new build writes one: refused, nothing touched.
    (built / "index.html").unlink()
    (built / "index.html").write_text("my own page")
    manifest = (built / site_output.MARKER).read_text()
    unlisted = re.sub(r"\n[0-9a-f]{64} index\.html\n", "\n", manifest)
    (built / site_output.MARKER).write_text(unlisted)
    assert main(["site", "--out", "build/site"]) == 2
    assert "index.html was not written by a site build" in capsys.readouterr().err
    assert (built / "index.html").read_text() == "my own page"
    assert [p.name for p in (tmp_path / "build").iterdir()] == ["site"]  # no staging left
    (built / "index.html").unlink()
    # A forged manifest line that climbs out of the folder removes nothing outside it.
    thesis = hashlib.sha256(b"years of work").hexdigest()
    (built / site_output.MARKER).write_text(manifest + f"{thesis} ../../mine/thesis.tex\n")
    assert main(["site", "--out", "build/site"]) == 0
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "years of work"
    (tmp_path / "notebooks" / "01_b.ipynb").write_text("{not json")
    with pytest.raises(json.JSONDecodeError):
        main(["site", "--out", "build/site"])
    assert (tmp_path / "build/site" / "00_a.html").is_file()  # the old build is still there
    assert [p.name for p in (tmp_path / "build").iterdir()] == ["site"]  # no staging left
    monkeypatch.chdir(tmp_path / "mine")
    assert main(["site", "--out", "x"]) == 2
    assert "runs in a minidist checkout" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert main(["site", "--out", str(locked / "site")]) == 2


def test_a_marker_the_user_wrote_or_a_page_they_edited_is_not_the_build_s(tmp_path, monkeypatch):
    """A `.minidist-site` the user wrote (or copied with a folder) listing their own files,
    or one that is a link to such a list, claims nothing: those files stay; a built page the
    user edited since is theirs: the rebuild refuses to replace it (status 2, one line)."""
    from minidist.__main__ import main
    from minidist.course import site_output

    _one_notebook_course(tmp_path)
    monkeypatch.chdir(tmp_path)
    forged = tmp_path / "forged"
    (forged / "sub").mkdir(parents=True)
    (forged / "thesis.tex").write_text("years of work")
    (forged / "sub" / "data.csv").write_text("1,2")
    listing = site_output.MARKER_TEXT + "thesis.tex\nsub/data.csv\n"
    digest = hashlib.sha256(b"elsewhere").hexdigest()
    listing += f"{digest} thesis.tex\n{digest} sub/data.csv\n"  # the new form, wrong sums
    (forged / site_output.MARKER).write_text(listing)
    assert main(["site", "--out", "forged"]) == 0
    assert (forged / "thesis.tex").read_text() == "years of work"
    assert (forged / "sub" / "data.csv").read_text() == "1,2"
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "keep.txt").write_text("mine")
    (tmp_path / "list").write_text(listing + "keep.txt\n")
    (linked / site_output.MARKER).symlink_to(tmp_path / "list")
    assert main(["site", "--out", "linked"]) == 2  # a link is no marker: not ours
    assert (linked / "keep.txt").read_text() == "mine"
    assert main(["site", "--out", "built"]) == 0
    (tmp_path / "built" / "index.html").write_text("my edits")
    assert main(["site", "--out", "built"]) == 2
    assert (tmp_path / "built" / "index.html").read_text() == "my edits"
    assert main(["site", "--out", "forged"]) == 0  # a rebuild of its own files still works


PHONE_LESSON = "13_planner.html"
# Every code cell and printed output that is wider than its box scrolls (never cut off).
LAYOUT = """() => {
  const style = e => getComputedStyle(e);
  const editors = [...document.querySelectorAll('.jp-InputArea-editor, .jp-InputArea-editor pre')];
  const outputs = [...document.querySelectorAll(
    '.jp-OutputArea-output pre, .jp-RenderedHTMLCommon pre')];
  const wide = [...editors, ...outputs].filter(e => e.scrollWidth > e.clientWidth + 1);
  const clipping = [...document.querySelectorAll('.jp-InputArea, .jp-Cell-inputWrapper')]
    .filter(e => style(e).overflowX === 'hidden');
  return {
    editors: editors.length, wide: wide.length,
    stuck: wide.filter(e => !['auto', 'scroll'].includes(style(e).overflowX)).length,
    clipping: clipping.length,
    wrapped: outputs.filter(e => style(e).whiteSpace !== 'pre').length,
    page: document.documentElement.scrollWidth, view: innerWidth,
    h1: document.querySelector('h1').getBoundingClientRect().top,
    menu: document.querySelector('nav.md-toc').getBoundingClientRect().height,
    anchors: [...document.querySelectorAll('h2 .anchor-link')]
      .filter(a => style(a).visibility !== 'visible' || +style(a).opacity === 0).length,
    toc: [...document.querySelectorAll('.md-pagetoc a')].map(a => a.getAttribute('href')),
    h2: [...document.querySelectorAll('h2[id]')].map(h => '#' + h.id),
    figures: [...document.querySelectorAll('a.md-figure')].map(a => [a.getAttribute('href'),
      a.querySelector('img').getAttribute('src'), a.querySelector('img').naturalWidth,
      a.querySelector('img').getBoundingClientRect().width]),
    pager: [...document.querySelectorAll('.md-pager a')].map(a => a.textContent.trim()),
  };
}"""


def test_on_a_phone_and_finding_things(browser, served):
    """At 390 px: the menu is collapsed until asked for, the lesson starts on the first
    screen, code and output scroll sideways, figures open full size; at both widths: the
    page's contents, visible anchors, the pager by title, copy buttons and the search."""
    base, out, pages = served
    SHOTS.mkdir(parents=True, exist_ok=True)
    titles = {p.html_name: p.title for p in pages}
    names = list(titles)
    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    tab = phone.new_page()
    tab.goto(base + PHONE_LESSON, wait_until="load")
    tab.wait_for_selector("html[data-mathjax]")
    got = tab.evaluate(LAYOUT)
    assert got["page"] <= got["view"], got  # nothing wider than the screen: it scrolls inside
    assert got["menu"] == 0 and got["h1"] < 420, got  # was 794 px down, under the menu
    assert got["editors"] > 10 and got["wide"] > 0 and got["stuck"] == 0, got
    assert got["clipping"] == 0 and got["wrapped"] == 0 and got["anchors"] == 0, got
    assert got["toc"] == got["h2"] or set(got["h2"]) <= set(got["toc"]), got
    i = names.index(PHONE_LESSON)
    assert got["pager"] == [f"← {titles[names[i - 1]]}", f"{titles[names[i + 1]]} →"]
    assert got["figures"] and all(href == src for href, src, _, _ in got["figures"])
    assert any(natural > shown for _, _, natural, shown in got["figures"])  # worth opening
    tab.screenshot(path=str(SHOTS / "13_planner_390.png"))
    tab.locator(".jp-InputArea-editor").nth(3).scroll_into_view_if_needed()
    tab.screenshot(path=str(SHOTS / "13_planner_code_390.png"))
    tab.click(".md-bar button")
    assert tab.locator("nav.md-toc").bounding_box()["height"] > 300
    tab.screenshot(path=str(SHOTS / "13_planner_menu_390.png"))
    tab.click(".md-bar button")
    href = got["figures"][0][0]
    tab.click(f'a.md-figure[href="{href}"]')  # shown shrunk: opens at its own size, here
    big = tab.locator(".md-lightbox img")
    assert big.get_attribute("src") == href and big.bounding_box()["width"] >= got["figures"][0][2]
    tab.keyboard.press("Escape")
    assert tab.locator(".md-lightbox").count() == 0
    tab.goto(base + href, wait_until="load")  # and the figure is a file of its own
    full = tab.evaluate("() => [document.images[0].naturalWidth, innerWidth]")
    assert full[0] > 0, full
    tab.goto(base + "index.html", wait_until="load")
    got = tab.evaluate(LAYOUT)  # the README's code blocks scroll too
    assert got["page"] <= got["view"] and got["wrapped"] == got["stuck"] == 0, got
    tab.screenshot(path=str(SHOTS / "index_390.png"))
    phone.close()

    wide = browser.new_context(viewport={"width": 1280, "height": 900})
    wide.grant_permissions(["clipboard-read", "clipboard-write"])
    tab = wide.new_page()
    tab.goto(base + PHONE_LESSON, wait_until="load")
    first = tab.locator(".jp-InputArea-editor").first
    first.hover()
    first.locator("button.md-copy").click()
    copied = tab.evaluate("navigator.clipboard.readText()")
    assert copied == first.locator("pre").inner_text().rstrip("\n") and len(copied) > 20
    tab.fill("#md-search", "zero bubble")
    tab.wait_for_selector("#md-results li a")
    found = tab.eval_on_selector_all("#md-results li a", "as => as.map(a => a.href)")
    assert any("09_pipeline.html#" in h for h in found), found
    tab.screenshot(path=str(SHOTS / "search_1280.png"))
    tab.goto(found[0], wait_until="load")
    target = tab.evaluate("document.getElementById(decodeURIComponent(location.hash.slice(1)))")
    assert found[0].startswith(base) and target is not None, found[0]
    tab.emulate_media(color_scheme="dark")  # dark mode follows the system's setting
    tab.goto(base + SHOT_LESSON, wait_until="load")
    assert "invert" in tab.evaluate("getComputedStyle(document.documentElement).filter")
    tab.locator("img").first.scroll_into_view_if_needed()
    tab.screenshot(path=str(SHOTS / "02_zero_dark_1280.png"))
    wide.close()


# At 390 px, on one page: what scrolls sideways and says so, code the Copy button covers, the
# boxes above the lesson against its text, the figures after one tap, the tables.
PHONE = """async (tap) => {
  const box = e => e.getBoundingClientRect();
  const shown = e => e && box(e).width > 0 && getComputedStyle(e).visibility === 'visible';
  const scrollers = [...document.querySelectorAll(
    '.jp-OutputArea-output pre, .jp-RenderedHTMLCommon pre, .jp-RenderedHTMLCommon table')];
  const hidden = scrollers.filter(e => e.scrollWidth > e.clientWidth + 1 && !(
    e.classList.contains('md-wide') && getComputedStyle(e).boxShadow !== 'none'
    && e.nextElementSibling && e.nextElementSibling.classList.contains('md-scroll-cue')
    && shown(e.nextElementSibling)));
  const covered = [...document.querySelectorAll('.jp-InputArea-editor')].filter(ed => {
    const b = ed.querySelector('button.md-copy'), pre = ed.querySelector('pre');
    if (!b || !pre) return false;
    const x = box(b), y = box(pre);
    return x.left < y.right && y.left < x.right && x.top < y.bottom && y.top < x.bottom;
  });
  const h1 = box(document.querySelector('h1'));
  const boxes = [...document.querySelectorAll('.md-links, .md-pagetoc')].map(e => box(e))
    .filter(b => Math.abs(b.left - h1.left) > 1.5 || Math.abs(b.right - h1.right) > 1.5)
    .map(b => [b.left, b.right, h1.left, h1.right]);
  const figures = [];
  for (const a of tap ? document.querySelectorAll('a.md-figure') : []) {
    const img = a.querySelector('img');
    await img.decode();
    if (box(img).width < img.naturalWidth - 1) a.click();  // one tap (else: readable as is)
    const big = document.querySelector('.md-lightbox img');
    if (big) await big.decode();
    // the figure as drawn: one CSS pixel per pixel of the PNG (matplotlib's text is
    // 8 pt or more at 100 dpi, so 11 px or more)
    const width = big ? box(big).width : box(img).width;
    figures.push([a.getAttribute('href'), img.naturalWidth, Math.round(width),
                  Math.round(box(img).width)]);
    document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}));
  }
  const cells = [...document.querySelectorAll('.jp-RenderedHTMLCommon table.md-cards td')]
    .filter(td => box(td).right > innerWidth + 0.5 || td.scrollWidth > td.clientWidth + 1);
  const mdPre = document.querySelector('.jp-RenderedMarkdown pre');
  return {hidden: hidden.map(e => e.textContent.slice(0, 60)), scrollers: scrollers.length,
          covered: covered.length, boxes, figures, cells: cells.length,
          cards: document.querySelectorAll('table.md-cards').length,
          codeBackground: mdPre ? getComputedStyle(mdPre).backgroundColor : null,
          page: document.documentElement.scrollWidth, view: innerWidth};
}"""


def test_every_page_reads_on_a_phone(browser, served):
    """At 390 px, every page: no output or table wider than the screen without a scroll cue
    (a shadow on the edge that hides more, and 'scroll sideways' under it); no Copy button
    over code; the download and page-contents boxes aligned with the text; every figure,
    after one tap, at the size it was drawn (its text readable); tables of three columns or
    more as cards, every cell whole; on the index, the code block set off by its background.
    At 1280 px the boxes are aligned too."""
    base, out, pages = served
    SHOTS.mkdir(parents=True, exist_ok=True)
    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    tab = phone.new_page()
    cues = figures = 0
    for page in pages:
        tab.goto(base + page.html_name, wait_until="load")
        got = tab.evaluate(PHONE, True)
        name = page.html_name
        assert got["page"] <= got["view"], (name, got)
        assert got["hidden"] == [], f"{name}: wider than the screen with no cue: {got['hidden']}"
        assert got["covered"] == 0 and got["boxes"] == [], (name, got)
        for href, natural, after_tap, _ in got["figures"]:
            assert after_tap >= natural - 1, f"{name}: {href} shown {after_tap} of {natural} px"
        assert got["cells"] == 0, (name, got)
        cues += tab.locator(".md-scroll-cue").count()
        figures += len(got["figures"])
        if name == "index.html":
            assert got["cards"] >= 1 and got["codeBackground"] not in (None, "rgb(255, 255, 255)")
    assert cues > 10 and figures > 20  # the check saw what it is about
    tab.goto(base + "17_every_parallelism.html", wait_until="load")
    tab.locator(".md-scroll-cue").nth(2).scroll_into_view_if_needed()
    tab.screenshot(path=str(SHOTS / "17_scroll_cue_390.png"))
    tab.locator("a.md-figure").last.click()
    tab.wait_for_selector(".md-lightbox img")
    tab.screenshot(path=str(SHOTS / "17_figure_tapped_390.png"))
    tab.goto(base + "index.html", wait_until="load")
    tab.locator("table.md-cards").first.scroll_into_view_if_needed()
    tab.screenshot(path=str(SHOTS / "index_learning_path_390.png"))
    phone.close()
    wide = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = wide.new_page()
    for name in ("index.html", "17_every_parallelism.html"):
        tab.goto(base + name, wait_until="load")
        assert tab.evaluate(PHONE, False)["boxes"] == [], name
    wide.close()


def test_search_reads_whole_sections(browser, served):
    """Words deep in a section (past its first 1,500 characters) are found, with the place
    they were found; `?q=` in the address runs a search (on a phone, the menu opens on its
    results), and typing keeps the address in step."""
    base, out, pages = served
    entries = json.loads(
        (out / "_static" / "search-index.js").read_text().split("=", 1)[1].rstrip().rstrip(";")
    )
    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    tab = phone.new_page()
    deep = 0
    for word in ("zig-zag", "get_batch_on_this_cp_rank", "striped", "gqa"):
        tab.goto(f"{base}index.html?q={word}", wait_until="load")
        tab.wait_for_selector("#md-results li")
        assert tab.locator("nav.md-toc").bounding_box()["height"] > 300  # the menu, open
        found = tab.eval_on_selector_all("#md-results li a", "as => as.map(a => a.href)")
        want = [e["href"] for e in entries if word in e["text"].lower()]
        assert want and all(base + h in found for h in want[:20]), (word, found, want)
        deep += any(e["text"].lower().find(word) > 1500 for e in entries)
        marks = tab.eval_on_selector_all("#md-results mark", "ms => ms.map(m => m.textContent)")
        assert marks and all(m.lower() == word for m in marks), (word, marks)
        if word == "striped":
            tab.screenshot(path=str(SHOTS / "search_deep_390.png"))
    assert deep >= 2  # past what the index used to keep of a section
    tab.fill("#md-search", "ring attention")
    tab.wait_for_function("location.search.includes('q=ring')")
    assert "ring attention" in unquote(tab.url.replace("+", " "))
    phone.close()
