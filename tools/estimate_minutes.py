"""Estimate the minutes a learner needs for each notebook (the table in notebooks/README.md).

    python tools/estimate_minutes.py            # executes every notebook here (a few minutes), prints the table
    python tools/estimate_minutes.py 05 07      # only these notebooks (by number: 01 and 01b are two)

It is an estimate from what each notebook contains, not an observation of learners. Each notebook is executed
here (in the mode this machine is in) and measured:

* prose: the words of its Markdown cells, read at WORDS_PER_MIN;
* code: the non-comment lines of its code cells (collapsed worked solutions excluded), read at CODE_LINES_PER_MIN;
* output: the lines its cells print, read at OUTPUT_LINES_PER_MIN, and MIN_PER_FIGURE per figure;
* exercises: EXERCISE_MIN[kind] per exercise, a Triton kernel exercise (a stub ``@triton.jit`` function the
  learner completes: TRITON_EXERCISES) or another one (a Python function or a prediction);
* execution: the wall-clock seconds the notebook took to execute here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS_PER_MIN = 150  # careful reading of technical prose with formulas and tables
CODE_LINES_PER_MIN = 20
OUTPUT_LINES_PER_MIN = 30
MIN_PER_FIGURE = 1.0
EXERCISE_MIN = {"triton": 15, "other": 8}
# Triton kernel exercises per notebook (the others are Python functions or predictions): the exercises of
# tests/test_exercise_mutants.py, and notebook 12's dS step
TRITON_EXERCISES = {"01": 2, "01b": 2, "02": 1, "04": 1, "05": 1, "06": 1, "12": 1, "15": 1}


def measure(path: Path) -> dict:
    """Execute the notebook (into a temporary file) and count what a learner reads, runs and writes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / path.name
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                               str(path), "--ExecutePreprocessor.timeout=900", "--output", str(out)],
                              capture_output=True, text=True, cwd=path.parent)
        seconds = time.time() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{path.name} failed to execute:\n{proc.stderr[-2000:]}")
        cells = json.loads(out.read_text())["cells"]
    counts = {"words": 0, "code_lines": 0, "output_lines": 0, "figures": 0, "exercises": 0, "exec_s": seconds}
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            counts["words"] += len(text.split())
            counts["exercises"] += len(re.findall(r"^#+ .*\bExercise\b", text, flags=re.MULTILINE))
        elif cell["cell_type"] == "code" and "solution" not in cell.get("metadata", {}).get("tags", []):
            counts["code_lines"] += sum(1 for line in text.splitlines()
                                        if line.strip() and not line.strip().startswith("#"))
            for output in cell.get("outputs", []):
                if "text" in output:
                    counts["output_lines"] += len("".join(output["text"]).splitlines())
                data = output.get("data", {})
                if "image/png" in data:
                    counts["figures"] += 1
                elif "text/plain" in data:
                    counts["output_lines"] += len("".join(data["text/plain"]).splitlines())
    return counts


def notebook_number(path: Path) -> str:
    """A notebook's number, what comes before the first underscore: ``01``, ``01b``."""
    return path.name.split("_", 1)[0]


def minutes(number: str, c: dict) -> dict:
    triton = min(TRITON_EXERCISES.get(number, 0), c["exercises"])
    parts = {"reading": c["words"] / WORDS_PER_MIN + c["code_lines"] / CODE_LINES_PER_MIN
             + c["output_lines"] / OUTPUT_LINES_PER_MIN + c["figures"] * MIN_PER_FIGURE,
             "exercises": triton * EXERCISE_MIN["triton"] + (c["exercises"] - triton) * EXERCISE_MIN["other"],
             "execution": c["exec_s"] / 60}
    parts["total"] = sum(parts.values())
    return parts


GUIDE = ROOT / "notebooks" / "README.md"
START, END = "<!-- minutes table: written by tools/estimate_minutes.py --write -->", "<!-- end of minutes table -->"


def table(paths: list[Path]) -> list[str]:
    lines = ["| notebook | words | code lines | printed lines | figures | exercises | executes here | reading | "
             "exercises | total (min) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    print("\n".join(lines), flush=True)
    total = 0.0
    for path in paths:
        c = measure(path)
        m = minutes(notebook_number(path), c)
        total += m["total"]
        lines.append(f"| {path.stem} | {c['words']} | {c['code_lines']} | {c['output_lines']} | {c['figures']} | "
                     f"{c['exercises']} | {c['exec_s']:.0f} s | {m['reading']:.0f} | {m['exercises']:.0f} | "
                     f"**{5 * round(m['total'] / 5)}** |")
        print(lines[-1], flush=True)
    lines += ["", f"Total: {total / 60:.1f} hours."]
    print(lines[-1])
    return lines


def write_into_guide(lines: list[str]) -> None:
    """Replace the table between the START and END markers of notebooks/README.md."""
    text = GUIDE.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{GUIDE} has no {START!r} ... {END!r} markers")
    head, rest = text.split(START, 1)
    GUIDE.write_text(head + START + "\n" + "\n".join(lines) + "\n" + END + rest.split(END, 1)[1])
    print(f"wrote the table into {GUIDE.relative_to(ROOT)}")


def main(argv: list[str]) -> int:
    write = "--write" in argv
    numbers = [a for a in argv if a != "--write"]
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if numbers:
        if write:
            raise SystemExit("--write rewrites the whole table: run it without notebook numbers")
        paths = [p for p in paths if notebook_number(p) in numbers]
    lines = table(paths)
    if write:
        write_into_guide(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
