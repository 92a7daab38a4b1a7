"""The widgets as a learner meets them: JupyterLab in headless Chromium, driven by Playwright.

For every notebook that displays a widget: copy it to a temporary folder (so nothing is autosaved into
the repository), open it in JupyterLab, run all cells, and check each widget cell: it renders as
controls (no "Error displaying widget", no widget repr text), shows exactly one figure, and after one
control is moved it shows exactly one figure, a different one. Any browser console error fails the test.

A second test shows that these checks can fail: with JupyterLab's widget manager disabled, a widget cell
falls back to its static figure, and the check says there are no controls.

Needs Debian's Chromium and Playwright's Python package (see tests/browser.py); skips without them.
``FLASHATTN_LAB_DISABLE=<extension>[,<extension>]`` disables lab extensions for the first test too,
to watch it fail, e.g. ``FLASHATTN_LAB_DISABLE=@jupyter-widgets/jupyterlab-manager``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from browser import WIDGET_MANAGER, chromium, jupyterlab, widget_cells

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
WIDGET_REPR = re.compile(r"\b\w*(Box|Widget)\(children=")  # what a widget looks like when it is not rendered
RUN_TIMEOUT_S = 300
CHANGE_TIMEOUT_S = 60
RENDER_TIMEOUT_S = 60  # for a widget cell's output to show a figure after the run
CONTROLS_GRACE_S = 5


WIDGET_NOTEBOOKS = [path for path in sorted(NOTEBOOKS.glob("*.ipynb")) if widget_cells(path)]


def test_the_widget_notebooks_are_found():
    assert WIDGET_NOTEBOOKS, "no notebook displays a widget: has the widget call changed?"
    names = {path.name for path in WIDGET_NOTEBOOKS}
    assert {"05_flashattention_v2.ipynb", "06_bank_conflicts.ipynb"} <= names


# --- driving JupyterLab ---------------------------------------------------------------------

def open_and_run(page, base: str, token: str, name: str):
    """Open a notebook in JupyterLab (in a workspace of its own), wait for its kernel, run all cells and wait
    until they are done. Returns a locator of the notebook's cells."""
    page.goto(f"{base}/lab/workspaces/{Path(name).stem}/tree/{name}?token={token}")
    page.wait_for_function("() => window.jupyterapp?.shell.currentWidget?.sessionContext", timeout=60_000)
    ok = page.evaluate("""async (timeout) => {
        const app = window.jupyterapp, panel = app.shell.currentWidget;
        await panel.context.ready;
        await panel.sessionContext.ready;
        const timer = new Promise((_, reject) => setTimeout(() => reject(new Error('run-all timed out')), timeout));
        return await Promise.race([app.commands.execute('notebook:run-all-cells'), timer]);
    }""", RUN_TIMEOUT_S * 1000)
    if ok is not True:
        errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        shown = errors.last.inner_text()[-2000:] if errors.count() else "(no error output)"
        raise AssertionError(f"{name}: a cell failed when run in JupyterLab:\n{shown}")
    panel = page.evaluate("() => window.jupyterapp.shell.currentWidget.id")
    return page.locator(f'[id="{panel}"] .jp-Notebook .jp-Cell')


def image_digest(img) -> str:
    """SHA-256 of the image an <img> shows (its src may be a blob: or data: URL)."""
    return img.evaluate("""async (img) => {
        const bytes = await (await fetch(img.src)).arrayBuffer();
        const digest = await crypto.subtle.digest('SHA-256', bytes);
        return Array.from(new Uint8Array(digest), b => b.toString(16).padStart(2, '0')).join('');
    }""")


def visible_figure(output, when: str):
    """The one visible, non-empty <img> in a cell's output area."""
    images = output.locator("img:visible")
    assert images.count() == 1, f"{when}: {images.count()} figures are visible, expected exactly one"
    assert images.first.evaluate("img => img.complete && img.naturalWidth > 0"), f"{when}: the figure is empty"
    return images.first


