"""No check crashes on a wrong answer: each is fed small random perturbations of its worked solution (a seeded
family: a constant changed, a comparison or an operator flipped, a tile's axes swapped, a value rounded to
float16, a statement dropped), and whatever the perturbed function computes, the check ends in its success
line, in ExerciseFailed with a message, or in the learner's own error (their traceback) — never an error from
inside the package.

FLASHATTN_PERTURBATIONS sets how many perturbations each check gets (3 by default: every new kernel is also
compiled for a GPU, a second or two each).
"""

from __future__ import annotations

import ast
import io
import os
import random
from contextlib import redirect_stdout

import pytest
from exercise_sources import definitions, load
from test_exercise_mutants import EXERCISES

from flashattn.exercises import ExerciseFailed
from flashattn.exercises.backward import check_ds_step
from flashattn.exercises.flash import check_flash_v1_step

CHECKS = {name: (notebook, solution, check) for name, (notebook, solution, _, check) in EXERCISES.items()}
CHECKS["ds_step"] = ("12_backward_pass", ("my_ds_step_solution",), check_ds_step)
CHECKS["flash_v1_step"] = ("04_flashattention_v1", ("my_flash_v1_step_solution",), check_flash_v1_step)
PER_CHECK = int(os.environ.get("FLASHATTN_PERTURBATIONS", "3"))
FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Add: ast.Sub, ast.Sub: ast.Add,
         ast.Mult: ast.Div, ast.Div: ast.Mult}


def _bodies(tree):
    return [stmt for fn in tree.body if isinstance(fn, ast.FunctionDef) for stmt in fn.body]


def _nodes(tree, kind):
    return [n for stmt in _bodies(tree) for n in ast.walk(stmt) if isinstance(n, kind)]


def perturb(source: str, rng: random.Random) -> tuple[str, str]:
    """(what was changed, the perturbed source): one small change at a random place of the function bodies."""
    tree = ast.parse(source)
    for _ in range(20):
        kind = rng.choice(("constant", "flip", "axes", "round", "drop"))
        if kind == "constant":
            found = [n for n in _nodes(tree, ast.Constant) if isinstance(n.value, (int, float))
                     and not isinstance(n.value, bool)]
            if found:
                node = rng.choice(found)
                old = node.value
                node.value = old + 1 if isinstance(old, int) else old * 1.5 + 0.5
                return f"constant {old!r} -> {node.value!r}", ast.unparse(tree)
        elif kind == "flip":
            found = [n for n in _nodes(tree, (ast.BinOp, ast.Compare))
                     if type(n.op if isinstance(n, ast.BinOp) else n.ops[0]) in FLIPS]
            if found:
                node = rng.choice(found)
                if isinstance(node, ast.BinOp):
                    node.op = FLIPS[type(node.op)]()
                else:
                    node.ops[0] = FLIPS[type(node.ops[0])]()
                return f"operator flipped at {ast.unparse(node)}", ast.unparse(tree)
        elif kind == "axes":
            found = [n for n in _nodes(tree, ast.Subscript) if isinstance(n.slice, ast.Tuple) and len(n.slice.elts) == 2
                     and {type(e) for e in n.slice.elts} == {ast.Slice, ast.Constant}]
            if found:
                node = rng.choice(found)
                node.slice.elts.reverse()
                return f"axes swapped at {ast.unparse(node)}", ast.unparse(tree)
        elif kind == "round":
            found = [n for n in _nodes(tree, ast.Assign) if isinstance(n.value, (ast.BinOp, ast.Call))]
            if found and "tl." in source:
                node = rng.choice(found)
                node.value = ast.parse(f"({ast.unparse(node.value)}).to(tl.float16).to(tl.float32)").body[0].value
                return f"rounded to float16: {ast.unparse(node)}", ast.unparse(tree)
        else:
            for fn in (f for f in tree.body if isinstance(f, ast.FunctionDef)):
                droppable = [s for s in fn.body[:-1] if isinstance(s, (ast.Assign, ast.AugAssign, ast.If))]
                if droppable:
                    stmt = rng.choice(droppable)
                    fn.body.remove(stmt)
                    return f"dropped: {ast.unparse(stmt).splitlines()[0]}", ast.unparse(tree)
    raise AssertionError("no perturbation found")


CASES = [(name, i) for name in sorted(CHECKS) for i in range(PER_CHECK)]


@pytest.mark.parametrize("name, i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_a_perturbed_solution_ends_in_a_message(name, i, tmp_path):
    notebook, solution, check = CHECKS[name]
    rng = random.Random(f"{name}-{i}")
    change, source = perturb(definitions(notebook, solution), rng)
    module = load(source, tmp_path, f"perturbed_{name}_{i}")
    try:
        with redirect_stdout(io.StringIO()) as out:
            result = check(*[getattr(module, n) for n in solution])
    except ExerciseFailed as err:
        assert str(err).strip(), change
        assert "the check stopped on an error of its own" not in str(err), f"{change}: {err}"
        return
    except Exception as err:  # the learner's own Python function raised: their traceback, not the package's
        assert getattr(err, "_raised_by_the_learner", False), f"{change}: the check raised {err!r}"
        return
    assert result is True and "passed" in out.getvalue(), (change, result, out.getvalue())
