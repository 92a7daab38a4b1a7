"""Estimate the minutes a learner needs for each notebook (the table in notebooks/README.md).

    python tools/estimate_minutes.py            # executes every notebook here (a few minutes), prints the table
    python tools/estimate_minutes.py 05 07      # only these notebooks (by number: 01 and 01b are two)

It is an estimate from what each notebook contains, not an observation of learners. Each notebook is executed
here (in the mode this machine is in) and measured:

* prose: the words of its Markdown cells, read at WORDS_PER_MIN;
* code: the non-comment lines of its code cells (collapsed worked solutions excluded), read at CODE_LINES_PER_MIN;
* output: the lines its cells print, read at OUTPUT_LINES_PER_MIN, and MIN_PER_FIGURE per figure;
* exercises: a Triton exercise (its worked solution is a ``@triton.jit`` function) takes TRITON_READ_MIN to
  read the prompt and the stub, plus TRITON_MIN_PER_LINE for each line of the solution's bodies (the lines the
  learner writes, comments and blank lines left out): writing a line of Triton, running the check and mending
  what it names. The rate comes from the one observation there is (issue 29): a learner new to Triton needs
  30 to 60 minutes for notebook 05's whole v2 kernel, 31 such lines, which 5 + 1.5 per line puts at 51. Every
  other exercise (a Python function or a prediction) takes EXERCISE_MIN;
* execution: the wall-clock seconds the notebook took to execute here.
"""

from __future__ import annotations

import ast
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
EXERCISE_MIN = 8
TRITON_READ_MIN = 5
TRITON_MIN_PER_LINE = 1.5


def written_lines(source: str) -> int:
    """The lines of the function bodies in a worked solution's cell: what the learner writes (docstrings,
    comments and blank lines left out; the signatures are the stub's)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    count = 0
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
            else node.body
        for line in lines[body[0].lineno - 1:node.end_lineno]:
            if line.strip() and not line.strip().startswith("#"):
                count += 1
    return count


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
    counts = {"words": 0, "code_lines": 0, "output_lines": 0, "figures": 0, "exercises": 0, "exec_s": seconds,
              "triton_lines": []}
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            counts["words"] += len(text.split())
            counts["exercises"] += len(re.findall(r"^#+ .*\bExercise\b", text, flags=re.MULTILINE))
        elif cell["cell_type"] == "code" and "solution" in cell.get("metadata", {}).get("tags", []):
            if "@triton.jit" in text:
                counts["triton_lines"].append(written_lines(text))
        elif cell["cell_type"] == "code":
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


def triton_minutes(lines: int) -> float:
    """The minutes a Triton exercise whose solution has ``lines`` written lines takes."""
    return TRITON_READ_MIN + TRITON_MIN_PER_LINE * lines


def minutes(c: dict) -> dict:
    triton = c["triton_lines"][:c["exercises"]]
    parts = {"reading": c["words"] / WORDS_PER_MIN + c["code_lines"] / CODE_LINES_PER_MIN
             + c["output_lines"] / OUTPUT_LINES_PER_MIN + c["figures"] * MIN_PER_FIGURE,
             "exercises": sum(triton_minutes(n) for n in triton) + (c["exercises"] - len(triton)) * EXERCISE_MIN,
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
        m = minutes(c)
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
