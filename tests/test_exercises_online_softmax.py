"""check_online_softmax (notebook 03): the weak spots of issue 17, item 5, each with a learner-style mutant.

The mistake models themselves are tested in tests/test_softmax.py; here each mistake is written the way a
learner would write it, and must get its own message.
"""

# ruff: noqa: E741  (l is the running sum)

import math

import pytest
import torch

from flashattn import softmax as sm
from flashattn.exercises import ExerciseFailed
from flashattn.exercises.online_softmax import _SOFTMAX_FUNCTIONS, check_online_softmax

ORIGINALS = [(owner, name, getattr(owner, name)) for owner, name in _SOFTMAX_FUNCTIONS]


def assert_restored():
    for owner, name, original in ORIGINALS:
        assert getattr(owner, name) is original, (owner, name)


def learner(x, chunk, *, exponent="new", update_max=True, final="m", pad=False, out_dtype=None):
    """A learner's chunked softmax, with one mistake switched on."""
    rows, n = x.shape
    xs = torch.cat([x, torch.zeros(rows, (-n) % chunk, dtype=x.dtype)], 1) if pad else x
    m = torch.full((rows,), -math.inf, dtype=x.dtype)
    l = torch.zeros(rows, dtype=x.dtype)
    m_new = m
    for start in range(0, xs.shape[1], chunk):
        xj = xs[:, start:start + chunk]
        m_new = torch.maximum(m, xj.amax(-1))
        safe = torch.where(m_new == -math.inf, 0.0, m_new)
        against = {"new": safe, "old": m, "old_guarded": torch.where(m == -math.inf, 0.0, m)}[exponent]
        l = torch.exp(m - safe) * l + torch.exp(xj - against[:, None]).sum(-1)
        if update_max:
            m = m_new
    last = {"m": m, "m_guarded": torch.where(m == -math.inf, 0.0, m),
            "m_new": torch.where(m_new == -math.inf, 0.0, m_new)}[final]
    out = torch.exp(x - last[:, None]) / l[:, None]
    return out if out_dtype is None else out.to(out_dtype)


def test_learner_without_mistakes_passes():
    assert check_online_softmax(learner) is True


@pytest.mark.parametrize("fn", [
    lambda x, chunk: torch.softmax(x, dim=-1),
    lambda x, chunk: torch.nn.functional.softmax(x, dim=-1),
    lambda x, chunk: x.softmax(-1),
    lambda x, chunk: torch.log_softmax(x, -1).exp(),
    lambda x, chunk: torch.nn.Softmax(dim=-1)(x),
], ids=["torch.softmax", "F.softmax", "Tensor.softmax", "log_softmax", "nn.Softmax"])
def test_pytorch_softmax_is_refused(fn):
    with pytest.raises(ExerciseFailed, match="calls PyTorch's own"):
        check_online_softmax(fn)
    assert_restored()


def test_softmax_is_restored_when_the_learner_fails():
    def broken(x, chunk):
        torch.softmax(x, -1)
        raise RuntimeError("the learner's own error")

    with pytest.raises(RuntimeError, match="own error"):
        check_online_softmax(broken)
    assert_restored()


@pytest.mark.parametrize("mistake, message", [
    (dict(out_dtype=torch.float64), "the output is float64 for float32 x"),
    (dict(exponent="old"), "against the max from before it"),
    (dict(exponent="old_guarded"), "against the max from before it"),
    (dict(update_max=False), "m is never updated"),
    (dict(update_max=False, final="m_guarded"), "m is never updated"),
    (dict(update_max=False, final="m_new"), "m is never updated"),
    (dict(pad=True), "filled up with zeros"),
], ids=["float64_output", "exp_old_max", "exp_old_max_guarded", "max_never_updated",
        "max_never_updated_guarded", "max_never_updated_last", "zero_padded_tail"])
def test_learner_mistakes_are_named(mistake, message):
    with pytest.raises(ExerciseFailed, match=message):
        check_online_softmax(lambda x, chunk: learner(x, chunk, **mistake))


def test_the_package_solution_still_passes():
    assert check_online_softmax(sm.online_softmax) is True
