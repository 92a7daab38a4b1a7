"""flashattn.softmax (naive, safe, online softmax; merge; streamed attention) and the notebook-02 checks."""

# ruff: noqa: E741  (l is the running sum, as in the FlashAttention papers)

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import flashattn
from flashattn import softmax as sm
from flashattn.exercises import ExerciseFailed
from flashattn.exercises import online_softmax as ex

F64 = torch.float64


def randn(*shape, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=gen, dtype=F64)


# ---------------------------------------------------------------------------------------------
# softmax forms


@pytest.mark.parametrize("shape", [(1,), (3, 37), (2, 5, 101)])
def test_safe_and_naive_softmax_match_torch_for_moderate_logits(shape):
    x = randn(*shape, seed=1, scale=3.0)
    ref = torch.softmax(x, dim=-1)
    torch.testing.assert_close(sm.safe_softmax(x), ref, rtol=1e-13, atol=0)
    torch.testing.assert_close(sm.naive_softmax(x), ref, rtol=1e-13, atol=0)


def test_naive_softmax_overflows_where_safe_softmax_does_not():
    x = torch.tensor([[1.0, 2.0, 100.0]], dtype=torch.float32)  # exp(100) > float32 max
    assert torch.isnan(sm.naive_softmax(x)).any()
    torch.testing.assert_close(sm.safe_softmax(x), torch.softmax(x, -1))
    half = torch.tensor([[3.0, 12.0]], dtype=torch.float16)  # exp(12) > float16 max (65504)
    assert torch.isnan(sm.naive_softmax(half)).any()
    assert torch.isfinite(sm.safe_softmax(half)).all()


@pytest.mark.parametrize("n, chunk", [(37, 1), (37, 5), (37, 8), (37, 37), (37, 64), (1, 3), (100, 7)])
def test_online_softmax_equals_torch_softmax_in_float64(n, chunk):
    x = randn(4, n, seed=n + chunk, scale=4.0) + torch.linspace(0, 10, n, dtype=F64)  # max keeps growing
    torch.testing.assert_close(sm.online_softmax(x, chunk), torch.softmax(x, -1), rtol=1e-12, atol=1e-300)


def test_online_softmax_handles_large_and_masked_logits():
    x = randn(6, 45, seed=3, scale=50.0) + 900.0  # exp overflows float64 above ~709.8
    x[::2, :16] = float("-inf")  # a fully masked first chunk
    x[1::2, 20:23] = float("-inf")
    out = sm.online_softmax(x, 16)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-12, atol=1e-300)


def test_online_softmax_in_float32_stays_close_to_float64():
    x = randn(3, 61, seed=4, scale=30.0)
    out = sm.online_softmax(x.float(), 16)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), torch.softmax(x, -1), rtol=1e-5, atol=1e-7)


def test_running_stats_tracks_the_prefix_max_and_sum():
    x = randn(3, 23, seed=5, scale=3.0)
    chunk = 5
    ms, ls = sm.running_stats(x, chunk)
    assert ms.shape == ls.shape == (3, math.ceil(23 / chunk))
    for j, stop in enumerate(range(chunk, 23 + chunk, chunk)):
        prefix = x[:, :stop]
        m = prefix.amax(-1)
        torch.testing.assert_close(ms[:, j], m, rtol=0, atol=0)
        torch.testing.assert_close(ls[:, j], torch.exp(prefix - m[:, None]).sum(-1), rtol=1e-13, atol=0)
    m, l = sm.online_stats(x, chunk)
    torch.testing.assert_close(torch.exp(x - m[:, None]) / l[:, None], torch.softmax(x, -1))


def test_chunk_stats_of_empty_and_masked_chunks_is_the_neutral_state():
    for x in (torch.empty(4, 0, dtype=F64), torch.full((4, 3), float("-inf"), dtype=F64)):
        m, l = sm.chunk_stats(x)
        assert torch.isneginf(m).all() and (l == 0).all()


@pytest.mark.parametrize("chunk", [0, -3, 2.5])
def test_bad_chunk_is_rejected(chunk):
    with pytest.raises(ValueError, match="chunk"):
        sm.online_softmax(randn(2, 5), chunk)


# ---------------------------------------------------------------------------------------------
# merge


