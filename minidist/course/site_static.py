"""The site's own stylesheet and script (written to `_static/` by `site.build_site`).

The stylesheet undoes what makes nbconvert's pages hard to read on a phone: code and printed
output scroll sideways instead of being cut off or wrapped mid-word, the prompts go on a
small screen, and the lessons' menu collapses behind a button. Heading anchors are always
visible. Dark mode follows the system's setting: the page is drawn inverted, with figures
inverted back (nbconvert's theme is light only; this is the cheap way).

The script adds a copy button to each code cell, opens and closes the menu, folds the
page's table of contents on a small screen, and searches the index built with the site
(`_static/search-index.js`: every section's heading and text) with no server.
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
main.md-main { margin-left: 17rem; padding: 1rem 2rem 2rem; max-width: 62rem;
  box-sizing: border-box; }
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
.jp-InputArea-editor { position: relative; overflow-x: auto !important; }
.jp-InputArea-editor pre, .jp-OutputArea-output pre, .jp-RenderedText pre,
.jp-RenderedHTMLCommon pre {
  white-space: pre !important; word-break: normal !important; overflow-wrap: normal !important;
  overflow-x: auto; }
.jp-OutputArea-output { overflow-x: auto !important; }
.jp-RenderedHTMLCommon table { display: block; overflow-x: auto; }
a.md-figure { display: inline-block; cursor: zoom-in; }
a.md-figure img { max-width: 100%; height: auto; }
.jp-RenderedHTMLCommon :is(h1, h2, h3, h4) .anchor-link { visibility: visible !important;
  opacity: 0.4; margin-left: 0.3em; text-decoration: none; }
.jp-RenderedHTMLCommon :is(h1, h2, h3, h4) .anchor-link:hover { opacity: 1; }
button.md-copy { position: absolute; top: 0.2rem; right: 0.2rem; z-index: 1;
  font: 0.75rem system-ui, sans-serif; padding: 0.1rem 0.45rem; border: 1px solid #bbc;
  border-radius: 4px; background: #fff; cursor: pointer; opacity: 0.8; }
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
  if (button) button.addEventListener("click", function () {
    var open = body.classList.toggle("md-menu-open");
    button.setAttribute("aria-expanded", open ? "true" : "false");
  });
  var toc = document.querySelector(".md-pagetoc");
  if (toc && window.matchMedia("(max-width: 52rem)").matches) toc.open = false;

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

  var input = document.getElementById("md-search");
  var results = document.getElementById("md-results");
  if (!input || !results) return;
  input.addEventListener("input", function () {
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    results.innerHTML = "";
    if (!words.length || !window.MINIDIST_SEARCH) return;
    var found = [];
    window.MINIDIST_SEARCH.forEach(function (e) {
      var title = e.title.toLowerCase(), text = e.text.toLowerCase(), score = 0;
      for (var i = 0; i < words.length; i++) {
        if (title.indexOf(words[i]) >= 0) score += 10;
        else if (text.indexOf(words[i]) >= 0) score += 1;
        else return;
      }
      found.push([score, e]);
    });
    found.sort(function (a, b) { return b[0] - a[0]; });
    found.slice(0, 20).forEach(function (pair) {
      var e = pair[1], li = document.createElement("li"), a = document.createElement("a");
      a.href = e.href; a.textContent = e.title;
      var where = document.createElement("small"); where.textContent = e.page;
      li.appendChild(a); li.appendChild(where); results.appendChild(li);
    });
    if (!found.length) {
      var none = document.createElement("li"); none.textContent = "nothing found";
      results.appendChild(none);
    }
  });
})();
"""
