"""The page template of the course site (see `site.py`): nbconvert's JupyterLab template,
plus a table of contents, the lesson's links, and MathJax and require.js kept local."""

TEMPLATE = r"""{%- extends 'index.html.j2' -%}
{% from 'mathjax.html.j2' import mathjax %}
{%- set m = resources.minidist -%}

{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}

{#- The sources are this repository's own notebooks: pygments' escaped output is not
    sanitised a second time (bleach took a quarter of the build). -#}
{% block input %}
<div class="jp-CodeMirrorEditor jp-Editor jp-InputArea-editor" data-type="inline">
     <div class="cm-editor cm-s-jupyter">
{{ cell.source | highlight_code(metadata=cell.metadata) }}
     </div>
</div>
{%- endblock input %}

{%- block html_head_js_mathjax -%}
<script>
// The MathJax copied into the site carries the STIX-Web web fonts only (not TeX's), and
// its placeholder font is local() rather than url('about:blank') (a console error).
window.MathJax = {"HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web",
  imageFont: null, styles: {"@font-face": {"font-family": "MathJax_Blank",
                                           src: "local('MathJax_Blank')"}}}};
</script>
{{ mathjax(resources.mathjax_url) }}
<script>
MathJax.Hub.Register.StartupHook("End", function () {
  MathJax.Hub.Queue(function () { document.documentElement.dataset.mathjax = "done"; });
});
</script>
{%- endblock html_head_js_mathjax -%}

{% block extra_css %}
<link rel="icon" href="data:,">
<style type="text/css">
body.md-site { margin: 0; padding: 0; }
nav.md-toc { position: fixed; top: 0; left: 0; bottom: 0; width: 17rem; overflow-y: auto;
  box-sizing: border-box; padding: 1rem; background: #f6f7f9; border-right: 1px solid #dde;
  font: 0.9rem/1.35 system-ui, sans-serif; }
nav.md-toc .md-home { font-weight: 700; font-size: 1.15rem; text-decoration: none; }
nav.md-toc ol { list-style: none; padding: 0; margin: 0.8rem 0 0; }
nav.md-toc li { margin: 0.45rem 0; }
nav.md-toc li.md-current a { font-weight: 700; color: #000; }
main.md-main { margin-left: 17rem; padding: 1rem 2rem 2rem; max-width: 62rem; }
.md-links { border: 1px solid #dde; border-radius: 6px; padding: 0.6rem 1rem;
  background: #fafbfc; font: 0.9rem/1.5 system-ui, sans-serif; margin: 0.5rem 0 1rem; }
.md-links code { font-size: 0.85rem; }
.md-links a, nav.md-toc a, .md-pager a { color: #1a5fb4; }
.md-pager { display: flex; justify-content: space-between; margin-top: 2rem;
  font: 0.95rem system-ui, sans-serif; }
@media (max-width: 52rem) {
  nav.md-toc { position: static; width: auto; border-right: 0; }
  main.md-main { margin-left: 0; }
}
</style>
{% endblock extra_css %}

{%- block body_header -%}
<body class="jp-Notebook md-site" data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
<nav class="md-toc" aria-label="lessons">
<a class="md-home" href="index.html">minidist</a>
<ol>
{%- for href, title in m.toc %}
<li{% if href == m.page %} class="md-current"{% endif %}>
  <a href="{{ href }}">{{ title | escape }}</a></li>
{%- endfor %}
</ol>
</nav>
<main class="md-main">
{%- if m.links %}
{%- set l = m.links %}
<div class="md-links">
<a class="md-colab" href="{{ l.colab }}">Open in Colab</a>
(first run <code>!pip install "minidist @ git+{{ l.repo }}"</code>)
· <a href="{{ l.notebook_github }}">notebook on GitHub</a>
{%- if l.exercise %}<br>
Exercises: <a class="md-exercise" href="{{ l.exercise.download }}" download>
  {{- l.exercise.name }}</a>
(<a href="{{ l.exercise.colab }}">open in Colab</a>,
<a href="{{ l.exercise.github }}">on GitHub</a>;
grade with <code>python -m minidist grade {{ l.exercise.name }}</code>)
{%- endif %}
{%- for pkg in l.packages %}
<details class="md-source"><summary>Source: <a href="{{ pkg.url }}">{{ pkg.name }}</a>
  ({{ pkg.files | length }} files)</summary>
{%- for name, url in pkg.files %}{% if not loop.first %} · {% endif %}
  <a href="{{ url }}"><code>{{ name }}</code></a>
{%- endfor %}
</details>
{%- endfor %}
</div>
{%- endif %}
{%- endblock body_header -%}

{% block body_footer %}
<nav class="md-pager" aria-label="previous and next">
<span>{% if m.prev %}<a href="{{ m.prev }}">&larr; previous</a>{% endif %}</span>
<span>{% if m.next %}<a href="{{ m.next }}">next &rarr;</a>{% endif %}</span>
</nav>
</main>
</body>
{% endblock body_footer %}
"""
