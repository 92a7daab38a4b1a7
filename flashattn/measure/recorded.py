"""Recorded GPU results, as written by ``python -m flashattn.record`` into ``figures/data/``.

In interpreter mode these are what the notebooks show for timings and hardware numbers; each one
carries its provenance (GPU, driver, CUDA, torch, Triton, date, command).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flashattn.runtime import REPO_ROOT

# FLASHATTN_DATA_DIR points elsewhere (e.g. a draft of new measurements); the default is the repository's.
DATA_DIR = Path(os.environ.get("FLASHATTN_DATA_DIR") or REPO_ROOT / "figures" / "data")


def files(data_dir: Path | None = None) -> list[Path]:
    return sorted((data_dir or DATA_DIR).glob("*.json"))


def load(gpu: str | None = None, data_dir: Path | None = None) -> dict:
    """The recorded file for ``gpu`` (a substring of its name, case-insensitive), or the first one."""
    paths = files(data_dir)
    if not paths:
        raise FileNotFoundError(
            f"no recorded GPU results in {data_dir or DATA_DIR}; run `python -m flashattn.record` on a GPU"
        )
    docs = [json.loads(p.read_text()) for p in paths]
    if gpu is None:
        return docs[0]
    for doc in docs:
        if gpu.lower() in doc["provenance"]["gpu"].lower():
            return doc
    names = ", ".join(d["provenance"]["gpu"] for d in docs)
    raise KeyError(f"no recorded results for GPU {gpu!r}; recorded: {names}")


def get(name: str, gpu: str | None = None, data_dir: Path | None = None) -> dict:
    """One recorded measurement by name, with the file's provenance attached under 'provenance'."""
    doc = load(gpu, data_dir)
    if name not in doc["measurements"]:
        have = ", ".join(sorted(doc["measurements"]))
        raise KeyError(f"measurement {name!r} not recorded for {doc['provenance']['gpu']}; recorded: {have}")
    return {**doc["measurements"][name], "provenance": doc["provenance"]}


def find(name: str, gpu: str | None = None, data_dir: Path | None = None) -> dict | None:
    """:func:`get`, or None when nothing is recorded under ``name`` (or no file is there at all)."""
    try:
        return get(name, gpu=gpu, data_dir=data_dir)
    except (KeyError, FileNotFoundError):
        return None


def number(value) -> float | None:
    """A recorded or parsed value as a float: ints, floats, numeric strings ("1980", "1,234,567") and
    ``{"value": ..., "unit": ...}`` pairs are numbers; None, booleans, "[N/A]" and anything else are None
    (a metric that was not collected, a clock nvidia-smi could not read)."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().replace(",", ""))
        except ValueError:
            return None
    return None


def label(entry: dict) -> str:
    """A one-line caption: where and when a recorded result was measured."""
    p = entry["provenance"]
    when = entry.get("recorded_at", p["date"])[:10]
    return (
        f"recorded on {p['gpu']} ({when}; torch {p['torch']}, Triton {p['triton']}, CUDA {p['cuda']}, "
        f"driver {p['driver']})"
    )
