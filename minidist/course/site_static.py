"""The site's own stylesheet and script (written to `_static/` by `site.build_site`).

The stylesheet undoes what makes nbconvert's pages hard to read on a phone: code and printed
output scroll sideways instead of being cut off or wrapped mid-word, and say so (a shadow at
the edge that hides more, and under a printed output or a table "scroll sideways"); the
prompts go on a small screen, and the lessons' menu collapses behind a button; a table of
three columns or more becomes one card per row there. Heading anchors are always visible.
The download and page-contents boxes sit in a cell's frame, aligned with the text. Dark
mode follows the system's setting: the page is drawn inverted, with figures inverted back
(nbconvert's theme is light only; this is the cheap way).

The script adds a copy button under each code cell (never over its code), marks what
scrolls sideways, opens a figure shown smaller than it was drawn at its own size in a
scrollable view (one tap, readable on a phone; a figure shown whole opens as a file), opens
and closes the menu, folds the page's table of contents on a small screen, and searches the
index built with the site (`_static/search-index.js`: every section's heading and whole
text) with no server, showing where each word was found; `?q=words` in a page's address
runs that search (and opens the menu on a phone), and typing keeps the address in step.
"""

CSS = r"""
body.md-site { margin: 0; padding: 0; }
nav.md-toc { position: fixed; top: 0; left: 0; bottom: 0; width: 17rem; overflow-y: auto;
  box-sizing: border-box; padding: 1rem; background: #f6f7f9; border-right: 1px solid #dde;
  font: 0.9rem/1.35 system-ui, sans-serif; }
nav.md-toc .md-home { font-weight: 700; font-size: 1.15rem; text-decoration: none; }
nav.md-toc ol { list-style: none; padding: 0; margin: 0.8rem 0 0; }
nav.md-toc li { margin: 0.45rem 0; }
nav.md-toc li.md-current a { font-weight: 700; color: #000; }
.md-search input { width: 100%; box-sizing: border-box; margin-top: 0.8rem; padding: 0.35rem;
  font: inherit; border: 1px solid #bbc; border-radius: 4px; }
ol.md-results { margin: 0.3rem 0 0; border-bottom: 1px solid #dde; }
ol.md-results li { margin: 0.35rem 0; }
ol.md-results small { display: block; color: #555; }
ol.md-results .md-where { display: block; color: #333; font-size: 0.8rem; }
ol.md-results mark { background: #fde68a; color: inherit; }
main.md-main { margin-left: 17rem; padding: 1rem 2rem 2rem; max-width: 62rem;
  box-sizing: border-box; }
.md-head .md-head-boxes { flex: 1 1 auto; min-width: 0; padding: 0 20px 0 5px; }
.md-bar { display: none; }
.md-links, .md-pagetoc { border: 1px solid #dde; border-radius: 6px; padding: 0.6rem 1rem;
  background: #fafbfc; font: 0.9rem/1.5 system-ui, sans-serif; margin: 0.5rem 0 1rem; }
.md-pagetoc ul { margin: 0.3rem 0 0; padding-left: 0.2rem; list-style: none; }
.md-pagetoc li.md-toc-h3 { margin-left: 1.2rem; }
.md-links code { font-size: 0.85rem; }
.md-links a, nav.md-toc a, .md-pager a, .md-pagetoc a { color: #1a5fb4; }
.md-pager { display: flex; justify-content: space-between; gap: 1rem; margin-top: 2rem;
  font: 0.95rem system-ui, sans-serif; }
.md-pager .md-next { text-align: right; }
/* Code and printed output scroll sideways; nothing is cut off or wrapped mid-word. */
.jp-Cell, .jp-Cell-inputWrapper, .jp-Cell-outputWrapper, .jp-InputArea, .jp-OutputArea,
.jp-OutputArea-child, .jp-CodeMirrorEditor, .jp-InputArea-editor, .cm-editor {
  overflow: visible !important; min-width: 0; }
.jp-InputArea-editor { position: relative; display: flex; flex-direction: column; }
.jp-InputArea-editor pre, .jp-OutputArea-output pre, .jp-RenderedText pre,
.jp-RenderedHTMLCommon pre {
  white-space: pre !important; word-break: normal !important; overflow-wrap: normal !important;
  overflow-x: auto; }
.jp-OutputArea-output { overflow-x: auto !important; }
.jp-RenderedHTMLCommon table { display: block; overflow-x: auto; }
.jp-RenderedHTMLCommon.jp-RenderedMarkdown pre { background: #f6f7f9; padding: 0.5rem 0.7rem;
  border-radius: 4px; margin: 0.5rem 0 1rem; }
/* What hides more to the side says so: a shadow at that edge, and a line under it. */
.md-wide { box-shadow: inset -14px 0 10px -10px rgba(0, 0, 0, 0.45); }
.md-wide.md-at-end { box-shadow: inset 14px 0 10px -10px rgba(0, 0, 0, 0.45); }
.md-scroll-cue { font: 0.75rem system-ui, sans-serif; color: #555; text-align: right;
  margin: 0.1rem 0 0.4rem; }
.md-at-end + .md-scroll-cue { visibility: hidden; }
a.md-figure { display: inline-block; cursor: zoom-in; }
a.md-figure img { max-width: 100%; height: auto; }
.jp-RenderedHTMLCommon :is(h1, h2, h3, h4) .anchor-link { visibility: visible !important;
  opacity: 0.4; margin-left: 0.3em; text-decoration: none; }
.jp-RenderedHTMLCommon :is(h1, h2, h3, h4) .anchor-link:hover { opacity: 1; }
button.md-copy { display: block; width: fit-content; margin: 0.1rem 0.2rem 0.2rem auto;
  font: 0.75rem system-ui, sans-serif; padding: 0.1rem 0.45rem; border: 1px solid #bbc;
  border-radius: 4px; background: #fff; cursor: pointer; opacity: 0.8; }
.md-lightbox { position: fixed; inset: 0; z-index: 20; overflow: auto; background: #fff;
  overscroll-behavior: contain; }
.md-lightbox img { display: block; max-width: none; margin: 2.6rem 0.5rem 0.5rem; }
.md-lightbox button { position: fixed; top: 0.4rem; right: 0.6rem; z-index: 21;
  font: 1rem system-ui, sans-serif; padding: 0.25rem 0.7rem; border: 1px solid #bbc;
  border-radius: 4px; background: #fff; }
body.md-lightbox-open { overflow: hidden; }
button.md-copy:hover { opacity: 1; }
@media (max-width: 52rem) {
  .md-bar { display: flex; align-items: center; gap: 0.8rem; position: sticky; top: 0;
    z-index: 10; padding: 0.4rem 0.8rem; background: #f6f7f9; border-bottom: 1px solid #dde;
    font: 1rem system-ui, sans-serif; }
  .md-bar a { font-weight: 700; text-decoration: none; color: #1a5fb4; }
  .md-bar button { font: inherit; padding: 0.25rem 0.6rem; border: 1px solid #bbc;
    border-radius: 4px; background: #fff; }
  nav.md-toc { display: none; position: static; width: auto; border-right: 0;
    border-bottom: 1px solid #dde; }
  body.md-menu-open nav.md-toc { display: block; position: fixed; top: 2.9rem; left: 0;
    right: 0; bottom: 0; z-index: 9; }
  main.md-main { margin-left: 0; padding: 0.5rem 0.8rem 2rem; }
  .jp-InputPrompt, .jp-OutputPrompt { display: none !important; }
  /* A table of three columns or more: one card per row, each cell under its column's name
     (the script copies the names into data-label). */
  .jp-RenderedHTMLCommon table.md-cards { display: block; overflow: visible; }
  .md-cards thead { display: none; }
  .md-cards tbody, .md-cards tr, .md-cards td { display: block; }
  .md-cards tr { border: 1px solid #dde; border-radius: 6px; margin: 0 0 0.6rem;
    padding: 0.3rem 0.5rem; }
  .jp-RenderedHTMLCommon .md-cards td { text-align: left; padding: 0.15rem 0;
    white-space: normal; border: 0; }
  .md-cards td[data-label]::before { content: attr(data-label) ": "; font-weight: 600; }
  .md-cards td code { white-space: normal; overflow-wrap: anywhere; }
}
@media (prefers-color-scheme: dark) {
  html { filter: invert(0.9) hue-rotate(180deg); background: #fff; }
  img, .MathJax_SVG, video { filter: invert(1) hue-rotate(180deg); }
}
"""

