"""Record GPU measurements into ``figures/data/<gpu>.json``, with provenance.

    python -m flashattn.record                 # every registered measurement
    python -m flashattn.record --only device naive_memory
    python -m flashattn.record --list

A measurement is a function registered with ``@measurement("name")`` that returns a JSON-able dict
(it should say its sizes, dtype and precision). Later modules register theirs the same way; the
modules that hold measurements are listed in ``MEASUREMENT_MODULES``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from flashattn import runtime
from flashattn.measure.measurements import MODULES as _MEASUREMENT_NAMES
from flashattn.measure.recorded import DATA_DIR

REGISTRY: dict[str, dict] = {}
# Measurements registered but not yet recorded on a GPU, with the issue that records them: the notebooks that read
# one print that it is not recorded yet. tests/test_record.py checks that each is still missing from figures/data/
# (so that this list only shrinks) and that every other registered measurement is there.
PENDING: dict[str, str] = {}
MEASUREMENT_MODULES = [f"flashattn.measure.measurements.{name}" for name in _MEASUREMENT_NAMES]


def measurement(name: str, *, description: str):
    """Register ``fn() -> dict`` as the measurement ``name``."""

    def register(fn):
        if name in REGISTRY and REGISTRY[name]["fn"] is not fn:
            raise ValueError(f"measurement {name!r} is registered twice")
        REGISTRY[name] = {"fn": fn, "description": description}
        return fn

    return register


def load_measurements() -> dict[str, dict]:
    for module in MEASUREMENT_MODULES:
        importlib.import_module(module)
    return REGISTRY


def nvidia_smi(query: str) -> str | None:
    """One field of ``nvidia-smi --query-gpu`` (e.g. ``driver_version``), or None where it cannot answer."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def provenance(command: str) -> dict:
    import triton

    return {
        "gpu": runtime.gpu_name() or "none",
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if runtime.HAS_GPU else None,
        "driver": (nvidia_smi("driver_version") or "unknown") if runtime.HAS_GPU else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
    }


def slug(gpu_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "unknown"


def run(names: list[str] | None = None, out_dir: Path = DATA_DIR, command: str = "") -> Path:
    """Run the named measurements (all if None) and merge them into the GPU's JSON file."""
    registry = load_measurements()
    names = list(registry) if not names else names
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ValueError(f"unknown measurement(s) {', '.join(unknown)}; registered: {', '.join(registry)}")
    prov = provenance(command or " ".join(["python -m flashattn.record", *sys.argv[1:]]))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{slug(prov['gpu'])}.json"
    doc = json.loads(path.read_text()) if path.exists() else {"measurements": {}}
    doc["provenance"] = prov
    for name in names:
        t0 = time.perf_counter()
        print(f"[record] {name}: {registry[name]['description']}", flush=True)
        result = registry[name]["fn"]()
        result["recorded_at"] = prov["date"]
        doc["measurements"][name] = result
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")  # keep partial progress
        print(f"[record] {name}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


def command_line(prog: str, description: str, what: str, default_out: Path) -> argparse.ArgumentParser:
    """The options of a command that writes registered things into a folder (this module's, and
    ``python -m flashattn.teaching.figures``): ``--only NAME ...``, ``--out DIR``, ``--list``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"{what} to write (default: all)")
    parser.add_argument("--out", type=Path, default=default_out, help=f"output folder (default {default_out})")
    parser.add_argument("--list", action="store_true", help=f"list the registered {what} and exit")
    return parser


def main(argv=None) -> int:
    parser = command_line("python -m flashattn.record", __doc__.splitlines()[0], "measurements", DATA_DIR)
    args = parser.parse_args(argv)
    registry = load_measurements()
    if args.list:
        for name, entry in registry.items():
            print(f"{name:24s} {entry['description']}")
        return 0
    if runtime.MODE != "gpu":
        print("flashattn.record measures a GPU, and none is in use here (" + runtime.describe() + ").\n"
              "Run it on a machine with a CUDA GPU; the notebooks read the files it writes.", file=sys.stderr)
        return 2
    path = run(args.only, args.out)
    print(f"[record] wrote {path}")
    return 0


if __name__ == "__main__":
    # Run through the imported module so that measurements register into one REGISTRY.
    from flashattn.record import main as _main

    sys.exit(_main())
