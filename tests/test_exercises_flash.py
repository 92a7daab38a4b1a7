"""The checks of notebooks 04 and 05 pass a right answer, skip a stub, and name each classic mistake."""

import math

import pytest
import torch

from flashattn.exercises import ExerciseFailed
from flashattn.exercises.flash import check_flash_v1_step, check_flash_v2


def flash_v2(q, k, v, block_n, causal, *, mistake=None):
    """A learner's v2 loop for one head, in float32, optionally with one mistake written in."""
    if mistake in ("half_inputs", "bf16_inputs"):  # rounded to 16 bits, then computed in float32
        dtype = torch.float16 if mistake == "half_inputs" else torch.bfloat16
        q, k, v = (t.to(dtype).float() for t in (q, k, v))
    N, D = q.shape
    scale = 1.0 / math.sqrt(D)
    mi = torch.full((N,), float("-inf"))
    li = torch.zeros(N)
    acc = torch.zeros(N, D)
    end = N - N % block_n if mistake == "dropped_tail" else N
    if mistake == "zero_padded_tail":  # the last block filled up with zero keys, their scores left at 0
        pad = torch.zeros((-N) % block_n, D)
        k, v, end = torch.cat([k, pad]), torch.cat([v, pad]), N + len(pad)
    for start in range(0, end, block_n):
        kj, vj = k[start:start + block_n], v[start:start + block_n]
        sij = q @ kj.T * scale
        if causal:
            key_pos = start + torch.arange(kj.shape[0])
            if mistake == "local_causal_index":
                key_pos = torch.arange(kj.shape[0])
            sij = sij.masked_fill(key_pos[None, :] > torch.arange(N)[:, None], float("-inf"))
        mij = sij.amax(-1)
        mi_new = torch.maximum(mi, mij)
        alpha = torch.exp(mi - mi_new)
        if mistake == "fa1_exponent_no_guard":
            pij = torch.exp(sij - mij[:, None])
            beta = torch.exp(mij - mi_new)
            li_new = alpha * li + beta * pij.sum(-1)
            acc = alpha[:, None] * acc + beta[:, None] * (pij @ vj)
        else:
            against = mi_new
            if mistake == "exp_old_max":
                against = mi
            elif mistake == "exp_old_max_guarded":
                against = torch.where(mi == float("-inf"), 0.0, mi)
            pij = torch.exp(sij - against[:, None])
            li_new = (li if mistake in ("missing_alpha_l", "missing_alpha_both") else alpha * li) + pij.sum(-1)
            if mistake in ("missing_alpha_acc", "missing_alpha_both"):
                acc = acc + pij @ vj
            else:
                acc = acc * alpha[:, None] + pij @ vj
        if mistake in ("divide_every_step", "divide_every_step_and_end"):
            acc = acc / li_new[:, None]
        mi, li = (mi if mistake == "max_never_updated" else mi_new), li_new
    if mistake in ("no_final_division", "divide_every_step"):
        return acc
    if mistake == "no_scale":
        return acc / li[:, None] * 1.0001 + 0.01
    return acc / li[:, None]


def flash_v1_step(qi, kj, vj, oi, li, mi, scale, *, mistake=None):
    """A learner's FA1 update, optionally with one mistake written in."""
    if mistake == "half_inputs":
        qi, kj, vj = (t.half().float() for t in (qi, kj, vj))
    sij = qi @ kj.T * scale
    mij = sij.amax(-1)
    pij = torch.exp(sij - mij[:, None])
    lij = pij.sum(-1)
    mi_new = torch.maximum(mi, mij)
    alpha = torch.ones_like(mi) if mistake == "missing_alpha" else torch.exp(mi - mi_new)
    beta = torch.exp(mij - mi_new)
    li_new = alpha * li + (lij if mistake in ("missing_beta_l", "missing_beta_both") else beta * lij)
    pv = pij @ vj if mistake in ("missing_beta_o", "missing_beta_both") else beta[:, None] * (pij @ vj)
    if mistake == "no_division":
        oi_new = alpha[:, None] * li[:, None] * oi + pv
    elif mistake == "no_undo":
        oi_new = (alpha[:, None] * oi + pv) / li_new[:, None]
    elif mistake == "old_l":
        oi_new = (alpha[:, None] * li[:, None] * oi + pv) / li[:, None]
    else:
        oi_new = (alpha[:, None] * li[:, None] * oi + pv) / li_new[:, None]
    if mistake == "shifted_state":  # a consistent state (m + 1, l / e): O stays right
        return oi_new, li_new / math.e, mi_new + 1.0
    return oi_new, li_new, mi_new


