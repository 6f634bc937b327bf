"""The page template of the course site (see `site.py`): nbconvert's JupyterLab template,
plus the lessons' menu (collapsed behind a button on a small screen) with the search box,
the lesson's downloads and source links, a slot for the page's table of contents, the
previous and next lessons by title, and MathJax, kept local, on pages with TeX only."""

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
{%- if m.tex %}
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
{%- else %}
<script>document.documentElement.dataset.mathjax = "none";</script>
{%- endif %}
{%- endblock html_head_js_mathjax -%}

{% block extra_css %}
<link rel="icon" href="data:,">
<link rel="stylesheet" href="_static/site.css">
<script src="_static/search-index.js" defer></script>
<script src="_static/site.js" defer></script>
{% endblock extra_css %}

{%- block body_header -%}
<body class="jp-Notebook md-site" data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
<header class="md-bar">
<button type="button" aria-expanded="false" aria-controls="md-nav">&#9776; Lessons</button>
<a href="index.html">minidist</a>
</header>
<nav class="md-toc" id="md-nav" aria-label="lessons">
<a class="md-home" href="index.html">minidist</a>
<div class="md-search" role="search">
<input type="search" id="md-search" placeholder="Search the course" aria-label="search the course"
  autocomplete="off">
<ol class="md-results" id="md-results" aria-live="polite"></ol>
</div>
<ol>
{%- for href, title in m.toc %}
<li{% if href == m.page %} class="md-current"{% endif %}>
  <a href="{{ href }}">{{ title | escape }}</a></li>
{%- endfor %}
</ol>
</nav>
<main class="md-main">
{#- The boxes above the lesson sit in a cell's frame, so they start and end where its text
    does, prompt column or none. #}
<div class="jp-Cell md-head"><div class="jp-Cell-inputWrapper"><div class="jp-InputArea">
<div class="jp-InputPrompt jp-InputArea-prompt"></div><div class="md-head-boxes">
{%- if m.links %}
{%- set l = m.links %}
<div class="md-links">
{%- set nb = l.downloads.notebook %}
Download <a class="md-download" href="{{ nb.download }}" download>{{ nb.name }}</a>
{%- if nb.colab %} · <a class="md-colab" href="{{ nb.colab }}">open in Colab</a>
(the downloads start with Colab's install cell) · <a href="{{ nb.github }}">on GitHub</a>
{%- endif %}
{%- set ex = l.downloads.exercise %}
{%- if ex %}<br>
Exercises: <a class="md-exercise" href="{{ ex.download }}" download>{{ ex.name }}</a>
{%- if ex.colab %} (<a href="{{ ex.colab }}">open in Colab</a>,
<a href="{{ ex.github }}">on GitHub</a>){% endif %};
grade with <code>python -m minidist grade {{ ex.name }}</code>
{%- endif %}
{%- for pkg in l.packages %}
<details class="md-source"><summary>Source: <code>{{ pkg.name }}</code>
  ({{ pkg.files | length }} files)</summary>
{%- for name, url in pkg.files %}{% if not loop.first %} · {% endif %}
  <a href="{{ url }}"><code>{{ name }}</code></a>
{%- endfor %}
</details>
{%- endfor %}
</div>
{%- endif %}
<!--minidist-page-toc-->
</div></div></div></div>
{%- endblock body_header -%}

{% block body_footer %}
<nav class="md-pager" aria-label="previous and next">
<span class="md-prev">{% if m.prev %}<a href="{{ m.prev[0] }}" rel="prev">
  &larr; {{ m.prev[1] | escape }}</a>{% endif %}</span>
<span class="md-next">{% if m.next %}<a href="{{ m.next[0] }}" rel="next">
  {{ m.next[1] | escape }} &rarr;</a>{% endif %}</span>
</nav>
</main>
</body>
{% endblock body_footer %}
"""
