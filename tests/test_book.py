"""The static HTML book (``make book``, tools/book.py): built from a fresh clone, then read as a reader would.

The book is built once per run, from a ``git clone`` of this repository (what CI and a learner get), so
uncommitted work is not in it. ``FLASHATTN_BOOK_FROM=snapshot`` builds from a fresh repository holding what
the next commit would (uncommitted work included), ``FLASHATTN_BOOK_FROM=worktree`` from the working tree
itself, and ``FLASHATTN_BOOK_DIR=<folder>`` checks a book already built there (no build).

Checks: every notebook has a page and the contents and navigation link them in order; every figure
resolves to a non-empty image; widgets appear as static figures, not as empty boxes or repr text; no
page holds an error or a traceback; solutions are collapsed; internal links and anchors resolve;
nothing in the HTML or CSS points at the internet; and Chromium, with every non-local request
blocked and recorded, loads every page, typesets its math and logs no error.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from browser import chromium, widget_cells

ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_S = 1500
IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF8", b"<svg", b"<?xml")
WIDGET_REPR = re.compile(r"\b\w*(Box|Widget|Slider|Dropdown)\(")
LOCAL_SCHEMES = ("data", "blob", "about", "file", "javascript")
RESOURCE_TAGS = {"img": "src", "script": "src", "link": "href", "iframe": "src", "source": "src", "audio": "src",
                 "video": "src", "embed": "src", "object": "data", "track": "src", "input": "src"}


# --- reading pages ----------------------------------------------------------------------------

class Page(HTMLParser):
    """What the checks need from one HTML page: tags with attributes, ids, CSS, text and outputs' text."""

    def __init__(self, path: Path):
        super().__init__(convert_charrefs=True)
        self.path, self.tags, self.ids, self.css, self.text = path, [], set(), [], []
        self._style = False
        self.feed(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        if attrs.get("style"):
            self.css.append(attrs["style"])
        self._style = tag == "style"

    def handle_endtag(self, tag):
        self._style = False

    def handle_data(self, data):
        (self.css if self._style else self.text).append(data)

    def all(self, tag: str) -> list[dict]:
        return [attrs for name, attrs in self.tags if name == tag]

    def has_class(self, tag: str, cls: str) -> list[dict]:
        return [a for a in self.all(tag) if cls in (a.get("class") or "").split()]


def css_urls(css: str) -> list[str]:
    """Every url(...) and @import target in a piece of CSS."""
    urls = re.findall(r"url\(\s*['\"]?([^'\")]+?)['\"]?\s*\)", css)
    urls += re.findall(r"@import\s+['\"]([^'\"]+)['\"]", css)
    return urls


def is_local(url: str) -> bool:
    scheme = urlsplit(url).scheme.lower()
    return scheme in LOCAL_SCHEMES or (scheme == "" and not url.startswith("//"))


def data_bytes(url: str) -> bytes:
    header, _, payload = url.partition(",")
    return base64.b64decode(payload) if header.endswith(";base64") else unquote(payload).encode()


# --- building ---------------------------------------------------------------------------------

def _git(*args, cwd) -> str:
    return subprocess.run(["git", "-c", "user.name=book", "-c", "user.email=book@example.com", *args], cwd=cwd,
                          capture_output=True, text=True, check=True).stdout


def _source(tmp: Path) -> Path:
    """The checkout to build: a git clone of HEAD (default), a snapshot of what the next commit would hold
    (tracked and untracked files git does not ignore, committed into a fresh repository), or the working tree."""
    mode = os.environ.get("FLASHATTN_BOOK_FROM", "clone")
    if mode not in ("clone", "snapshot", "worktree"):
        raise ValueError(f"FLASHATTN_BOOK_FROM must be clone, snapshot or worktree, got {mode!r}")
    if mode == "worktree":
        return ROOT
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: set FLASHATTN_BOOK_FROM=worktree to build the book from this folder")
    source = tmp / mode
    if mode == "clone":
        _git("clone", "--quiet", str(ROOT), str(source), cwd=tmp)
    else:
        for name in _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).split("\0"):
            if name and (ROOT / name).is_file():  # a file deleted but not yet staged is listed and absent
                (source / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, source / name)
        _git("init", "-q", cwd=source)
        _git("add", "-A", cwd=source)
        _git("commit", "-q", "-m", "snapshot", cwd=source)
    if not (source / "tools" / "book.py").exists():
        pytest.fail("tools/book.py is not committed, so a fresh clone cannot build the book; commit it, or set "
                    "FLASHATTN_BOOK_FROM=snapshot (uncommitted work included) or worktree")
    return source


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> dict:
    """The built book: ``{"dir", "source", "info", "pages": {name: Page}}``."""
    missing = [m for m in ("nbconvert", "jupyter_server_mathjax") if importlib.util.find_spec(m) is None]
    if missing and not os.environ.get("FLASHATTN_BOOK_DIR"):
        pytest.skip(f"building the book needs {', '.join(missing)} (make setup installs them with the test extras)")
    if os.environ.get("FLASHATTN_BOOK_DIR"):
        out = Path(os.environ["FLASHATTN_BOOK_DIR"]).resolve()
        source = Path(json.loads((out / "_build.json").read_text())["source"])
    else:
        tmp = tmp_path_factory.mktemp("book")
        source, out = _source(tmp), tmp / "book"
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(source / "tools" / "book.py"), "--source", str(source),
                               "--out", str(out)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        assert proc.returncode == 0, f"the book did not build:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        print(f"book built from {source} in {time.monotonic() - start:.0f} s")
    info = json.loads((out / "_build.json").read_text())
    pages = {path.stem: Page(path) for path in sorted(out.glob("*.html"))}
    return {"dir": out, "source": source, "info": info, "pages": pages}


