"""Running every notebook leaves the repository as it was (issue 16): notebooks show their figures inline and
write nothing tracked; the committed figures are rebuilt on purpose by ``make figures``.

The repository's files (tracked, and untracked ones git does not ignore: what the next commit holds) are
copied into a fresh git repository, every notebook is executed there by nbmake with that copy's
``flashattn`` on the path, and ``git status --porcelain`` must then be empty. In whatever mode this runs:
on a GPU the notebooks take their live paths, which once saved measurements over committed figures.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _git(*args, cwd):
    return subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args], cwd=cwd,
                          capture_output=True, text=True, check=True).stdout


def _copy_repository(dest: Path) -> None:
    for name in _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).split("\0"):
        source = ROOT / name
        if name and source.is_file():  # a file deleted but not yet staged is listed and absent
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    _git("init", "-q", cwd=dest)
    _git("add", "-A", cwd=dest)
    _git("commit", "-q", "-m", "snapshot", cwd=dest)


# what jupyter_client says when a kernel died before it could answer: another process took one of the ports it
# was given (the race in the test below)
KERNEL_NOT_STARTED = ("Kernel died before replying to kernel_info", "Address already in use")


def _nbmake(notebooks, workers: int, report: Path, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--nbmake", "--nbmake-timeout=900", "-q",
                           "-p", "no:cacheprovider", f"--junitxml={report}", "-o", "junit_logging=all",
                           *(["-n", str(workers)] if workers > 1 else []), *notebooks],
                          cwd=cwd, env=env, capture_output=True, text=True)


def _failures(report: Path) -> tuple[list[str], list[str]]:
    """The failed notebooks of a JUnit report: (those whose kernel never started, the others)."""
    unstarted, failed = [], []
    if not report.exists():
        return unstarted, failed
    for case in ET.parse(report).getroot().iter("testcase"):
        problems = [*case.iter("failure"), *case.iter("error")]
        if not problems:
            continue
        # the kernel's own stderr (the port it could not bind) is in the case's system-err: junit_logging=all
        text = " ".join([*(p.get("message") or "" for p in problems), *case.itertext()])
        name = case.get("name", "")  # nbmake's item: classname "notebooks.01_x.ipynb", name "01_x.ipynb"
        folder = case.get("classname", "")[: -len(name)].rstrip(".").replace(".", "/")
        notebook = f"{folder}/{name}" if folder else name
        (unstarted if all(mark in text for mark in KERNEL_NOT_STARTED) else failed).append(notebook)
    return unstarted, failed


@pytest.mark.clean_clone
def test_executing_every_notebook_writes_nothing_tracked(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    clone = tmp_path / "clone"
    _copy_repository(clone)
    env = dict(os.environ, PYTHONPATH=str(clone) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    where = subprocess.run([sys.executable, "-c", "import flashattn; print(flashattn.__file__)"], cwd=clone, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(clone), f"the notebooks would import {where}, not the copy's flashattn"
    notebooks = sorted(str(p.relative_to(clone)) for p in (clone / "notebooks").glob("*.ipynb"))
    assert notebooks, "no notebooks found"
    # with pytest-xdist and cores to spare (a GPU machine), 8 notebooks at a time: a workshop room on one GPU
    # (issue 29); FLASHATTN_NOTEBOOK_WORKERS overrides
    workers = int(os.environ.get("FLASHATTN_NOTEBOOK_WORKERS", min(8, (os.cpu_count() or 1) // 2)))
    if not importlib.util.find_spec("xdist"):
        workers = 0
    report = tmp_path / "notebooks.xml"
    run = _nbmake(notebooks, workers, report, clone, env)
    if run.returncode != 0:
        # A kernel that never started (another process took its port between jupyter_client choosing it and the
        # kernel binding it: nbmake#129, jupyter_client#154) says nothing about its notebook: run those again, one
        # at a time. A notebook that started and failed is not run again.
        unstarted, failed = _failures(report)
        assert not failed, f"a notebook failed:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
        assert unstarted, f"nbmake failed without a failing notebook:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
        warnings.warn(f"kernels that did not start, run again one at a time: {unstarted}", stacklevel=1)
        again = _nbmake(unstarted, 0, tmp_path / "again.xml", clone, env)
        assert again.returncode == 0, f"a notebook failed:\n{again.stdout[-4000:]}\n{again.stderr[-2000:]}"
    changed = _git("status", "--porcelain", "--untracked-files=all", cwd=clone)
    assert changed == "", f"executing the notebooks changed the repository:\n{changed}"


def test_failures_tells_a_kernel_that_never_started_from_a_failing_notebook(tmp_path):
    """Only a kernel that died before it answered is run again; a notebook that raised is a failure."""
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="notebooks.00_a.ipynb" name="00_a.ipynb"><failure message="RuntimeError">'
        "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:54653') ERROR traitlets: "
        "Kernel died before replying to kernel_info</failure></testcase>"
        '<testcase classname="notebooks.01_b.ipynb" name="01_b.ipynb"><failure message="ValueError: boom">'
        "raise ValueError('boom')</failure></testcase>"
        '<testcase classname="notebooks.02_c.ipynb" name="02_c.ipynb"><failure message="RuntimeError">'
        "Kernel died before replying to kernel_info</failure></testcase>"
        '<testcase classname="notebooks.03_d.ipynb" name="03_d.ipynb"/>'
        "</testsuite></testsuites>")
    assert _failures(report) == (["notebooks/00_a.ipynb"], ["notebooks/01_b.ipynb", "notebooks/02_c.ipynb"])


def test_a_kernel_that_dies_at_start_is_told_from_a_notebook_that_fails(tmp_path):
    """The same through nbmake: a kernel that exits at once with the port error, and a notebook that raises."""
    import nbformat

    kernel = tmp_path / "jupyter" / "kernels" / "dies"
    kernel.mkdir(parents=True)
    stderr = "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:1')"
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", f"import sys; sys.stderr.write({stderr!r}); sys.exit(1)", "{connection_file}"],
        "display_name": "dies", "language": "python"}))
    (tmp_path / "notebooks").mkdir()
    for name, code, spec in (("00_dies", "1 + 1", "dies"), ("01_raises", "raise ValueError('boom')", "python3")):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        nb.metadata["kernelspec"] = {"name": spec, "display_name": spec, "language": "python"}
        nbformat.write(nb, tmp_path / "notebooks" / f"{name}.ipynb")
    env = dict(os.environ, JUPYTER_PATH=str(tmp_path / "jupyter"))
    report = tmp_path / "r.xml"
    run = _nbmake(["notebooks/00_dies.ipynb", "notebooks/01_raises.ipynb"], 0, report, tmp_path, env)
    assert run.returncode != 0
    assert _failures(report) == (["notebooks/00_dies.ipynb"], ["notebooks/01_raises.ipynb"])
