"""Test settings shared by every test file, and what the GPU suite needs to be practical (``make gpu-test``).

* pytest-xdist workers (``pytest -n 12``; ``make gpu-test`` uses three quarters of the cores, at most 12): with several
  GPUs each worker is pinned to one of them in turn through ``CUDA_VISIBLE_DEVICES``, set here before anything
  imports torch; with one GPU they share it (most of the suite's time is compiling kernels on the CPU).
* ``--gpu-part K/N``: run the K-th of N parts of the suite (whole test files, balanced by the seconds
  ``tests/gpu_durations.json`` records per file, or by their number of tests where it has none), so that
  the GPU suite can run as shorter runs: ``make gpu-test PART=1`` then ``PART=2``.
* ``--record-durations PATH``: write the seconds each test file took (the input of ``--gpu-part``).
"""

import json
import os
import subprocess
from pathlib import Path

DURATIONS = Path(__file__).with_name("gpu_durations.json")


def _gpu_ids() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES, else nvidia-smi's list (which does not start CUDA)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def _pin_xdist_worker_to_a_gpu() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... (set by xdist before this file loads)
    gpus = _gpu_ids() if worker else []
    if len(gpus) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[int(worker.removeprefix("gw")) % len(gpus)]


_pin_xdist_worker_to_a_gpu()  # before torch: CUDA reads CUDA_VISIBLE_DEVICES when it starts

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# before any test file imports triton: without a GPU, flashattn.runtime sets TRITON_INTERPRET, which Triton reads when
# it makes its own jit functions (tl.max, ...); a test file that imports triton first would otherwise change what the
# test files after it see (three exercise mutants failed after tests/test_triton_compat.py)
import flashattn  # noqa: E402,F401

# Kernels run in Triton's CPU interpreter in CI: few, slow examples. FLASHATTN_EXAMPLES raises the count.
settings.register_profile(
    "course",
    max_examples=int(os.environ.get("FLASHATTN_EXAMPLES", "6")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
    print_blob=True,
)
settings.load_profile("course")


def pytest_addoption(parser):
    parser.addoption("--gpu-part", metavar="K/N", help="run the K-th of N parts of the suite (whole files, "
                     "balanced by tests/gpu_durations.json)")
    parser.addoption("--record-durations", metavar="PATH", help="write the seconds each test file took as JSON")


_seconds_per_file: dict[str, float] = {}  # seconds per test file, in the controlling process
_config_holder: dict = {}  # where --record-durations writes them


def pytest_configure(config):
    config.addinivalue_line("markers", "clean_clone: executes every notebook in a fresh copy of the repository")
    durations = config.getoption("--record-durations")
    _config_holder["durations"] = Path(durations) if durations else None


def _parse_part(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--gpu-part takes K/N (e.g. 1/2), got {text!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--gpu-part {text}: need 1 <= K <= N")
    return k, n


def split_files(weights: dict[str, float], parts: int) -> list[list[str]]:
    """Files into ``parts`` groups of similar total weight: heaviest first, each into the lightest group
    (ties by name, so every worker and every run makes the same split)."""
    groups, totals = [[] for _ in range(parts)], [0.0] * parts
    for name in sorted(weights, key=lambda f: (-weights[f], f)):
        i = min(range(parts), key=lambda j: (totals[j], j))
        groups[i].append(name)
        totals[i] += weights[name]
    return groups


def pytest_collection_modifyitems(config, items):
    part = config.getoption("--gpu-part")
    if not part:
        return
    k, n = _parse_part(part)
    files: dict[str, int] = {}
    for item in items:
        name = item.nodeid.split("::")[0]
        files[name] = files.get(name, 0) + 1
    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    known = [recorded[f] for f in files if f in recorded]
    per_test = sum(known) / sum(files[f] for f in files if f in recorded) if known else 1.0
    weights = {f: recorded.get(f, count * per_test) for f, count in files.items()}
    keep = set(split_files(weights, n)[k - 1])
    selected = [item for item in items if item.nodeid.split("::")[0] in keep]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid.split("::")[0] not in keep])
    items[:] = selected


def pytest_runtest_logreport(report):
    # called in the controlling process for every phase (setup, call, teardown) of every test, also under xdist;
    # written as it goes, so that a run stopped by a time limit still says which files were slow
    name = report.nodeid.split("::")[0]
    _seconds_per_file[name] = _seconds_per_file.get(name, 0.0) + report.duration
    if report.when == "teardown":
        _write_durations()


def pytest_sessionfinish(session):
    _write_durations()


def _write_durations() -> None:
    path = _config_holder.get("durations")
    if path and not os.environ.get("PYTEST_XDIST_WORKER") and _seconds_per_file:
        old = json.loads(path.read_text()) if path.exists() else {}
        merged = {**old, **{f: round(s, 1) for f, s in _seconds_per_file.items()}}  # a part updates its own files
        path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")


def pytest_terminal_summary(terminalreporter):
    """The compile-check table (tests/test_compile_targets.py), where CI's log shows it."""
    table = Path(__file__).resolve().parent.parent / "build" / "compile_targets.md"
    if table.exists() and not os.environ.get("PYTEST_XDIST_WORKER") and table.stat().st_mtime > _STARTED:
        terminalreporter.write_sep("=", "kernels compiled for each GPU target (build/compile_targets.md)")
        terminalreporter.write_line(table.read_text())


_STARTED = __import__("time").time()