def has_math(source: Path, name: str) -> bool:
    """Whether the Markdown of a page's source (README.md for the index) holds $...$ math."""
    if name == "index":
        texts = [(source / "README.md").read_text()]
    else:
        cells = json.loads((source / "notebooks" / f"{name}.ipynb").read_text())["cells"]
        texts = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown"]
    return any(re.search(r"\$[^$\n]+\$", text) for text in texts)


def notebooks(source: Path) -> list[Path]:
    return sorted((source / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def test_make_book_runs_the_builder():
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^book:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert match and "tools/book.py" in match.group(1) and "build/book" in match.group(1)
    assert re.search(r"^/?build/?$", (ROOT / ".gitignore").read_text(), flags=re.M), "build/ must be git-ignored"


# --- the checks -------------------------------------------------------------------------------

def test_every_notebook_has_a_page_in_order(book):
    names = [path.stem for path in notebooks(book["source"])]
    assert names, "no notebooks"
    assert book["info"]["pages"] == ["index"] + names
    assert set(book["pages"]) == {"index", *names}
    index = book["pages"]["index"].path.read_text(encoding="utf-8")
    assert 'id="contents"' in index, "the landing page has no contents"
    contents = re.findall(r'href="(\d\d[a-z]?_\w+\.html)"', index.split('id="contents"', 1)[1].split("</ol>", 1)[0])
    assert contents == [f"{name}.html" for name in names]  # the contents: every notebook, in order
    readme_title = (book["source"] / "README.md").read_text().splitlines()[0].lstrip("# ")
    assert readme_title in "".join(book["pages"]["index"].text)


def test_navigation_goes_through_the_course(book):
    order = book["info"]["pages"]
    for i, name in enumerate(order):
        page = book["pages"][name]
        prev = {a["href"] for a in page.has_class("a", "book-prev")}
        nxt = {a["href"] for a in page.has_class("a", "book-next")}
        assert prev == ({f"{order[i - 1]}.html"} if i > 0 else set()), name
        assert nxt == ({f"{order[i + 1]}.html"} if i + 1 < len(order) else set()), name
        assert {a["href"] for a in page.has_class("a", "book-contents")} == {"index.html#contents"}
        title = book["info"]["titles"].get(name)
        if title:
            assert title in "".join(page.text), f"{name}: its title is not on the page"


def test_every_figure_resolves_to_an_image(book):
    total = 0
    for name, page in book["pages"].items():
        for img in page.all("img"):
            src = img.get("src", "")
            if src.startswith("data:"):
                content = data_bytes(src)
            else:
                target = (page.path.parent / unquote(urlsplit(src).path))
                assert is_local(src) and target.is_file(), f"{name}: image {src[:80]} does not resolve"
                content = target.read_bytes()
            assert len(content) > 100 and content.lstrip().startswith(IMAGE_MAGIC), f"{name}: empty image"
            total += 1
    assert total >= len(book["pages"]) - 1, "fewer figures than notebooks: were outputs rendered?"


def test_widgets_are_static_figures(book):
    """Each widget cell of a notebook shows, on its page, its default figure (a PNG) with a caption."""
    for path in notebooks(book["source"]):
        page = book["pages"][path.stem]
        text = "".join(page.text)
        assert "Error displaying widget" not in text and not WIDGET_REPR.search(text), path.stem
        assert not any(s.get("type", "").startswith("application/vnd.jupyter.widget") for s in page.all("script"))
        figures = re.findall(r'<figure class="book-widget"><img [^>]*src="data:image/png;base64,([^"]+)"',
                             page.path.read_text(encoding="utf-8"))
        assert len(figures) == len(widget_cells(path)), f"{path.stem}: widgets without their static figure"
        for png in figures:
            assert base64.b64decode(png).startswith(IMAGE_MAGIC[0])
    assert book["info"]["widgets_shown_static"] >= 2  # the traffic (05) and bank (06) widgets


def test_no_page_holds_an_error(book):
    for name, page in book["pages"].items():
        text = "".join(page.text)
        assert "Traceback (most recent call last)" not in text, name
        assert not page.has_class("div", "book-error"), f"{name} holds an error output"


def test_solutions_stay_collapsed(book):
    for path in notebooks(book["source"]):
        cells = json.loads(path.read_text())["cells"]
        solutions = sum("solution" in cell.get("metadata", {}).get("tags", []) for cell in cells)
        details = book["pages"][path.stem].has_class("details", "book-solution")
        assert len(details) == solutions, path.stem
        assert not any("open" in d for d in details), f"{path.stem}: a solution is open"


def test_internal_links_resolve(book):
    checked = 0
    for name, page in book["pages"].items():
        for tag, attrs in page.tags:
            url = attrs.get("href") if tag in ("a", "link") else attrs.get(RESOURCE_TAGS.get(tag, ""))
            if not url or not is_local(url) or urlsplit(url).scheme:
                continue
            parts = urlsplit(url)
            target = page.path if not parts.path else (page.path.parent / unquote(parts.path)).resolve()
            assert target.is_file(), f"{name}: {url} does not resolve"
            if parts.fragment and target.suffix == ".html":
                ids = book["pages"][target.stem].ids if target.stem in book["pages"] else set()
                # as a browser does: the fragment as written, then percent-decoded
                assert parts.fragment in ids or unquote(parts.fragment) in ids, f"{name}: no anchor for {url}"
            checked += 1
    assert checked > 10 * len(book["pages"])


def test_nothing_points_at_the_internet(book):
    css_files = sorted(book["dir"].rglob("*.css"))
    for name, page in book["pages"].items():
        for tag, attrs in page.tags:
            url = attrs.get(RESOURCE_TAGS.get(tag, ""))
            if tag == "link" or url:
                url = url or attrs.get("href", "")
                assert is_local(url), f"{name}: <{tag}> loads {url}"
        for url in css_urls("\n".join(page.css)):
            assert is_local(url), f"{name}: CSS loads {url}"
    for path in css_files:
        for url in css_urls(path.read_text(errors="replace")):
            assert is_local(url), f"{path}: loads {url}"


def test_pages_load_offline_in_chromium(book):
    """Every page in Chromium, every non-local request blocked and recorded: none, no console error,
    the math typeset, the solutions closed until clicked."""
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        outside, errors = [], []

        def route(request_route):
            url = request_route.request.url
            if urlsplit(url).scheme in LOCAL_SCHEMES:
                request_route.continue_()
            else:
                outside.append(url)
                request_route.abort()

        context.route("**/*", route)
        for name, page_html in book["pages"].items():
            page = context.new_page()
            page.on("console", lambda m, name=name: errors.append(f"{name}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e, name=name: errors.append(f"{name}: uncaught {e}"))
            page.goto(page_html.path.as_uri())
            page.wait_for_function("() => window.MathJax && MathJax.Hub && MathJax.Hub.queue.pending === 0 "
                                   "&& MathJax.Hub.queue.running === 0 && document.readyState === 'complete'",
                                   timeout=60_000)
            if has_math(book["source"], name):
                assert page.locator(".MathJax, .MathJax_Display").count() > 0, f"{name}: math not typeset"
                assert page.locator(".MathJax_Error, .merror").count() == 0, f"{name}: a formula failed"
            images = page.locator("img")
            for i in range(images.count()):
                assert images.nth(i).evaluate("img => img.complete && img.naturalWidth > 0"), f"{name}: img {i}"
            solution = page.locator("details.book-solution").first
            if solution.count():
                assert not solution.evaluate("d => d.open"), f"{name}: a solution is open"
                solution.locator("summary").click()
                assert solution.evaluate("d => d.open") and solution.locator("pre").first.is_visible()
            page.close()
        context.close()
    assert not outside, f"requests to the internet: {sorted(set(outside))[:10]}"
    assert not errors, f"browser console errors: {errors[:10]}"


def test_building_leaves_the_checkout_clean(book):
    """Building executes every notebook in place (interpreter mode): nothing tracked may change (issue 16)."""
    if book["source"] == ROOT or os.environ.get("FLASHATTN_BOOK_DIR"):
        pytest.skip("built from the working tree or elsewhere: only a fresh checkout shows what the build wrote")
    changed = _git("status", "--porcelain", "--untracked-files=all", cwd=book["source"])
    assert changed == "", f"building the book changed the checkout:\n{changed}"


def test_book_size_and_time_are_reported(book):
    info = book["info"]
    assert 0 < info["bytes"] < 100e6, "the book should be a few MB"
    assert set(info["execute_seconds"]) == {path.stem for path in notebooks(book["source"])}
