"""The dS-step exercise of notebook 12: the worked solution passes, the untouched stub is 'not attempted', and
each mutant (the solution with one classic mistake written in) fails with the message naming that mistake.

The stub and the solution are read from the notebook, so what is tested is what the learner sees.
"""

from __future__ import annotations

import re
import time

import pytest
from exercise_sources import definitions, load, mutate

from flashattn.exercises import ExerciseFailed
from flashattn.exercises.backward import check_ds_step

NOTEBOOK = "12_backward_pass"
SOLUTION = definitions(NOTEBOOK, ("my_ds_step_solution",))
STUB = definitions(NOTEBOOK, ("my_ds_step",))

# (mutant, text in the solution, its replacement, what the check must say)
MUTANTS = [
    ("no_delta", "dsij = pij * (dpij - delta_i[:, None])", "dsij = pij * dpij", r"left out the − delta_i"),
    ("sign_flipped", "dsij = pij * (dpij - delta_i[:, None])", "dsij = pij * (delta_i[:, None] - dpij)",
     "sign of dS is flipped"),
    ("scores_for_p", "dsij = pij * (dpij", "dsij = sij * (dpij", "scores sij where the probabilities belong"),
    ("no_scale", "input_precision=PRECISION) * scale", "input_precision=PRECISION)", "the scale is missing"),
    ("exp2_natural_log", "pij = tl.exp(sij", "pij = tl.exp2(sij", "exp2 on natural-log quantities"),
    ("lse_wrong_row", "lse_i[:, None]", "lse_i[None, :]", "lse comes from the wrong row"),
    ("delta_wrong_row", "delta_i[:, None]", "delta_i[None, :]", "delta comes from the wrong row"),
    ("softmax_in_tile", "pij = tl.exp(sij - lse_i[:, None])",
     "pij = tl.exp(sij - tl.max(sij, 1)[:, None])\n    pij = pij / tl.sum(pij, 1)[:, None]",
     "normalized P inside the tile"),
    ("causal_mask_missing", "sij = tl.where(offs_n[None, :] <= offs_m[:, None], sij, float(\"-inf\"))",
     "sij = sij", "causal mask is not applied to dS"),
    ("causal_off_by_one", "offs_n[None, :] <= offs_m[:, None]", "offs_n[None, :] < offs_m[:, None]",
     "causal mask is off by one"),
    ("masked_to_zero", "sij, float(\"-inf\"))", "sij, 0.0)", "masked scores are set to 0, not -inf"),
    ("nan_rows", "pij = tl.exp(sij - lse_i[:, None])",
     "m = tl.max(sij, 1)\n    pij = tl.exp(sij - m[:, None]) * tl.exp(m - lse_i)[:, None]",
     r"row \d+ \(head \d+\) of dS is NaN"),
    ("dp_not_transposed", "tl.dot(doi, tl.trans(vj)", "tl.dot(doi, vj",
     r"need the transpose: tl.dot\(doi, tl.trans\(vj\)\)"),
    ("no_return", "    return dsij\n", "", "return dsij"),
    # the classic dS mistakes the check tells apart (issue 29), and one it cannot: it says so, with what it knows
    ("scale_twice", "input_precision=PRECISION) * scale", "input_precision=PRECISION) * scale * scale",
     "the scale is applied twice"),
    ("scale_sqrt_d", "input_precision=PRECISION) * scale", "input_precision=PRECISION) / scale",
     r"the scale is sqrt\(D\)"),
    ("ds_scaled", "    return dsij\n", "    return dsij * scale\n", "dS is multiplied by the scale"),
    ("exp_no_statistic", "pij = tl.exp(sij - lse_i[:, None])", "pij = tl.exp(sij)", "against no statistic"),
    ("exp_plus_lse", "pij = tl.exp(sij - lse_i[:, None])", "pij = tl.exp(sij + lse_i[:, None])",
     "the log-sum-exp is added"),
    ("exp_against_delta", "pij = tl.exp(sij - lse_i[:, None])", "pij = tl.exp(sij - delta_i[:, None])",
     "taken against delta_i"),
    ("exp_against_tile_max", "pij = tl.exp(sij - lse_i[:, None])", "pij = tl.exp(sij - tl.max(sij, 1)[:, None])",
     "against the tile's own row max"),
    ("dp_tile_transposed", "tl.dot(doi, tl.trans(vj)", "tl.dot(vj, tl.trans(doi)", "dpij is the tile transposed"),
    ("s_tile_transposed", "tl.dot(qi, tl.trans(kj)", "tl.dot(kj, tl.trans(qi)", "sij is the tile transposed"),
    ("causal_reversed", "offs_n[None, :] <= offs_m[:, None]", "offs_n[None, :] >= offs_m[:, None]",
     "causal mask points the wrong way"),
    ("p_rounded", "pij = tl.exp(sij - lse_i[:, None])",
     "pij = tl.exp(sij - lse_i[:, None]).to(tl.float16).to(tl.float32)", "pij is rounded to float16"),
    ("dp_rounded", "dpij = tl.dot(doi, tl.trans(vj), input_precision=PRECISION)",
     "dpij = tl.dot(doi, tl.trans(vj), input_precision=PRECISION).to(tl.float16).to(tl.float32)",
     "dpij is rounded to float16"),
    ("cannot_tell", "    return dsij\n", "    return dsij + 0.01\n",
     r"(?s)cannot tell which mistake it is.*every element is off by the same 0.01"),
]


def _load(tmp_path, source, name):
    return getattr(load(source, tmp_path, f"ds_step_{tmp_path.name}"), name)


def test_solution_passes_within_ten_seconds(tmp_path):
    step = _load(tmp_path, SOLUTION, "my_ds_step_solution")
    start = time.perf_counter()
    assert check_ds_step(step) is True
    assert time.perf_counter() - start < 10


def test_untouched_stub_is_not_attempted(tmp_path, capsys):
    assert check_ds_step(_load(tmp_path, STUB, "my_ds_step")) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_a_python_function_is_refused():
    with pytest.raises(ExerciseFailed, match="@triton.jit"):
        check_ds_step(lambda *args: None)


@pytest.mark.parametrize("name, old, new, message", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutant_is_named(tmp_path, name, old, new, message, monkeypatch):
    if name not in ("no_return", "dp_not_transposed"):  # the ones a GPU compiler refuses first (test_exercise_mutants)
        monkeypatch.setenv("FLASHATTN_COMPILE_AHEAD", "0")
    step = _load(tmp_path, mutate(SOLUTION, old, new), "my_ds_step_solution")
    with pytest.raises(ExerciseFailed) as err:
        check_ds_step(step)
    assert re.search(message, str(err.value)), str(err.value)
