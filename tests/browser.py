"""Shared helpers for the tests that drive headless Chromium: JupyterLab (test_browser.py) and the book
(test_book.py).

Chromium is Debian's (``apt-get install -y chromium``), driven by Playwright's Python package launched
by path: nothing downloads a browser. Where either is missing, :func:`require_chromium` skips the test
and says how to install it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("FLASHATTN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
INSTALL_HINT = ("install Debian's Chromium (as root: apt-get update && apt-get install -y chromium) and "
                "Playwright's Python package (pip install -e '.[test]'; no browser download is needed)")
# Flags for a closed network: without the background-networking ones, Chromium keeps trying to reach
# Google's hosts and its refused connections clutter the log.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update", "--disable-extensions"]
WIDGET_MANAGER = "@jupyter-widgets/jupyterlab-manager"
WIDGET_CALL = re.compile(r"^(?:\w+\.)?\w+_widget\(.*\)$")  # a cell whose last line displays a widget


def widget_cells(path: Path) -> list[int]:
    """Indices of the cells of a notebook that display a widget (``flashattn.teaching.widgets``)."""
    cells = json.loads(path.read_text())["cells"]
    last_lines = ["".join(cell["source"]).strip().splitlines()[-1:] if cell["cell_type"] == "code" else []
                  for cell in cells]
    return [i for i, last in enumerate(last_lines) if last and WIDGET_CALL.match(last[0])]


def require_chromium():
    """Playwright's sync API, or a skip that says how to install what is missing (in CI, a failure:
    .ci/run installs Chromium, so a missing browser there is a broken setup, not a reason to skip)."""
    missing = pytest.fail if os.environ.get("CI") == "true" else pytest.skip
    try:
        from playwright import sync_api
    except ImportError:
        missing(f"playwright is not installed: {INSTALL_HINT}")
    if not os.access(CHROMIUM, os.X_OK):
        missing(f"no Chromium at {CHROMIUM}: {INSTALL_HINT}")
    return sync_api


@contextmanager
def chromium():
    """A headless Chromium browser (Playwright ``Browser``), closed on exit."""
    sync_api = require_chromium()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


@contextmanager
def jupyterlab(root: Path, home: Path, *, disabled_extensions=(), timeout: float = 120.0):
    """JupyterLab serving ``root`` on 127.0.0.1 (a free port, a random token); yields ``(base_url, token)``.

    Its configuration, settings, workspaces and runtime files live under ``home`` (nothing is read from
    or written to the user's Jupyter folders). The settings turn off the news and update checks (they
    would reach the internet) and notebook windowing (every cell stays in the page, so tests can find
    them by position). ``disabled_extensions`` are turned off by page config, as
    ``jupyter labextension disable`` would.
    """
    token, port = secrets.token_hex(16), free_port()
    config, settings = home / "config", home / "settings"
    _write_json(config / "labconfig" / "page_config.json",
                {"disabledExtensions": {name: True for name in disabled_extensions}})
    _write_json(settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
                {"fetchNews": "false", "checkForUpdates": False})
    _write_json(settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings",
                {"windowingMode": "none"})
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTER_PLATFORM_DIRS": "1", "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = (home / "jupyterlab.log").open("w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"JupyterLab exited ({server.returncode}): {(home / 'jupyterlab.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"JupyterLab did not start in {timeout:.0f} s") from None
                time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