def stub(*args):
    raise NotImplementedError


def test_v2_correct_solution_passes(capsys):
    assert check_flash_v2(flash_v2) is True
    assert "passed" in capsys.readouterr().out


def test_v2_correct_solution_in_float64_passes():
    def in_float64(q, k, v, block_n, causal):
        return flash_v2(q.double(), k.double(), v.double(), block_n, causal)

    # the learner may allocate the state in float32 and receive float64 promotions: still right
    assert check_flash_v2(in_float64) is True


def test_v2_stub_is_not_attempted(capsys):
    assert check_flash_v2(stub) is False
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, expected", [
    ("missing_alpha_acc", "rescale the accumulator by alpha"),
    ("missing_alpha_l", "rescale li by alpha"),
    ("missing_alpha_both", "neither acc nor li is rescaled"),
    ("no_final_division", "divide acc by li once after the loop"),
    ("divide_every_step", "without undoing the previous division"),
    ("divide_every_step_and_end", "at every step and again at the end"),
    ("dropped_tail", "keys are never used"),
    ("fa1_exponent_no_guard", "fully masked query rows"),
    ("local_causal_index", "check the causal mask"),
    ("no_scale", "relative error"),
    # issue 17, item 5: each of these used to get a generic or a wrong message
    ("zero_padded_tail", "filled up with zero keys"),
    ("half_inputs", "rounding the inputs to float16"),
    ("bf16_inputs", "rounding the inputs to bfloat16"),
    ("exp_old_max", "every row is NaN .* running max from \\*before\\* this block"),
    ("exp_old_max_guarded", "running max from before this block"),
    ("max_never_updated", "mi is never updated"),
])
def test_v2_mistakes_are_diagnosed(mistake, expected):
    def wrong(q, k, v, block_n, causal):
        return flash_v2(q, k, v, block_n, causal, mistake=mistake)

    with pytest.raises(ExerciseFailed, match=expected):
        check_flash_v2(wrong)


def test_v2_factor_is_reported_for_missing_final_division():
    def wrong(q, k, v, block_n, causal):
        return flash_v2(q, k, v, block_n, causal, mistake="no_final_division")

    with pytest.raises(ExerciseFailed, match=r"row \d+ is off by a factor of"):
        check_flash_v2(wrong)


def test_v2_wrong_shape_is_reported():
    with pytest.raises(ExerciseFailed, match="shape"):
        check_flash_v2(lambda q, k, v, block_n, causal: flash_v2(q, k, v, block_n, causal).T)


def test_v1_correct_step_passes(capsys):
    assert check_flash_v1_step(flash_v1_step) is True
    assert "passed" in capsys.readouterr().out


def test_v1_stub_is_not_attempted(capsys):
    assert check_flash_v1_step(stub) is False
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, expected", [
    ("missing_beta_o", "multiply pij @ vj by beta"),
    ("missing_beta_l", "needs beta"),
    ("missing_beta_both", "missing from both"),
    ("missing_alpha", "rescale the old state by alpha"),
    ("no_division", "never divided by li_new"),
    ("no_undo", "multiply it back by li"),
    ("old_l", "NaN or inf"),
    ("shifted_state", "O is right but the state is not"),
    ("half_inputs", "rounding the inputs to float16"),
])
def test_v1_mistakes_are_diagnosed(mistake, expected):
    def wrong(*args):
        return flash_v1_step(*args, mistake=mistake)

    with pytest.raises(ExerciseFailed, match=expected):
        check_flash_v1_step(wrong)