def test_merge_is_associative_and_commutative():
    x = randn(5, 40, seed=6, scale=5.0)
    a, b, c = (sm.chunk_stats(part) for part in (x[:, :13], x[:, 13:14], x[:, 14:]))
    left = sm.merge(*sm.merge(*a, *b), *c)
    right = sm.merge(*a, *sm.merge(*b, *c))
    swapped = sm.merge(*c, *sm.merge(*b, *a))
    whole = sm.chunk_stats(x)
    for m, l in (left, right, swapped):
        torch.testing.assert_close(m, whole[0], rtol=0, atol=0)
        torch.testing.assert_close(l, whole[1], rtol=1e-13, atol=0)


def test_merge_with_empty_parts():
    m, l = torch.tensor([1.5, -2.0], dtype=F64), torch.tensor([2.0, 3.0], dtype=F64)
    empty_m, empty_l = torch.full((2,), float("-inf"), dtype=F64), torch.zeros(2, dtype=F64)
    for out in (sm.merge(m, l, empty_m, empty_l), sm.merge(empty_m, empty_l, m, l)):
        torch.testing.assert_close(out[0], m, rtol=0, atol=0)
        torch.testing.assert_close(out[1], l, rtol=0, atol=0)
    both = sm.merge(empty_m, empty_l, empty_m, empty_l)
    assert torch.isneginf(both[0]).all() and (both[1] == 0).all()


# ---------------------------------------------------------------------------------------------
# streamed attention


@pytest.mark.parametrize("form", sm.FORMS)
@pytest.mark.parametrize("n, chunk", [(37, 8), (37, 37), (16, 64), (50, 1)])
def test_online_attention_matches_the_reference(form, n, chunk):
    q, k, v = flashattn.runtime.random_qkv(B=1, H=2, N=n, D=8, dtype=F64, seed_value=n, device="cpu")
    out = sm.online_attention(q, k, v, chunk, form=form)
    torch.testing.assert_close(out, flashattn.reference(q, k, v), rtol=1e-12, atol=1e-13)


def test_online_attention_with_scale_fewer_queries_and_float32():
    q, k, v = (randn(2, n, 6, seed=s) for s, n in ((7, 3), (8, 29), (9, 29)))
    ref = torch.softmax(2.0 * q @ k.transpose(-1, -2), -1) @ v
    for form in sm.FORMS:
        torch.testing.assert_close(sm.online_attention(q, k, v, 5, scale=2.0, form=form), ref, rtol=1e-12, atol=1e-13)
        out32 = sm.online_attention(q.float(), k.float(), v.float(), 5, scale=2.0, form=form)
        assert out32.dtype == torch.float32
        torch.testing.assert_close(out32.double(), ref, rtol=1e-5, atol=1e-6)


def test_online_attention_rejects_bad_form_and_shapes():
    q, k, v = randn(4, 8), randn(5, 8), randn(5, 8)
    with pytest.raises(ValueError, match="form"):
        sm.online_attention(q, k, v, 2, form="fa3")
    with pytest.raises(ValueError, match="shapes"):
        sm.online_attention(q, k[:, :4], v, 2)


# ---------------------------------------------------------------------------------------------
# exercise 1: check_merge


def stub(*args):
    raise NotImplementedError


def test_check_merge_passes_the_solution_and_reports_a_stub(capsys):
    assert ex.check_merge(sm.merge) is True
    assert ex.check_merge(stub) is False
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("name, model, message", ex.MERGE_MISTAKES, ids=[m[0] for m in ex.MERGE_MISTAKES])
def test_check_merge_names_each_mistake(name, model, message):
    def learner(m1, l1, m2, l2):
        return torch.maximum(m1, m2), model(m1, l1, m2, l2)

    with pytest.raises(ExerciseFailed) as err:
        ex.check_merge(learner)
    assert message in str(err.value)


def test_check_merge_diagnoses_learner_style_mistakes():
    def only_l(m1, l1, m2, l2):
        return sm.merge(m1, l1, m2, l2)[1]

    def swapped(m1, l1, m2, l2):
        m, l = sm.merge(m1, l1, m2, l2)
        return l, m

    def smaller_max(m1, l1, m2, l2):
        return torch.minimum(m1, m2), sm.merge(m1, l1, m2, l2)[1]

    def unguarded_branches(m1, l1, m2, l2):  # written differently from the mistake model
        m = torch.where(m1 > m2, m1, m2)
        return m, l1 * (m1 - m).exp() + l2 * (m2 - m).exp()

    def forgot_rescale_second(m1, l1, m2, l2):
        m = torch.max(m1, m2)
        return m, torch.exp(m1 - m) * l1 + l2

    expected = [(only_l, "must return two things"), (swapped, "swapped"), (smaller_max, "smaller"),
                (unguarded_branches, "both parts are empty"), (forgot_rescale_second, "did not rescale l2")]
    for fn, fragment in expected:
        with pytest.raises(ExerciseFailed, match=fragment):
            ex.check_merge(fn)