def check_widget_cell(page, cells, index: int, where: str) -> None:
    """The widget of cell ``index`` renders as controls with one figure, and a moved control replaces it."""
    cell = cells.nth(index)
    cell.scroll_into_view_if_needed()
    output = cell.locator(".jp-Cell-outputArea")  # the cell's own (an Output widget nests another)
    output.locator("img").first.wait_for(state="visible", timeout=RENDER_TIMEOUT_S * 1000)  # widget or fallback
    controls = output.locator(".jupyter-widgets select, .jupyter-widgets input, .jupyter-widgets .noUi-handle")
    deadline = time.monotonic() + CONTROLS_GRACE_S  # the controls render a moment after the figure
    while controls.count() == 0 and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    text = output.inner_text()
    assert "Error displaying widget" not in text, f"{where}: {text[:300]}"
    assert not WIDGET_REPR.search(text), f"{where}: the widget shows as its repr: {text[:300]}"
    assert controls.count() > 0, f"{where}: the widget did not render as controls (no widget manager?)"
    before = image_digest(visible_figure(output, f"{where}, as displayed"))

    select = output.locator(".jupyter-widgets select").first
    current = select.input_value()
    options = select.evaluate("s => Array.from(s.options, o => o.value)")
    choice = next(value for value in options if value != current)
    select.select_option(value=choice)
    deadline = time.monotonic() + CHANGE_TIMEOUT_S
    while True:
        after = image_digest(visible_figure(output, f"{where}, after choosing {choice!r}"))
        if after != before:
            break
        assert time.monotonic() < deadline, f"{where}: the figure did not change {CHANGE_TIMEOUT_S} s after " \
                                            f"choosing {choice!r} (was {current!r})"
        page.wait_for_timeout(250)
    assert "Error displaying widget" not in page.content()


def collect_console_errors(page) -> list[str]:
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    return errors


# --- the tests ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:  # one Playwright session per module: sync Playwright cannot nest
        yield browser


@pytest.fixture(scope="module")
def lab(tmp_path_factory, browser):
    root = tmp_path_factory.mktemp("notebooks")
    for path in WIDGET_NOTEBOOKS:
        shutil.copy(path, root)
    disabled = [name for name in os.environ.get("FLASHATTN_LAB_DISABLE", "").split(",") if name]
    with jupyterlab(root, tmp_path_factory.mktemp("jupyter"), disabled_extensions=disabled) as server:
        yield server


@pytest.mark.parametrize("path", WIDGET_NOTEBOOKS, ids=[p.stem for p in WIDGET_NOTEBOOKS])
def test_widgets_render_and_react_in_jupyterlab(lab, browser, path):
    base, token = lab
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = collect_console_errors(page)
    try:
        cells = open_and_run(page, base, token, path.name)
        assert cells.count() == len(json.loads(path.read_text())["cells"])
        for index in widget_cells(path):
            check_widget_cell(page, cells, index, f"{path.name} cell {index}")
        assert not errors, f"browser console errors: {errors[:5]}"
    finally:
        page.close()


def test_the_check_fails_without_the_widget_manager(tmp_path, browser):
    """The negative control: the same check on a one-widget notebook, the widget manager disabled."""
    root = tmp_path / "notebooks"
    root.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("from flashattn.teaching.widgets import "
                                                                   "traffic_widget"),
                                         nbformat.v4.new_code_cell("traffic_widget(B=1, H=2)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "widget.ipynb")
    with jupyterlab(root, tmp_path / "jupyter", disabled_extensions=[WIDGET_MANAGER]) as (base, token):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = collect_console_errors(page)
        cells = open_and_run(page, base, token, "widget.ipynb")
        assert widget_cells(root / "widget.ipynb") == [1]
        with pytest.raises(AssertionError, match="did not render as controls"):
            check_widget_cell(page, cells, 1, "widget.ipynb cell 1")
        figure = visible_figure(cells.nth(1).locator(".jp-Cell-outputArea"), "fallback")
        assert figure.get_attribute("src").startswith("data:image/png;base64,")  # the static figure instead
        assert errors, "a missing widget manager should also show as console errors"
        page.close()