JS = r"""
(function () {
  var body = document.body;
  var button = document.querySelector(".md-bar button");
  function menu(open) {
    body.classList.toggle("md-menu-open", open);
    if (button) button.setAttribute("aria-expanded", open ? "true" : "false");
  }
  if (button) button.addEventListener("click", function () {
    menu(!body.classList.contains("md-menu-open"));
  });
  var small = window.matchMedia("(max-width: 52rem)");
  var toc = document.querySelector(".md-pagetoc");
  if (toc && small.matches) toc.open = false;

  function copy(text, done) {
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallback(text, done); });
    } else { fallback(text, done); }
  }
  function fallback(text, done) {
    var area = document.createElement("textarea");
    area.value = text; area.style.position = "fixed"; area.style.opacity = "0";
    document.body.appendChild(area); area.select();
    try { document.execCommand("copy"); done(); } finally { area.remove(); }
  }
  // The button goes under the code, inside its box: it never covers a line's end.
  document.querySelectorAll(".jp-InputArea-editor").forEach(function (editor) {
    var pre = editor.querySelector("pre");
    if (!pre) return;
    var b = document.createElement("button");
    b.className = "md-copy"; b.type = "button"; b.textContent = "Copy";
    b.setAttribute("aria-label", "copy this code");
    b.addEventListener("click", function () {
      copy(pre.textContent.replace(/\n$/, ""), function () {
        b.textContent = "Copied"; setTimeout(function () { b.textContent = "Copy"; }, 1500);
      });
    });
    editor.appendChild(b);
  });

  // A table of three columns or more becomes cards on a phone (the stylesheet): each cell
  // carries its column's name.
  document.querySelectorAll(".jp-RenderedHTMLCommon table").forEach(function (table) {
    var names = [].map.call(table.querySelectorAll("thead th"), function (th) {
      return th.textContent.trim();
    });
    if (names.length < 3) return;
    table.classList.add("md-cards");
    table.querySelectorAll("tbody tr").forEach(function (tr) {
      [].forEach.call(tr.children, function (td, i) {
        if (names[i]) td.setAttribute("data-label", names[i]);
      });
    });
  });

  // Whatever is wider than its box scrolls, and says so: a shadow on the side that hides
  // more, and under printed output and tables a line.
  var SCROLLERS = ".jp-InputArea-editor pre, .jp-OutputArea-output pre, " +
    ".jp-RenderedHTMLCommon pre, .jp-RenderedHTMLCommon table:not(.md-cards)";
  function edge(e) {
    e.classList.toggle("md-at-end", e.scrollLeft + e.clientWidth >= e.scrollWidth - 1);
  }
  function markWide() {
    document.querySelectorAll(SCROLLERS).forEach(function (e) {
      var wide = e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).display !== "none";
      var cue = e.nextElementSibling;
      var hasCue = cue && cue.classList.contains("md-scroll-cue");
      e.classList.toggle("md-wide", wide);
      if (wide) edge(e);
      var wantsCue = wide && !e.closest(".jp-InputArea-editor");
      if (wantsCue && !hasCue) {
        cue = document.createElement("div");
        cue.className = "md-scroll-cue"; cue.textContent = "scroll sideways for more \u2192";
        e.insertAdjacentElement("afterend", cue);
      } else if (!wantsCue && hasCue) { cue.remove(); }
    });
  }
  document.addEventListener("scroll", function (ev) {
    var e = ev.target;
    if (e.classList && e.classList.contains("md-wide")) edge(e);
  }, true);
  markWide();
  window.addEventListener("resize", markWide);
  window.addEventListener("load", markWide);

  // A figure shown smaller than it was drawn opens at its own size, in a view that scrolls
  // (one tap; pinch-zooming a page is not needed to read it).
  var box = null;
  function close() {
    if (!box) return;
    box.remove(); box = null; body.classList.remove("md-lightbox-open");
  }
  document.addEventListener("keydown", function (ev) { if (ev.key === "Escape") close(); });
  document.querySelectorAll("a.md-figure").forEach(function (a) {
    a.addEventListener("click", function (ev) {
      var img = a.querySelector("img");
      if (ev.ctrlKey || ev.metaKey || ev.shiftKey || !img || !img.naturalWidth) return;
      if (img.getBoundingClientRect().width >= img.naturalWidth - 1) return;  // already whole
      ev.preventDefault();
      close();
      box = document.createElement("div");
      box.className = "md-lightbox"; box.setAttribute("role", "dialog");
      box.setAttribute("aria-label", img.alt || "figure");
      var shut = document.createElement("button");
      shut.type = "button"; shut.textContent = "Close"; shut.addEventListener("click", close);
      var big = document.createElement("img");
      big.src = img.getAttribute("src"); big.alt = img.alt;
      big.width = img.naturalWidth; big.height = img.naturalHeight;
      big.addEventListener("click", close);
      box.appendChild(shut); box.appendChild(big);
      body.appendChild(box); body.classList.add("md-lightbox-open");
      shut.focus();
    });
  });

  var input = document.getElementById("md-search");
  var results = document.getElementById("md-results");
  if (!input || !results) return;
  function where(text, word) {
    var i = text.toLowerCase().indexOf(word);
    var from = Math.max(0, i - 50), to = Math.min(text.length, i + word.length + 70);
    var small = document.createElement("span"); small.className = "md-where";
    small.appendChild(document.createTextNode((from ? "\u2026" : "") + text.slice(from, i)));
    var mark = document.createElement("mark"); mark.textContent = text.substr(i, word.length);
    small.appendChild(mark);
    small.appendChild(document.createTextNode(text.slice(i + word.length, to) +
      (to < text.length ? "\u2026" : "")));
    return small;
  }
  function search() {
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    results.innerHTML = "";
    if (!words.length || !window.MINIDIST_SEARCH) return;
    var found = [];
    window.MINIDIST_SEARCH.forEach(function (e) {
      var title = e.title.toLowerCase(), text = e.text.toLowerCase(), score = 0, inText = null;
      for (var i = 0; i < words.length; i++) {
        if (title.indexOf(words[i]) >= 0) score += 10;
        else if (text.indexOf(words[i]) >= 0) {
          score += 1;
          if (inText === null) inText = words[i];
        }
        else return;
      }
      found.push([score, e, inText]);
    });
    found.sort(function (a, b) { return b[0] - a[0]; });
    found.slice(0, 20).forEach(function (triple) {
      var e = triple[1], li = document.createElement("li"), a = document.createElement("a");
      a.href = e.href; a.textContent = e.title;
      var page = document.createElement("small"); page.textContent = e.page;
      li.appendChild(a); li.appendChild(page);
      if (triple[2] !== null) li.appendChild(where(e.text, triple[2]));
      results.appendChild(li);
    });
    if (!found.length) {
      var none = document.createElement("li"); none.textContent = "nothing found";
      results.appendChild(none);
    }
  }
  input.addEventListener("input", function () {
    search();
    if (window.history && history.replaceState) {
      var url = new URL(location.href);
      if (input.value.trim()) url.searchParams.set("q", input.value);
      else url.searchParams.delete("q");
      history.replaceState(null, "", url);
    }
  });
  var asked = new URLSearchParams(location.search).get("q");
  if (asked) {
    input.value = asked;
    if (small.matches) menu(true);
    if (window.MINIDIST_SEARCH) search();
    else window.addEventListener("load", search);
  }
})();
"""
