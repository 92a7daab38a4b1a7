"""The ring-merge exercise of notebook 16: the solution passes, the stub is 'not attempted', each mutant is named."""

import re

import pytest
from exercise_sources import definitions, load, mutate

from flashattn.exercises import ExerciseFailed
from flashattn.exercises.ring import check_merge_step

NOTEBOOK = "16_across_devices"
SOLUTION = definitions(NOTEBOOK, ("my_merge_step_solution",))
STUB = definitions(NOTEBOOK, ("my_merge_step",))
LSE = "lse_new = m + torch.log(torch.exp(lse - m) + torch.exp(lse_j - m))"
OUT = "o_new = torch.exp(lse - lse_new)[..., None] * o + torch.exp(lse_j - lse_new)[..., None] * o_j.float()"

MUTANTS = [  # (mutant, text in the solution, its replacement, what the check must say)
    ("no_max", "m = torch.maximum(lse, lse_j)", "m = torch.zeros_like(lse)", "subtract the max first"),
    ("no_rescale", OUT, "o_new = o + o_j.float()", "added without their weights"),
    ("equal_weights", OUT, "o_new = (o + o_j.float()) / 2", "averaged with equal weights"),
    ("weights_swapped", OUT, "o_new = torch.exp(lse_j - lse_new)[..., None] * o + torch.exp(lse - lse_new)[..., None] "
     "* o_j.float()", "weights are swapped"),
    ("weights_against_max", OUT, "o_new = torch.exp(lse - m)[..., None] * o + torch.exp(lse_j - m)[..., None] "
     "* o_j.float()", "not divided by the union's sum"),
    ("half_precision_result", "return o_new, lse_new", "return o_new.to(o_j.dtype), lse_new",
     "keep the running output"),
    ("half_precision_merge", OUT, "o_new = (torch.exp(lse - lse_new)[..., None] * o.half() + torch.exp(lse_j - lse_new)"
     "[..., None].half() * o_j).float()", "size of float16 rounding"),
    ("lse_sign", LSE, LSE.replace("m + torch.log", "m - torch.log"), "wrong sign of the log"),
    ("lse_is_max", LSE, "lse_new = m", "lse_new is just the max"),
    ("lse_not_updated", "return o_new, lse_new", "return o_new, lse", "lse_new is the old lse"),
    ("lse_added", "return o_new, lse_new", "return o_new, lse + lse_j", "log-sum-exps do not add"),
    ("swapped_return", "return o_new, lse_new", "return lse_new, o_new", r"did you return \(lse, o\)"),
    ("not_a_tuple", "return o_new, lse_new", "return o_new", "return a tuple"),
]


def test_solution_passes(tmp_path, capsys):
    assert check_merge_step(load(SOLUTION, tmp_path, "ring_merge_solution").my_merge_step_solution) is True
    assert "passed" in capsys.readouterr().out


def test_stub_is_not_attempted(tmp_path, capsys):
    assert check_merge_step(load(STUB, tmp_path, "ring_merge_stub").my_merge_step) is False
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize("name, old, new, message", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutant_is_named(tmp_path, name, old, new, message):
    fn = load(mutate(SOLUTION, old, new), tmp_path, f"ring_merge_{name}").my_merge_step_solution
    with pytest.raises(ExerciseFailed) as err:
        check_merge_step(fn)
    assert re.search(message, str(err.value)), str(err.value)
