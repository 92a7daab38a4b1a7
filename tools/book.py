"""Build the course as a static HTML book: every notebook executed, every output rendered, offline.

    python tools/book.py [--out build/book] [--source .] [--jobs 2]      (make book)

Every notebook in ``<source>/notebooks`` (the list comes from the folder) is executed in a fresh
kernel in interpreter mode (``TRITON_INTERPRET=1``: the CPU, small sizes, the recorded GPU results)
and converted with nbconvert's JupyterLab template. Each page gets previous / contents / next links;
the landing page ``index.html`` is README.md followed by the contents. Worked solutions (cells tagged
``solution``) stay collapsed in a ``<details>`` element. A widget is shown as its static figure (the
``image/png`` its display carries; see ``flashattn.teaching.widgets``), never as an empty box.

Nothing is loaded from the internet: no require.js, no widget renderer, no web fonts; MathJax is
copied from the ``jupyter-server-mathjax`` package into ``_static/mathjax``. Figures are inlined as
data: URIs, so each page is one file plus MathJax. The kernels import ``flashattn`` from ``<source>``
(PYTHONPATH), so a clone builds its own code.

Why nbconvert: it is what JupyterLab's own "export to HTML" uses, so outputs look as they do in the
lab; it is already installed with JupyterLab and works offline. Jupyter Book 2 (mystmd) downloads its
theme at build time; Jupyter Book 1 (Sphinx + myst-nb) brings a large Sphinx stack and loads MathJax
and the widget renderer from a CDN unless reconfigured; mkdocs-jupyter wraps the same nbconvert in
mkdocs themes whose defaults load web fonts from Google.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SITE_TITLE = "FlashAttention in Triton"
MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"
MATHJAX_SKIP = ("localization", "extensions/a11y", "jax/output/SVG", "unpacked")  # unused by this config

TEMPLATE = r"""
{%- extends 'lab/index.html.j2' -%}

{%- block html_head_js -%}
<link rel="icon" href="data:,">
{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}

{%- block html_head_js_mathjax -%}
<script type="text/x-mathjax-config">
MathJax.Hub.Config({
  tex2jax: {inlineMath: [['$', '$'], ['\\(', '\\)']], displayMath: [['$$', '$$'], ['\\[', '\\]']],
            processEscapes: true, processEnvironments: true},
  "HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null,
               // MathJax's blank reference font is url('about:blank'), which Chromium reports as a CORS error
               styles: {"@font-face": {"font-family": "MathJax_Blank", src: "local('MathJax_Blank')"}}},
  TeX: {equationNumbers: {autoNumber: "none"}},
  MathMenu: {showLocale: false, showRenderer: false},
  displayAlign: "center", messageStyle: "none", showMathMenu: false
});
</script>
<script src="{{ resources.book.mathjax }}"></script>
{%- endblock html_head_js_mathjax -%}

{%- block extra_css -%}
<style type="text/css">
{{ resources.book.css }}
</style>
{%- endblock extra_css -%}

{%- macro book_nav(where) -%}
<nav class="book-nav book-nav-{{ where }}" aria-label="book navigation">
  <a class="book-home" href="index.html">{{ resources.book.site_title }}</a>
  <span class="book-links">
  {%- if resources.book.prev %}
  <a class="book-prev" rel="prev" href="{{ resources.book.prev.href }}">&larr; {{ resources.book.prev.title }}</a>
  {%- endif -%}
  <a class="book-contents" href="index.html#contents">Contents</a>
  {%- if resources.book.next %}
  <a class="book-next" rel="next" href="{{ resources.book.next.href }}">{{ resources.book.next.title }} &rarr;</a>
  {%- endif -%}
  </span>
</nav>
{%- endmacro -%}

{%- block body_header -%}
{{ super() }}
{{ book_nav("top") }}
{%- endblock body_header -%}

{%- block body_footer -%}
{{ book_nav("bottom") }}
<footer class="book-footer">{{ resources.book.footer }}</footer>
{{ super() }}
{%- endblock body_footer -%}

{%- block error scoped -%}
<div class="book-error">{{ super() }}</div>
{%- endblock error -%}

