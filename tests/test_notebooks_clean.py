"""Running every notebook leaves the repository as it was (issue 16): notebooks show their figures inline and
write nothing tracked; the committed figures are rebuilt on purpose by ``make figures``.

The repository's files (tracked, and untracked ones git does not ignore: what the next commit holds) are
copied into a fresh git repository, every notebook is executed there by nbmake with that copy's
``flashattn`` on the path, and ``git status --porcelain`` must then be empty. In whatever mode this runs:
on a GPU the notebooks take their live paths, which once saved measurements over committed figures.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
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
    run = subprocess.run([sys.executable, "-m", "pytest", "--nbmake", "--nbmake-timeout=900", "-q",
                          "-p", "no:cacheprovider", *(["-n", str(workers)] if workers > 1 else []), *notebooks],
                         cwd=clone, env=env, capture_output=True, text=True)
    assert run.returncode == 0, f"a notebook failed:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    changed = _git("status", "--porcelain", "--untracked-files=all", cwd=clone)
    assert changed == "", f"executing the notebooks changed the repository:\n{changed}"
