"""Issue 17 on a GPU: every Triton exercise's worked solution through its check (compiled, not interpreted),
every untouched stub reported as 'not attempted', then as many mutants as fit in the time budget, each of
which must fail with the message naming its mistake (plus two GPU-only mutants: a float32 tl.dot left in
TF32 must be named as such).

Run from the repository root on the GPU machine:

    python tools/gpu/exercises/run_solutions.py            # solutions + stubs + mutants, at most ~3 minutes
    python tools/gpu/exercises/run_solutions.py --budget 0 # solutions and stubs only

Writes $OUT/exercises.json (one record per run: exercise, kind, ok, seconds, message) and prints a summary
table last. Each case is caught on its own, so one failure does not stop the run; a CUDA error (which
poisons the context) stops the mutants and says so.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

import flashattn  # noqa: E402, I001  (first: sets the mode before Triton is imported)
from flashattn import runtime  # noqa: E402

import test_exercise_mutants as table  # noqa: E402
from exercise_sources import definitions, load, mutate  # noqa: E402
from flashattn.exercises import ExerciseFailed  # noqa: E402

GPU_ONLY = [  # (exercise, name, old, new, message): TF32 is what a GPU does with a float32 tl.dot by default
    ("matmul", "tf32", "acc = tl.dot(a, b, acc, input_precision=PRECISION)", "acc = tl.dot(a, b, acc)", "TF32"),
    ("v2_kernel", "tf32", ("tl.dot(qi, tl.trans(kj), input_precision=PRECISION)",
                           "tl.dot(pij.to(vj.dtype), vj, acc * alpha[:, None], input_precision=PRECISION)"),
     ("tl.dot(qi, tl.trans(kj))", "tl.dot(pij.to(vj.dtype), vj, acc * alpha[:, None])"), "TF32"),
]


def run_check(check, functions):
    out = io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(out):
        try:
            result = check(*functions)
            error = None
        except ExerciseFailed as err:
            result, error = "failed", str(err)
    return result, error, out.getvalue().strip(), time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=100.0, help="seconds for mutants (after solutions)")
    args = parser.parse_args()
    print(flashattn.describe(), flush=True)
    out_dir = Path(os.environ.get("OUT", tempfile.mkdtemp()))
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    records = []

    for name, (notebook, solution, stub, check) in table.EXERCISES.items():
        for kind, names in (("solution", solution), ("stub", stub)):
            rec = dict(exercise=name, kind=kind, mutant="")
            try:
                module = load(definitions(notebook, names), tmp, f"{kind}_{name}")
                result, error, printed, seconds = run_check(check, [getattr(module, n) for n in names])
                want = kind == "solution"
                rec.update(ok=result is want, seconds=round(seconds, 2), message=error or printed)
            except Exception as err:  # keep going: one broken exercise must not hide the others
                rec.update(ok=False, seconds=None, message=f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
            records.append(rec)
            print(f"{rec['exercise']:<12} {kind:<9} {'ok' if rec['ok'] else 'FAIL':<5} {rec['seconds']}s "
                  f"{rec['message'][:150]!r}", flush=True)

    started = time.perf_counter()
    mutants = (GPU_ONLY if runtime.MODE == "gpu" else []) + table.MUTANTS
    for i, (name, mutant, old, new, message) in enumerate(mutants):
        if time.perf_counter() - started > args.budget:
            records.append(dict(exercise="(mutants)", kind="skipped", mutant=f"{len(mutants) - i} left",
                                ok=True, seconds=None, message="time budget reached"))
            break
        notebook, solution, _, check = table.EXERCISES[name]
        rec = dict(exercise=name, kind="mutant", mutant=mutant)
        try:
            module = load(mutate(definitions(notebook, solution), old, new), tmp, f"mutant_{name}_{mutant}_{i}")
            result, error, printed, seconds = run_check(check, [getattr(module, n) for n in solution])
            ok = error is not None and re.search(message, error) is not None
            rec.update(ok=ok, seconds=round(seconds, 2), message=error or f"not caught: {printed}")
        except Exception as err:
            rec.update(ok=False, seconds=None, message=f"{type(err).__name__}: {err}")
        records.append(rec)
        print(f"{name:<12} mutant {mutant:<24} {'ok' if rec['ok'] else 'FAIL':<5} {rec['seconds']}s", flush=True)
        if "CUDA error" in rec["message"] or "illegal memory access" in rec["message"]:
            records.append(dict(exercise="(mutants)", kind="stopped", mutant=mutant, ok=False, seconds=None,
                                message="a CUDA error poisons the context: the remaining mutants were not run"))
            break

    (out_dir / "exercises.json").write_text(json.dumps(dict(describe=flashattn.describe(), mode=runtime.MODE,
                                                            records=records), indent=1))
    print("\nexercise     kind      mutant                    ok    seconds  message")
    for r in records:
        print(f"{r['exercise']:<12} {r['kind']:<9} {r['mutant']:<25} {'ok' if r['ok'] else 'FAIL':<5} "
              f"{str(r['seconds']):>7}  {r['message'].splitlines()[0][:70] if r['message'] else ''}")
    bad = [r for r in records if not r["ok"]]
    solutions = [r for r in records if r["kind"] == "solution"]
    print(f"\n{sum(r['ok'] for r in solutions)}/{len(solutions)} solutions pass; "
          f"{sum(r['ok'] for r in records if r['kind'] == 'mutant')}/{sum(r['kind'] == 'mutant' for r in records)} "
          f"mutants named; {len(bad)} failure(s); mode {runtime.MODE}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