# ---------------------------------------------------------------------------------------------
# exercise 2: check_online_softmax


def test_check_online_softmax_passes_the_solution_and_reports_a_stub(capsys):
    assert ex.check_online_softmax(sm.online_softmax) is True
    assert ex.check_online_softmax(stub) is False
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("name, model, message", ex.ONLINE_SOFTMAX_MISTAKES,
                         ids=[m[0] for m in ex.ONLINE_SOFTMAX_MISTAKES])
def test_check_online_softmax_names_each_mistake(name, model, message):
    with pytest.raises(ExerciseFailed) as err:
        ex.check_online_softmax(model)
    assert message in str(err.value)


def _learner_loop(x, chunk, *, rescale=True, tail=True, normalize_early=False):
    """Online softmax written the way a learner would, with switchable mistakes."""
    rows, n = x.shape
    m = torch.full((rows,), -math.inf, dtype=x.dtype)
    l = torch.zeros(rows, dtype=x.dtype)
    stop = n if tail else n - n % chunk
    out = torch.zeros_like(x)
    for start in range(0, stop, chunk):
        xj = x[:, start:start + chunk]
        m_new = torch.maximum(m, xj.max(dim=1).values)
        safe = torch.where(m_new == -math.inf, 0.0, m_new)
        alpha = torch.exp(m - safe) if rescale else 1.0
        l = alpha * l + torch.exp(xj - safe[:, None]).sum(dim=1)
        m = m_new
        if normalize_early:
            out[:, start:start + chunk] = torch.exp(xj - m[:, None]) / l[:, None]
    if normalize_early:
        return out
    out[:, :stop] = torch.exp(x[:, :stop] - m[:, None]) / l[:, None]
    return out


def test_learner_loop_with_no_mistake_passes():
    assert ex.check_online_softmax(_learner_loop) is True


@pytest.mark.parametrize("mistake, fragment", [
    (dict(rescale=False), "did you rescale l by exp(m_old - m_new)?"),
    (dict(tail=False), "tail chunk"),
    (dict(normalize_early=True), "normalized a chunk"),
])
def test_check_online_softmax_diagnoses_learner_style_mistakes(mistake, fragment):
    with pytest.raises(ExerciseFailed) as err:
        ex.check_online_softmax(lambda x, chunk: _learner_loop(x, chunk, **mistake))
    assert fragment in str(err.value)


def test_check_online_softmax_generic_diagnoses():
    def scaled(x, chunk):  # every row off by a different factor, matching no model
        return torch.softmax(x, -1) * torch.linspace(1.5, 2.5, x.shape[0], dtype=x.dtype)[:, None]

    def wrong_shape(x, chunk):
        return torch.softmax(x, -1)[:, :-1]

    with pytest.raises(ExerciseFailed, match="off by a factor per row"):
        ex.check_online_softmax(scaled)
    with pytest.raises(ExerciseFailed, match="shape"):
        ex.check_online_softmax(wrong_shape)


# ---------------------------------------------------------------------------------------------
# property: any row length, any chunk, any cut of the row into parts



@given(n=st.integers(1, 80), chunk=st.integers(1, 90), cut=st.integers(0, 80), seed=st.integers(0, 2**16))
def test_online_softmax_and_merge_for_any_sizes(n, chunk, cut, seed):
    x = randn(3, n, seed=seed, scale=20.0)
    torch.testing.assert_close(sm.online_softmax(x, chunk), torch.softmax(x, -1), rtol=1e-12, atol=1e-300)
    cut = min(cut, n)  # one part may be empty
    m, l = sm.merge(*sm.chunk_stats(x[:, cut:]), *sm.chunk_stats(x[:, :cut]))
    whole = sm.chunk_stats(x)
    torch.testing.assert_close(m, whole[0], rtol=0, atol=0)
    torch.testing.assert_close(l, whole[1], rtol=1e-13, atol=0)