{%- block codecell scoped -%}
{%- if 'solution' in cell.metadata.get('tags', []) -%}
<details class="book-solution"><summary>Worked solution (click to show)</summary>
{{ super() }}
</details>
{%- else -%}
{{ super() }}
{%- endif -%}
{%- endblock codecell -%}
"""

CSS = """
body.jp-Notebook { padding: 0; }
main { max-width: 1100px; margin: 0 auto; padding: 0 16px 24px; }
.book-nav { display: flex; flex-wrap: wrap; justify-content: space-between; align-items: baseline; gap: 8px;
            padding: 10px 0; margin-bottom: 12px; border-bottom: 1px solid #ddd; font-size: 14px;
            font-family: var(--jp-ui-font-family); }
.book-nav-bottom { border-bottom: none; border-top: 1px solid #ddd; margin: 24px 0 0; }
.book-nav a { text-decoration: none; color: #1a5fa8; }
.book-nav a:hover { text-decoration: underline; }
.book-home { font-weight: 600; }
.book-links { display: flex; flex-wrap: wrap; gap: 4px 18px; }
.book-footer { color: #666; font-size: 12px; padding: 8px 0 0; font-family: var(--jp-ui-font-family); }
details.book-solution { border: 1px solid #ccd; border-radius: 4px; margin: 6px 0; padding: 2px 8px;
                        background: #f7f8fc; }
details.book-solution > summary { cursor: pointer; padding: 4px 0; font-family: var(--jp-ui-font-family);
                                  color: #1a5fa8; }
.jp-OutputArea-output img { max-width: 100%; height: auto; }
figure.book-widget { margin: 0; }
figure.book-widget figcaption { font-size: 13px; color: #333; padding: 4px 0 8px;
                                font-family: var(--jp-ui-font-family); }
.jp-RenderedHTMLCommon a code { color: #1a5fa8; }
.jp-RenderedMarkdown div.highlight { background: #f3f4f6; border-radius: 4px; padding: 6px 10px; margin: 8px 0; }
.jp-RenderedMarkdown div.highlight pre { background: transparent; }
"""


# --- the notebooks ----------------------------------------------------------------------------

def notebook_paths(source: Path) -> list[Path]:
    """Every numbered notebook of the course, in order (the list comes from the folder; 01b sorts after 01)."""
    paths = sorted((source / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    if not paths:
        raise SystemExit(f"no notebooks in {source / 'notebooks'}")
    return paths


def notebook_title(nb, fallback: str) -> str:
    """The text of the notebook's first heading, without Markdown marks."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^#{1,2}\s+(.+?)\s*$", cell.source, flags=re.M)
            if match:
                return re.sub(r"[`*_]", "", match.group(1))
    return fallback


def kernel_env(source: Path) -> dict:
    """The environment of the executing kernels: interpreter mode, and ``flashattn`` from ``source``."""
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    env.pop("FLASHATTN_SIZE", None)
    return env


def check_package_source(source: Path) -> str:
    """Fail unless the kernels will import ``flashattn`` from ``source`` (not from another checkout)."""
    found = subprocess.run([sys.executable, "-c", "import flashattn, pathlib; "
                            "print(pathlib.Path(flashattn.__file__).resolve().parent.parent)"],
                           env=kernel_env(source), cwd=source / "notebooks", capture_output=True, text=True,
                           check=True).stdout.strip()
    if Path(found) != source.resolve():
        raise SystemExit(f"the kernels would import flashattn from {found}, not from {source}")
    return found


def execute(path: str, source: str, timeout: int) -> tuple[str, dict, float]:
    """Execute one notebook in a fresh kernel (in a worker process); returns (path, notebook, seconds)."""
    import nbclient
    import nbformat

    os.environ.clear()
    os.environ.update(kernel_env(Path(source)))
    nb = nbformat.read(path, as_version=4)
    start = time.monotonic()
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=False,
                                     resources={"metadata": {"path": str(Path(path).parent)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        raise RuntimeError(f"{Path(path).name} failed:\n{err}") from None
    return path, nb, time.monotonic() - start


def static_widgets(nb) -> int:
    """Replace every widget view by its static figure and summary, captioned as such.

    A widget of the course displays one MIME bundle: the widget view, its current figure as
    ``image/png`` and a summary as ``text/plain`` (``flashattn.teaching.widgets``). A widget with no
    figure has nothing to show on a static page and is left out (said in the build log).
    """
    nb.metadata.pop("widgets", None)
    replaced = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.outputs:
            data = output.get("data", {})
            if WIDGET_VIEW in data:
                replaced += 1
                if "image/png" not in data:
                    print(f"  note: a widget without a static figure is left out: {data.get('text/plain', '')[:60]}")
                    continue
                png = "".join(data["image/png"].split())
                summary = html.escape(data.get("text/plain", ""))
                output["data"] = {"text/html": (
                    f'<figure class="book-widget"><img alt="{summary}" src="data:image/png;base64,{png}">'
                    f'<figcaption>{summary}<br><em>An interactive widget in JupyterLab (run the notebook to move '
                    'its controls); here, its figure for the default settings.</em></figcaption></figure>')}
            kept.append(output)
        cell.outputs = kept
    return replaced


def html_links(text: str, stems: set[str]) -> str:
    """Markdown links for the book: a notebook (``05_x.ipynb``, ``notebooks/05_x.ipynb``) points at its page;
    a link to another file of the repository (not in the book) becomes its text and the file's path."""
    def link(match):
        label, url = match.group(1), match.group(2)
        if re.match(r"^([a-z][a-z0-9+.-]*:|#)", url, flags=re.I):  # http(s), mailto, an anchor: as written
            return match.group(0)
        notebook = re.fullmatch(r"(?:\./)?(?:\.\./)?(?:notebooks/)?(\d\d[a-z]?_[A-Za-z0-9_]+)\.ipynb(#.*)?", url)
        if notebook and notebook.group(1) in stems:
            return f"[{label}]({notebook.group(1)}.html{notebook.group(2) or ''})"
        return f"{label} (`{url}` in the repository)"

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", link, text)


# --- pages ------------------------------------------------------------------------------------

def exporter():
    import jinja2
    from nbconvert import HTMLExporter

    return HTMLExporter(template_name="lab", extra_loaders=[jinja2.DictLoader({"book.html.j2": TEMPLATE})],
                        template_file="book.html.j2", embed_images=True)


def write_page(export, nb, out: Path, name: str, *, title: str, nav: dict, resources_path: Path, footer: str):
    nb.metadata["title"] = f"{title} · {SITE_TITLE}" if title != SITE_TITLE else title
    resources = {"metadata": {"name": name, "path": str(resources_path)},
                 "book": {**nav, "site_title": SITE_TITLE, "css": CSS, "footer": footer,
                          "mathjax": f"_static/mathjax/MathJax.js?config={MATHJAX_CONFIG}"}}
    body, _ = export.from_notebook_node(nb, resources=resources)
    (out / f"{name}.html").write_text(body, encoding="utf-8")


def landing_notebook(source: Path, pages: list[dict]):
    """README.md with links to the notebooks it names, then the contents, as a one-page notebook."""
    import nbformat

    stems = {page["name"] for page in pages}
    readme = (source / "README.md").read_text(encoding="utf-8")
    readme = re.sub(r"(?<!\[)`(\d\d[a-z]?_[A-Za-z0-9_]+)`",
                    lambda m: f"[`{m.group(1)}`]({m.group(1)}.html)" if m.group(1) in stems else m.group(0), readme)
    readme = html_links(readme, stems)
    contents = "\n".join(f"{i}. [{page['title']}]({page['name']}.html)" for i, page in enumerate(pages, 1))
    cells = [nbformat.v4.new_markdown_cell(readme),
             nbformat.v4.new_markdown_cell(f'<h2 id="contents">Contents</h2>\n\n{contents}')]
    return nbformat.v4.new_notebook(cells=cells)


def copy_mathjax(out: Path) -> None:
    import jupyter_server_mathjax

    static = Path(jupyter_server_mathjax.__file__).parent / "static"
    target = out / "_static" / "mathjax"
    shutil.copytree(static, target, ignore=lambda folder, names: [
        n for n in names if (Path(folder) / n).relative_to(static).as_posix() in MATHJAX_SKIP])


def describe_source(source: Path) -> str:
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "a copy outside git"
    return f"commit {commit}" + (" with uncommitted changes" if dirty else "")


def execute_all(paths: list[Path], source: Path, jobs: int, timeout: int, last: dict) -> tuple[dict, dict]:
    """Execute the notebooks, ``jobs`` at a time, the longest first (by ``last``, the seconds of the previous
    build; without them the later notebooks, which run longer); returns ({path: notebook}, {stem: seconds})."""
    print(f"[book] executing {len(paths)} notebooks from {source / 'notebooks'} in interpreter mode, "
          f"{jobs} at a time")
    order = sorted(paths, key=lambda path: (last.get(path.stem, 0.0), path.name), reverse=True)
    executed, seconds = {}, {}
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(execute, str(path), str(source), timeout) for path in order]
        for future in concurrent.futures.as_completed(futures):
            path, nb, took = future.result()
            executed[Path(path)], seconds[Path(path).stem] = nb, round(took, 1)
            print(f"  {Path(path).name}: {took:.1f} s")
    return executed, seconds


def write_pages(source: Path, out: Path, pages: list[dict]) -> int:
    """One page per notebook and the landing page; returns the number of widgets shown as static figures."""
    stems = {page["name"] for page in pages}
    footer = (f"Built by <code>make book</code> from {describe_source(source)}: every notebook executed in "
              "interpreter mode (Triton's CPU interpreter, small sizes); GPU numbers are the recorded results "
              "in <code>figures/data/</code>, labelled where they are shown.")
    export = exporter()
    links = [{"href": "index.html", "title": SITE_TITLE}] + [
        {"href": f"{page['name']}.html", "title": page["title"]} for page in pages]
    widgets = 0
    for i, page in enumerate(pages, 1):
        nb = page["nb"]
        widgets += static_widgets(nb)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = html_links(cell.source, stems)
        nav = {"prev": links[i - 1], "next": links[i + 1] if i + 1 < len(links) else None}
        write_page(export, nb, out, page["name"], title=page["title"], nav=nav,
                   resources_path=source / "notebooks", footer=footer)
    write_page(export, landing_notebook(source, pages), out, "index", title=SITE_TITLE,
               nav={"prev": None, "next": links[1]}, resources_path=source, footer=footer)
    return widgets


def build(source: Path, out: Path, jobs: int = 2, timeout: int = 900) -> dict:
    """Build the book of ``source`` into ``out`` (replaced); returns what ``_build.json`` records."""
    start = time.monotonic()
    source = source.resolve()
    paths = notebook_paths(source)
    check_package_source(source)
    last = {}
    if (out / "_build.json").exists():
        last = json.loads((out / "_build.json").read_text()).get("execute_seconds", {})
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    executed, seconds = execute_all(paths, source, jobs, timeout, last)
    pages = [{"name": path.stem, "title": notebook_title(executed[path], path.stem), "nb": executed[path]}
             for path in paths]
    widgets = write_pages(source, out, pages)
    copy_mathjax(out)
    info = {"source": str(source), "built_from": describe_source(source),
            "pages": ["index"] + [page["name"] for page in pages],
            "titles": {page["name"]: page["title"] for page in pages},
            "execute_seconds": seconds, "widgets_shown_static": widgets,
            "build_seconds": round(time.monotonic() - start, 1),
            "bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file())}
    (out / "_build.json").write_text(json.dumps(info, indent=1))
    print(f"[book] {len(pages) + 1} pages, {widgets} widgets as static figures, "
          f"{info['bytes'] / 1e6:.1f} MB in {out} ({info['build_seconds']:.0f} s)")
    return info


def main(argv=None) -> int:
    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, default=root, help="the course checkout to build (default: this one)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <source>/build/book)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="notebooks executed at once")
    parser.add_argument("--timeout", type=int, default=900, help="seconds one cell may run")
    args = parser.parse_args(argv)
    out = args.out or args.source / "build" / "book"
    build(args.source, out, max(1, args.jobs), args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
