"""Masked attention (notebook 14): sliding windows, packed documents and the drop-in's attn_mask, forward and
backward, against torch's SDPA in float64 with the same mask written out densely; and the work done: the
(full, partial) blocks each program of each kernel computed, against the mask's block structure.

Tolerances from helpers.TOL, gradients measured as in test_backward.py (grad_errors).
"""

import pytest
import torch
from helpers import TOL, rel_error
from hypothesis import example, given
from hypothesis import strategies as st
from test_backward import grad_errors

import flashattn
from flashattn import masking, runtime
from flashattn.kernels import mask_blocks as mb

GPU = pytest.mark.skipif(runtime.MODE != "gpu", reason="needs a GPU")
DTYPES = st.sampled_from([torch.float32, torch.float16])
BLOCKS = st.sampled_from([16, 32])


def randn(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen).to(device=runtime.DEVICE, dtype=dtype)


def torch_reference(q, k, v, do, mask):
    """Output and gradients by torch's SDPA in float64 with a dense (…, L, S) mask (K/V heads repeated for GQA)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[-3] // k.shape[-3]
    mask = mask.to(q.device) if mask.dtype == torch.bool else mask.to(q.device).double()
    out = torch.nn.functional.scaled_dot_product_attention(q64, k64.repeat_interleave(group, -3),
                                                           v64.repeat_interleave(group, -3), attn_mask=mask)
    out.backward(do.double())
    return out.detach(), (q64.grad, k64.grad, v64.grad)


def forward_backward(q, k, v, do, counts=None, **kwargs):
    """masked_forward then masked_backward, with the tiles in kwargs (forward tiles = dq tiles)."""
    o, lse = masking.masked_forward(q, k, v, counts=counts, **{k: v for k, v in kwargs.items() if k != "dkdv_tiles"})
    grads = masking.masked_backward(q, k, v, o, lse, do, counts=counts, dq_tiles=kwargs.get("tiles"),
                                    **{k: v for k, v in kwargs.items() if k != "tiles"})
    return o, grads


def check(out, grads, ref_out, ref_grads, dtype):
    assert rel_error(out, ref_out.to(out.dtype)) < TOL[dtype]
    assert max(grad_errors(grads, ref_grads)) < TOL[dtype]


# --- sliding windows ---------------------------------------------------------------------------------------------

@given(L=st.integers(1, 80), S=st.integers(1, 80), left=st.sampled_from([-1, 0, 1, 7, 20]),
       right=st.sampled_from([-1, 0, 3, 16]), causal=st.booleans(), hkv=st.integers(1, 2),
       group=st.sampled_from([1, 2]), D=st.sampled_from([16, 24, 32]), bm=BLOCKS, bn=BLOCKS, dtype=DTYPES,
       seed=st.integers(0, 2**16))
@example(L=70, S=70, left=7, right=0, causal=True, hkv=1, group=2, D=32, bm=16, bn=16, dtype=torch.float16, seed=0)
@example(L=64, S=20, left=3, right=0, causal=True, hkv=1, group=1, D=16, bm=32, bn=16, dtype=torch.float32, seed=1)
@example(L=49, S=78, left=20, right=16, causal=False, hkv=2, group=2, D=16, bm=32, bn=16, dtype=torch.float32,
         seed=2)  # full key blocks between two partial edges, GQA with two K/V heads
@example(L=10, S=64, left=20, right=-1, causal=False, hkv=1, group=1, D=16, bm=32, bn=16, dtype=torch.float32,
         seed=3)  # a Q block that hangs over L: none of its tiles is full
@example(L=74, S=72, left=1, right=0, causal=True, hkv=1, group=1, D=24, bm=32, bn=32, dtype=torch.float32,
         seed=4)  # a narrow window: a key block's last Q rows start a new Q block
def test_window_against_torch_and_its_blocks(L, S, left, right, causal, hkv, group, D, bm, bn, dtype, seed):
    """Top-left windows, L ≠ S, GQA; rows that see no key (L > S with a window) give 0, as torch."""
    right = min(right, 0) if causal else right
    gen = torch.Generator().manual_seed(seed)
    q, do = (randn(1, hkv * group, L, D, dtype=dtype, gen=gen) for _ in range(2))
    k, v = (randn(1, hkv, S, D, dtype=dtype, gen=gen) for _ in range(2))
    counts = {}
    out, grads = forward_backward(q, k, v, do, counts, causal=causal, window=(left, right), tiles=(bm, bn, 4, 1),
                                  dkdv_tiles=(bn, bm, 4, 1))
    mask = mb.window_mask(L, S, (left, right), causal, device=q.device)
    check(out, grads, *torch_reference(q, k, v, do, mask), dtype)
    counts = {name: c.cpu() for name, c in counts.items()}
    # the work: every program computed exactly the tiles the window leaves, as full or partial as they are
    assert torch.equal(counts["forward"][0, 0], mb.counts(mb.window_kinds(L, S, bm, bn, (left, right), causal)))
    assert torch.equal(counts["dq"], counts["forward"])
    by_key = mb.counts(mb.window_kinds(L, S, bn, bm, (left, right), causal), dim=-2)
    assert torch.equal(counts["dkdv"][0, 0], group * by_key)


@pytest.mark.parametrize("window,causal", [((2**31 - 1, 2**31 - 1), False), ((2**31 - 1, 0), True),
                                           ((5, 2**31 - 1), False), ((2**40, 3), False)])
def test_a_window_side_past_every_key_is_unbounded(window, causal):
    """Sides as large as int32 holds (or larger) see every key on that side, as -1 does: the kernels' 32-bit index
    arithmetic must not wrap around (it did for 2**31 - 1 before masking clamped the sides)."""
    gen = torch.Generator().manual_seed(2)
    q, k, v, do = (randn(1, 2, 40, 16, dtype=torch.float32, gen=gen) for _ in range(4))
    out, grads = forward_backward(q, k, v, do, causal=causal, window=window, tiles=(16, 16, 4, 1),
                                  dkdv_tiles=(16, 16, 4, 1))
    check(out, grads, *torch_reference(q, k, v, do, mb.window_mask(40, 40, window, causal, device=q.device)),
          torch.float32)


def test_window_skips_what_it_should_at_a_longer_length():
    """N = 512 with a window of 64 keys: at most 3 key blocks of 32 per Q block of 32 (45 in all, causal: 136)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (randn(1, 1, 512, 16, dtype=torch.float16, gen=gen) for _ in range(3))
    counts = {}
    out, _ = masking.masked_forward(q, k, v, causal=True, window=(63, 0), tiles=(32, 32, 4, 1), counts=counts)
    full, partial = counts["forward"][0, 0].sum(0).tolist()  # (tolist: on any device)
    assert (full, partial) == (15, 30)  # past the first Q block: one full key block, the diagonal and the left edge
    assert rel_error(out, torch_reference(q, k, v, q, mb.window_mask(512, 512, (63, 0), True))[0].half()) < TOL[
        torch.float16]


def test_attention_routes_windows_and_keeps_the_plain_path():
    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (randn(2, 2, 50, 16, dtype=torch.float32, gen=gen) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flashattn.attention(*leaves, variant="fast", causal=True, window=(10, 0))
    out.backward(do)
    ref_out, ref_grads = torch_reference(q, k, v, do, mb.window_mask(50, 50, (10, 0), True))
    check(out.detach(), [t.grad for t in leaves], ref_out, ref_grads, torch.float32)
    unbounded = flashattn.attention(q, k, v, variant="fast", causal=True, window=(-1, -1))
    assert rel_error(unbounded, flashattn.attention(q, k, v, variant="fast", causal=True)) < TOL[torch.float32]
    with pytest.raises(ValueError, match="window is an option of variant 'fast'"):
        flashattn.attention(q, k, v, variant="v2", window=(4, 4))
    with pytest.raises(ValueError, match="right side is 0"):
        flashattn.attention(q, k, v, variant="fast", causal=True, window=(4, 4))
    with pytest.raises(ValueError, match=">= -1"):
        flashattn.attention(q, k, v, variant="fast", window=(-2, 4))
    with pytest.raises(TypeError, match="pair of ints"):
        flashattn.attention(q, k, v, variant="fast", window=4)
    with pytest.raises(TypeError, match="unknown option"):
        flashattn.attention(q, k, v, variant="fast", window=(4, 4), block_q=3)
    with pytest.raises(ValueError, match="block sizes powers of two"):
        flashattn.attention(q, k, v, variant="fast", window=(4, 4), tiles=(24, 32, 4, 1))


@pytest.mark.parametrize("kind", ["window", "attn_mask"])
def test_lse_is_float64s_and_inf_for_a_row_that_sees_no_key(kind):
    """masked_forward's log-sum-exp: float64's where a row sees keys, +inf (as FlashAttention's) where it sees none,
    so that merging it with another part of the keys gives that row weight 0 (0 would give it weight 1)."""
    gen = torch.Generator().manual_seed(21)
    q = randn(1, 2, 40, 16, dtype=torch.float32, gen=gen)
    k, v = (randn(1, 2, 24, 16, dtype=torch.float32, gen=gen) for _ in range(2))
    mask = mb.window_mask(40, 24, (3, 0), True, device=q.device)  # rows 27.. see no key, the rest 1 to 4 keys
    if kind == "window":
        _, lse = masking.masked_forward(q, k, v, causal=True, window=(3, 0))
    else:
        mask[5, :] = False  # a whole row among rows that see keys
        _, lse = masking.masked_forward(q, k, v, attn_mask=mask.expand(1, 2, 40, 24))
    scores = (q.double() @ k.double().transpose(-1, -2) * 0.25).masked_fill(~mask, float("-inf"))
    ref = torch.logsumexp(scores, -1)
    sees = mask.any(-1)
    assert (~sees).sum() >= 13 and torch.equal(lse[..., ~sees], torch.full_like(lse[..., ~sees], float("inf")))
    assert rel_error(lse[..., sees], ref[..., sees].float()) < TOL[torch.float32]


# --- packed documents --------------------------------------------------------------------------------------------

LENGTHS = st.lists(st.integers(1, 40), min_size=1, max_size=3)


@given(lengths_q=LENGTHS, data=st.data(), left=st.sampled_from([-1, 0, 5, 17]), right=st.sampled_from([-1, 0, 9]),
       causal=st.booleans(), group=st.sampled_from([1, 2]), dtype=DTYPES, bm=BLOCKS, bn=BLOCKS,
       seed=st.integers(0, 2**16))
@example(lengths_q=[1, 33, 16], data=None, left=-1, right=-1, causal=True, group=2, dtype=torch.float16, bm=16,
         bn=16, seed=0)
def test_varlen_against_torch_and_its_blocks(lengths_q, data, left, right, causal, group, dtype, bm, bn, seed):
    """Documents of any length (1, not multiples of the blocks), as many keys as queries or not (bottom-right)."""
    same = data is None or data.draw(st.booleans(), label="same lengths")
    lengths_k = lengths_q if same else data.draw(st.lists(st.integers(1, 40), min_size=len(lengths_q),
                                                           max_size=len(lengths_q)), label="lengths_k")
    right = min(right, 0) if causal else right
    gen = torch.Generator().manual_seed(seed)
    q, do = (randn(sum(lengths_q), group, 16, dtype=dtype, gen=gen) for _ in range(2))
    k, v = (randn(sum(lengths_k), 1, 16, dtype=dtype, gen=gen) for _ in range(2))
    cu_q, cu_k = mb.cu_seqlens(lengths_q, q.device), mb.cu_seqlens(lengths_k, q.device)
    counts = {}
    out, grads = forward_backward(q, k, v, do, counts, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                  max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k), causal=causal,
                                  window=(left, right), tiles=(bm, bn, 4, 1), dkdv_tiles=(bm, bn, 4, 1))
    heads = masking._packed_view  # (total, H, D) -> (1, H, total, D)
    mask = mb.document_mask(lengths_q, lengths_k, (left, right), causal, device=q.device)
    ref_out, ref_grads = torch_reference(heads(q), heads(k), heads(v), heads(do), mask)
    check(heads(out), [heads(g) for g in grads], ref_out, ref_grads, dtype)
    counts = {name: c.cpu() for name, c in counts.items()}
    for doc, (lq, lk) in enumerate(zip(lengths_q, lengths_k, strict=True)):
        kinds = mb.window_kinds(lq, lk, bm, bn, (left, right), causal, offset=lk - lq)
        forward, by_key = counts["forward"][:, doc], counts["dkdv"][:, doc]
        assert torch.equal(forward[:, :kinds.shape[0]], mb.counts(kinds).expand(group, -1, -1))
        assert not forward[:, kinds.shape[0]:].any()  # blocks past the document's end: no program
        assert torch.equal(by_key[0, :kinds.shape[1]], group * mb.counts(kinds, dim=-2))


def test_attention_varlen_is_differentiable_and_checks_its_arguments():
    gen = torch.Generator().manual_seed(1)
    lengths = [7, 30, 1]
    q, k, v, do = (randn(38, 2, 16, dtype=torch.float32, gen=gen) for _ in range(4))
    cu = mb.cu_seqlens(lengths, q.device)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flashattn.attention_varlen(*leaves, cu, cu, 30, 30, causal=True)
    out.backward(do)
    heads = masking._packed_view
    mask = mb.document_mask(lengths, causal=True, device=q.device)
    ref_out, ref_grads = torch_reference(heads(q), heads(k), heads(v), heads(do), mask)
    check(heads(out.detach()), [heads(t.grad) for t in leaves], ref_out, ref_grads, torch.float32)
    varlen = flashattn.attention_varlen
    with pytest.raises(ValueError, match=r"int32 tensor of shape \(B \+ 1,\)"):
        varlen(q, k, v, cu.long(), cu, 30, 30)
    if q.device.type == "cpu":  # the values of cu_seqlens are read only where that costs no GPU synchronization
        with pytest.raises(ValueError, match="rise from 0 to 38"):
            varlen(q, k, v, mb.cu_seqlens([7, 30, 2], q.device), cu, 30, 30)
        with pytest.raises(ValueError, match="more than max_seqlen 20"):
            varlen(q, k, v, cu, cu, 20, 30)
    with pytest.raises(ValueError, match="as many documents"):
        varlen(q, k[:37], v[:37], cu, mb.cu_seqlens([7, 30], q.device), 30, 30)
    with pytest.raises(ValueError, match=r"\(total, heads, D\)"):
        varlen(q[None], k, v, cu, cu, 30, 30)
    with pytest.raises(ValueError, match="positive int"):
        varlen(q, k, v, cu, cu, 0, 30)


def test_varlen_documents_with_more_keys_than_queries():
    """Each document's keys outnumber its queries by more than a block (bottom-right causal): the dK/dV kernel walks
    every key block of every document, by cu_seqlens_k (not by the queries' blocks)."""
    gen = torch.Generator().manual_seed(22)
    lengths_q, lengths_k = [3, 20, 7], [40, 5, 33]
    q, do = (randn(sum(lengths_q), 2, 16, dtype=torch.float32, gen=gen) for _ in range(2))
    k, v = (randn(sum(lengths_k), 1, 16, dtype=torch.float32, gen=gen) for _ in range(2))
    cu_q, cu_k = mb.cu_seqlens(lengths_q, q.device), mb.cu_seqlens(lengths_k, q.device)
    out, grads = forward_backward(q, k, v, do, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=20, max_seqlen_k=40,
                                  causal=True, tiles=(16, 16, 4, 1), dkdv_tiles=(16, 16, 4, 1))
    heads = masking._packed_view
    mask = mb.document_mask(lengths_q, lengths_k, causal=True, device=q.device)
    ref_out, ref_grads = torch_reference(heads(q), heads(k), heads(v), heads(do), mask)
    check(heads(out), [heads(g) for g in grads], ref_out, ref_grads, torch.float32)


@pytest.mark.skipif(runtime.MODE == "gpu", reason="the values of cu_seqlens are read on the CPU only")
def test_cu_seqlens_that_decrease_are_refused():
    """Offsets from 0 to the packed length that go down on the way (a document of negative length) are refused."""
    gen = torch.Generator().manual_seed(23)
    q, k, v = (randn(38, 2, 16, dtype=torch.float32, gen=gen) for _ in range(3))
    cu = mb.cu_seqlens([7, 30, 1], q.device)
    bad = torch.tensor([0, 30, 7, 38], dtype=torch.int32, device=q.device)
    for cu_q, cu_k in ((bad, cu), (cu, bad)):
        with pytest.raises(ValueError, match="never decreasing"):
            flashattn.attention_varlen(q, k, v, cu_q, cu_k, 40, 40)


@pytest.mark.parametrize("L,S,window,causal,hkv,group,dtype", [
    (70, 70, (7, 0), True, 1, 2, torch.float16), (64, 20, (3, 5), False, 2, 1, torch.float32),
    (17, 40, (-1, 9), False, 1, 1, torch.float16), (1, 1, (0, 0), True, 1, 3, torch.float32)])
def test_a_window_backward_is_bound_once_and_right_on_new_tensors(L, S, window, causal, hkv, group, dtype,
                                                                 monkeypatch):
    """Eager window gradients through autograd: the first call of a problem binds its backward (the launches that
    ``backward_window`` makes, recorded once), the next calls, on new tensors of the same problem, launch them
    without ``backward_window``'s host code; every call's gradients match float64's."""
    from flashattn.kernels import masked_backward

    monkeypatch.setattr(masking, "_BACKWARD_RUNS", {})
    ran = []
    original = masked_backward.backward_window
    monkeypatch.setattr(masked_backward, "backward_window", lambda *a, **kw: ran.append(1) or original(*a, **kw))
    gen = torch.Generator().manual_seed(L + S)
    mask = mb.window_mask(L, S, window, causal, device=runtime.DEVICE)
    for _ in range(3):
        q, do = (randn(2, hkv * group, L, 16, dtype=dtype, gen=gen) for _ in range(2))
        k, v = (randn(2, hkv, S, 16, dtype=dtype, gen=gen).requires_grad_() for _ in range(2))
        q.requires_grad_()
        out = flashattn.attention(q, k, v, variant="fast", causal=causal, window=window)
        grads = torch.autograd.grad(out, (q, k, v), do)
        check(out.detach(), grads, *torch_reference(q, k, v, do, mask), dtype)
    assert len(ran) == 1 and len(masking._BACKWARD_RUNS) == 1, (ran, masking._BACKWARD_RUNS)


@pytest.mark.parametrize("L,S,window,causal,hkv,group,dtype", [
    (70, 70, (7, 0), True, 1, 2, torch.float16), (100, 100, (30, 0), True, 2, 1, torch.float16),
    (17, 40, (-1, 9), False, 1, 1, torch.float32), (1, 1, (0, 0), True, 1, 3, torch.float32)])
def test_a_window_forward_is_prepared_once_and_right_on_new_tensors(L, S, window, causal, hkv, group, dtype,
                                                                   monkeypatch):
    """``attention(..., window=...)`` checks a problem's inputs and chooses its kernel once (the first call), then
    runs the prepared forward on new tensors of the same problem, with and without autograd: every output matches
    float64's; another scale is another problem (its own result); bad inputs still raise, on every call."""
    monkeypatch.setattr(masking, "_FORWARD_RUNS", {})
    checked = []
    original = masking._check
    monkeypatch.setattr(masking, "_check", lambda *a: checked.append(1) or original(*a))
    gen = torch.Generator().manual_seed(L + S)
    mask = mb.window_mask(L, S, window, causal, device=runtime.DEVICE)
    for call in range(4):
        q, do = (randn(2, hkv * group, L, 16, dtype=dtype, gen=gen) for _ in range(2))
        k, v = (randn(2, hkv, S, 16, dtype=dtype, gen=gen) for _ in range(2))
        if call % 2:
            for t in (q, k, v):
                t.requires_grad_()
            out = flashattn.attention(q, k, v, variant="fast", causal=causal, window=window)
            check(out.detach(), torch.autograd.grad(out, (q, k, v), do), *torch_reference(q, k, v, do, mask), dtype)
        else:
            out = flashattn.attention(q, k, v, variant="fast", causal=causal, window=window)
            assert not out.requires_grad
            assert rel_error(out, torch_reference(q, k, v, do, mask)[0].to(dtype)) < TOL[dtype]
    assert len(checked) == 1 and len(masking._FORWARD_RUNS) == 1
    halved = flashattn.attention(q, k, v, variant="fast", causal=causal, window=window, scale=0.125)
    s = (q.double() @ k.double().repeat_interleave(group, 1).transpose(-1, -2) * 0.125).masked_fill(~mask, -torch.inf)
    expected = torch.nan_to_num(torch.softmax(s, -1)) @ v.double().repeat_interleave(group, 1)
    assert len(masking._FORWARD_RUNS) == 2 and rel_error(halved, expected.to(dtype)) < TOL[dtype]
    for _ in range(2):
        with pytest.raises(TypeError, match="unknown option"):
            flashattn.attention(q, k, v, variant="fast", causal=causal, window=window, tile=(16, 16, 4, 1))
        with pytest.raises(ValueError):
            flashattn.attention(q, k[..., :8], v, variant="fast", causal=causal, window=window)


def test_the_bound_backward_leaves_documents_masks_and_a_second_stream_to_the_ordinary_path(monkeypatch):
    from flashattn.kernels import masked_backward

    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (randn(1, 2, 32, 16, dtype=torch.float16, gen=gen) for _ in range(4))
    o, lse = masking.masked_forward(q, k, v, causal=True, window=(4, 0))
    spec = masking.make_spec(q, k, v, causal=True, window=(4, 0))
    assert masking._window_backward(q, k, v, o, lse, do, spec, 0.25, {}) is not None
    assert masking._window_backward(q, k, v, o, lse, do.transpose(2, 3).contiguous().transpose(2, 3),
                                    spec, 0.25, {}) is None  # dO's rows not contiguous: copied by the ordinary path
    monkeypatch.setattr(masked_backward, "CONCURRENT_DQ", True)
    assert masking._window_backward(q, k, v, o, lse, do, spec, 0.25, {}) is None
    monkeypatch.setattr(masked_backward, "CONCURRENT_DQ", False)
    dense = masking.make_spec(q, k, v, causal=True, attn_mask=torch.ones(1, 2, 32, 32, dtype=torch.bool,
                                                                         device=q.device))
    assert masking._window_backward(q, k, v, o, lse, do, dense, 0.25, {}) is None


@pytest.mark.parametrize("layout", ["heads first", "every other column", "broadcast"])
def test_gradients_from_a_strided_do(layout, monkeypatch):
    """dO as a model hands it over: a packed output seen from (1, H, total, D) memory (``.transpose(0, 1)``), a
    dO whose last stride is not 1, and the zero-stride dO of ``out.sum()``: read through its strides (copied only
    when its rows are not contiguous: never in the first layout), the gradients as from a contiguous dO; windows and
    documents."""
    copies, contiguous = [], torch.Tensor.contiguous
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda t, *a, **kw: (
        lambda c: c if c is t else copies.append(tuple(t.shape)) or c)(contiguous(t, *a, **kw)))
    gen = torch.Generator().manual_seed(7)
    lengths, H, D, dtype = [5, 40, 1, 19], 2, 16, torch.float16
    total = sum(lengths)
    q, k, v = (randn(total, H, D, dtype=dtype, gen=gen) for _ in range(3))
    if layout == "heads first":
        do = randn(1, H, total, D, dtype=dtype, gen=gen)[0].transpose(0, 1)
    elif layout == "every other column":
        do = randn(total, H, 2 * D, dtype=dtype, gen=gen)[..., ::2]
    else:
        do = randn(1, 1, 1, dtype=dtype, gen=gen).expand(total, H, D)
    assert not do.is_contiguous()
    cu = mb.cu_seqlens(lengths, q.device)
    heads = masking._packed_view
    calls = {"documents": (lambda *t: flashattn.attention_varlen(*t, cu, cu, 40, 40, causal=True),
                           mb.document_mask(lengths, causal=True, device=q.device)),
             "window": (lambda *t: flashattn.attention(*map(heads, t), variant="fast", causal=True,
                                                        window=(9, 0))[0].transpose(0, 1),
                        mb.window_mask(total, total, (9, 0), True, device=q.device))}
    for call, mask in calls.values():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = call(*leaves)
        copies.clear()
        out.backward(do)
        if layout == "heads first":  # rows with a stride of 1: read in place
            assert not copies, copies
        ref_out, ref_grads = torch_reference(heads(q), heads(k), heads(v), heads(do), mask)
        check(heads(out.detach()), [heads(t.grad) for t in leaves], ref_out, ref_grads, dtype)


# --- the drop-in's attn_mask -------------------------------------------------------------------------------------

MASK_SHAPES = [(20, 40), (2, 1, 20, 40), (1, 4, 20, 40), (2, 1, 1, 40), (4, 20, 40), (20, 1), (2, 4, 20, 40)]


def random_mask(shape, kind, gen, device):
    """A boolean mask (True = takes part), or a float one with -inf, 0 and other values."""
    takes = torch.rand(shape, generator=gen) < 0.6
    if kind == "bool":
        return takes.to(device)
    values = torch.randn(shape, generator=gen)
    values[torch.rand(shape, generator=gen) < 0.4] = 0.0
    return values.masked_fill(~takes, float("-inf")).to(device)


@given(shape=st.sampled_from(MASK_SHAPES), kind=st.sampled_from(["bool", "float"]), causal=st.booleans(),
       dtype=DTYPES, seed=st.integers(0, 2**16))
@example(shape=(2, 1, 1, 40), kind="bool", causal=True, dtype=torch.float16, seed=0)
@example(shape=(20, 1), kind="bool", causal=False, dtype=torch.float32, seed=1)  # a key stride of 0
def test_sdpa_attn_mask_against_torch(shape, kind, causal, dtype, seed):
    """Broadcast shapes (read through zero strides), boolean and float masks, combined with is_causal, GQA."""
    gen = torch.Generator().manual_seed(seed)
    q, do = (randn(2, 4, 20, 16, dtype=dtype, gen=gen) for _ in range(2))
    k, v = (randn(2, 2, 40, 16, dtype=dtype, gen=gen) for _ in range(2))
    mask = random_mask(shape, kind, gen, q.device)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flashattn.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=causal, enable_gqa=True)
    out.backward(do)
    dense = mask.expand(2, 4, 20, 40)
    if causal:
        keep = mb.window_mask(20, 40, causal=True, device=q.device)
        dense = dense & keep if kind == "bool" else dense.masked_fill(~keep, float("-inf"))
    check(out.detach(), [t.grad for t in leaves], *torch_reference(q, k, v, do, dense), dtype)


def test_attn_mask_blocks_and_counts():
    """A key-padding mask (B, 1, 1, S): the blocks past each sequence's length are skipped by every kernel."""
    gen = torch.Generator().manual_seed(4)
    q, k, v, do = (randn(2, 2, 64, 16, dtype=torch.float16, gen=gen) for _ in range(4))
    mask = mb.padding_mask([20, 64], 64, device=q.device)
    counts = {}
    forward_backward(q, k, v, do, counts, attn_mask=mask.expand(2, 2, 64, 64), tiles=(16, 16, 4, 1),
                     dkdv_tiles=(16, 16, 4, 1))
    kinds = mb.classify(mask, 16, 16, shape=(64, 64)).cpu()  # (2, 1, 4, 4)
    counts = {name: c.cpu() for name, c in counts.items()}
    assert torch.equal(counts["forward"], mb.counts(kinds).transpose(0, 1).expand(2, 2, 4, 2))
    assert counts["forward"][:, 0].sum(-2).tolist() == [[4, 4]] * 2  # sequence 0: 1 full and 1 partial per Q block
    assert torch.equal(counts["dkdv"], mb.counts(kinds, dim=-2).transpose(0, 1).expand(2, 2, 4, 2))
    assert counts["dkdv"][0, 0].tolist() == [[4, 0], [0, 4], [0, 0], [0, 0]]  # keys past 20: no Q block at all


def test_a_mask_whose_tiles_differ_by_batch_and_head():
    """A (B, Hq, L, S) mask (no broadcast dimension) with another key-padding length in every batch and query head,
    GQA: each program reads its own (batch, head) row of the block tables, in every kernel."""
    gen = torch.Generator().manual_seed(24)
    q, do = (randn(2, 4, 40, 16, dtype=torch.float32, gen=gen) for _ in range(2))
    k, v = (randn(2, 2, 40, 16, dtype=torch.float32, gen=gen) for _ in range(2))
    lengths = torch.tensor([[5, 40, 17, 33], [40, 9, 26, 1]])
    mask = (torch.arange(40)[None, None, None, :] < lengths[:, :, None, None]).expand(2, 4, 40, 40).to(q.device)
    out, grads = forward_backward(q, k, v, do, attn_mask=mask, tiles=(16, 16, 4, 1), dkdv_tiles=(16, 16, 4, 1))
    check(out, grads, *torch_reference(q, k, v, do, mask), torch.float32)


def test_a_mask_with_other_tiles_for_dq_than_for_dkdv():
    """The dQ kernel's tiles differ from the dK/dV kernel's in block_n only: each is given its own classification."""
    gen = torch.Generator().manual_seed(25)
    q, k, v, do = (randn(1, 2, 48, 16, dtype=torch.float32, gen=gen) for _ in range(4))
    mask = mb.padding_mask([20], 48, device=q.device).expand(1, 2, 48, 48)
    out, grads = forward_backward(q, k, v, do, attn_mask=mask, causal=True, tiles=(16, 16, 4, 1),
                                  dkdv_tiles=(16, 32, 4, 1))
    dense = mask & mb.window_mask(48, 48, causal=True, device=q.device)
    check(out, grads, *torch_reference(q, k, v, do, dense), torch.float32)


def test_masked_forward_refuses_a_mask_of_other_batch_or_heads():
    """masked_forward's attn_mask is a (B, Hq, L, S) view: other batch or head counts are refused, not read."""
    q = torch.zeros(1, 2, 8, 16, device=runtime.DEVICE)
    for shape in ((2, 2, 8, 8), (1, 4, 8, 8)):
        with pytest.raises(ValueError, match=r"attn_mask must be a \(B, Hq, L, S\)"):
            masking.masked_forward(q, q, q, attn_mask=torch.ones(shape, dtype=torch.bool, device=q.device))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_rows_the_mask_covers_entirely_give_what_torch_gives(kind):
    gen = torch.Generator().manual_seed(5)
    q, k, v, do = (randn(1, 2, 40, 16, dtype=torch.float32, gen=gen) for _ in range(4))
    mask = torch.rand(40, 40, generator=gen) < 0.5
    mask[3] = mask[17:35] = False  # whole rows, and whole blocks of rows
    mask = mask if kind == "bool" else torch.zeros(40, 40).masked_fill(~mask, float("-inf"))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flashattn.scaled_dot_product_attention(*leaves, attn_mask=mask.to(q.device))
    out.backward(do)
    ref_out, ref_grads = torch_reference(q, k, v, do, mask)
    assert not out[:, :, 3].any() and not out[:, :, 17:35].any() and not leaves[0].grad[:, :, 17:35].any()
    check(out.detach(), [t.grad for t in leaves], ref_out, ref_grads, torch.float32)


def test_a_float_mask_at_float32s_lowest_is_finite_as_in_torch():
    """-3.4e38 (torch.finfo(float32).min, a common 'masked' value) is a finite score: a row of it is uniform."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (randn(1, 1, 20, 16, dtype=torch.float32, gen=gen) for _ in range(3))
    mask = torch.zeros(20, 20)
    mask[4] = torch.finfo(torch.float32).min
    mask[5, :7] = torch.finfo(torch.float32).min
    out = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                           attn_mask=mask.to(q.device).double())
    assert rel_error(out, ref.float()) < TOL[torch.float32]
    assert torch.allclose(out[0, 0, 4], v[0, 0].mean(0), atol=1e-5)


def test_sdpa_attn_mask_errors_name_the_argument():
    q = torch.zeros(1, 2, 8, 16, device=runtime.DEVICE)
    sdpa = flashattn.scaled_dot_product_attention
    with pytest.raises(ValueError, match="gradient is not computed"):
        sdpa(q, q, q, attn_mask=torch.zeros(8, 8, device=q.device, requires_grad=True))
    with torch.no_grad():  # no gradient asked for: fine
        sdpa(q, q, q, attn_mask=torch.zeros(8, 8, device=q.device, requires_grad=True))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        sdpa(q, q, q, attn_mask=torch.zeros(8, 8, dtype=torch.int64, device=q.device))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        sdpa(q.half(), q.half(), q.half(), attn_mask=torch.zeros(8, 8, dtype=torch.float64, device=q.device))
    with pytest.raises(ValueError, match=r"does not broadcast to \(\.\.\., L, S\)"):
        sdpa(q, q, q, attn_mask=torch.ones(3, 8, 8, dtype=torch.bool, device=q.device))
    with pytest.raises(TypeError, match="torch.Tensor or None"):
        sdpa(q, q, q, attn_mask=[[True]])
    with pytest.raises(ValueError, match="dropout_p"):
        sdpa(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool, device=q.device), dropout_p=0.1)
    if runtime.MODE == "interpreter":
        with pytest.raises(TypeError, match="bfloat16 is refused in interpreter mode"):
            sdpa(q.bfloat16(), q.bfloat16(), q.bfloat16(), attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="cannot be combined"):
        masking.masked_forward(q, q, q, window=(2, 2), attn_mask=torch.ones(1, 2, 8, 8, dtype=torch.bool))


@pytest.mark.parametrize("is_causal", [False, True])
def test_a_nan_in_a_float_mask_is_nan_where_torch_is(is_causal):
    """A NaN in the mask (a bug upstream) must show, as in torch: its row's output and dq NaN, and dk, dv NaN at
    every key the row sees; the rest as torch's. (Clamping the bias used to drop it silently.) Torch's math also
    makes dk, dv NaN at keys no row sees (0 · NaN); a kernel that skips their tiles leaves those at 0."""
    gen = torch.Generator().manual_seed(4)
    q, k, v, do = (randn(1, 2, 40, 16, dtype=torch.float32, gen=gen) for _ in range(4))
    mask = torch.zeros(40, 40)
    mask[:, 30:] = float("-inf")  # partial and skipped tiles beside the NaN's
    mask[25, 3] = float("nan")
    mask = mask.to(runtime.DEVICE)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flashattn.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=is_causal)
    out.backward(do)
    full = mask + (torch.zeros(40, 40).masked_fill(~torch.ones(40, 40, dtype=torch.bool).tril(), float("-inf"))
                   .to(runtime.DEVICE) if is_causal else 0)
    ref_out, ref_grads = torch_reference(q, k, v, do, full)
    seen = torch.zeros(40, dtype=torch.bool, device=runtime.DEVICE)
    seen[:26 if is_causal else 30] = True  # the keys row 25 sees
    for name, ours, ref in zip(("output", "dq", "dk", "dv"), (out, *(t.grad for t in leaves)), (ref_out, *ref_grads),
                               strict=True):
        nan, ref_nan = ours.isnan(), ref.isnan()
        if name in ("dk", "dv"):
            assert nan[..., seen, :].all() and not (nan & ~ref_nan).any(), f"{name}: NaN at {nan.sum()} places"
        else:
            assert nan.any() and torch.equal(nan, ref_nan), f"{name}: NaN at {nan.sum()}, torch's at {ref_nan.sum()}"
        finite = ~ref_nan
        assert rel_error(ours[finite], ref[finite].to(ours.dtype)) < TOL[torch.float32], name


def test_sdpa_attn_mask_with_several_batch_dimensions():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (randn(2, 3, 2, 24, 16, dtype=torch.float32, gen=gen) for _ in range(3))
    mask = torch.rand(2, 1, 1, 24, 24, generator=gen) < 0.7  # broadcast along one batch dimension and the heads
    out = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                           attn_mask=mask.to(q.device))
    assert out.shape == q.shape and rel_error(out, ref.float()) < TOL[torch.float32]


@GPU
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_masks_at_full_size_on_gpu(dtype):
    gen = torch.Generator().manual_seed(11)
    q, do = (randn(1, 8, 4096, 128, dtype=dtype, gen=gen) for _ in range(2))
    k, v = (randn(1, 4, 4096, 128, dtype=dtype, gen=gen) for _ in range(2))
    out, grads = forward_backward(q, k, v, do, causal=True, window=(1023, 0))
    check(out, grads, *torch_reference(q, k, v, do, mb.window_mask(4096, 4096, (1023, 0), True, device=q.device)),
          dtype)


def test_dq_beside_dkdv_only_on_a_gpu_when_asked(monkeypatch):
    """``masked_backward.CONCURRENT_DQ`` (off by default) puts the dQ kernel on a second CUDA stream; never in the
    interpreter, never on a CPU tensor."""
    from flashattn.kernels import masked_backward

    assert masked_backward.CONCURRENT_DQ is False
    assert masked_backward._fork(torch.device("cpu")) is None
    monkeypatch.setattr(masked_backward, "CONCURRENT_DQ", True)
    assert masked_backward._fork(torch.device("cpu")) is None


@GPU
@pytest.mark.parametrize("kind", ["window", "documents", "attn_mask"])
def test_dq_beside_dkdv_gives_the_same_gradients_and_captures(kind, monkeypatch):
    """With dQ on a second stream: the gradients equal those of the kernels in turn (the same kernels), and a CUDA
    graph captures the backward (the side stream forks from and joins the capturing one) and replays it right."""
    from flashattn.kernels import masked_backward

    gen = torch.Generator().manual_seed(13)
    lengths = [1000, 17, 2000, 1079]
    q, k, v, do = (randn(1, 4, 4096, 64, dtype=torch.float16, gen=gen) for _ in range(4))
    if kind == "documents":
        cu = mb.cu_seqlens(lengths, q.device)
        q, k, v, do = (t[0].transpose(0, 1).contiguous() for t in (q, k, v, do))  # packed: (total, H, D)
        kw = dict(causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=2000, max_seqlen_k=2000)
    elif kind == "window":
        kw = dict(causal=True, window=(300, 0))
    else:
        kw = dict(attn_mask=(torch.rand(1, 1, 4096, 4096, generator=gen) < 0.3).to(q.device).expand(1, 4, -1, -1))
    o, lse = masking.masked_forward(q, k, v, **kw)
    in_turn = masking.masked_backward(q, k, v, o, lse, do, **kw)
    monkeypatch.setattr(masked_backward, "CONCURRENT_DQ", True)
    beside = masking.masked_backward(q, k, v, o, lse, do, **kw)
    assert all(torch.equal(a, b) for a, b in zip(in_turn, beside, strict=True))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = masking.masked_backward(q, k, v, o, lse, do, **kw)
    for t in captured:
        t.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(in_turn, captured, strict=True))


def test_a_dense_mask_takes_its_own_tiles(monkeypatch):
    """The blocks kernels (a dense attn_mask) have their own tile tables, chosen with the mask's dtype; windows and
    documents keep the window kernels' (no mask tile in shared memory)."""
    from flashattn.kernels import masked, masked_backward

    assert masked.mask_tile_bytes((128, 64), None) == 0
    assert masked.mask_tile_bytes((128, 64), torch.bool) == 2 * 128 * 64
    assert masked.mask_tile_bytes((128, 64), torch.float32) == 8 * 128 * 64
    for D in (64, 128):
        dense = masked.tiles_for(torch.float16, D, mode="gpu", mask=torch.bool)[0]
        assert dense == masked.MASK_FORWARD_TILES[D][0] != masked.tiles_for(torch.float16, D, mode="gpu")[0]
        assert (masked_backward.tiles_for("dkdv", torch.float16, D, mode="gpu", mask=torch.bool)[0]
                == masked_backward.MASK_DKDV_TILES[D][0] != masked_backward.tiles_for("dkdv", torch.float16, D,
                                                                                     mode="gpu")[0])
    asked = []
    forward_tiles, backward_tiles = masked.tiles_for, masked_backward.tiles_for
    monkeypatch.setattr(masked, "tiles_for", lambda *a, mask=None, **kw: asked.append(("fwd", mask))
                        or forward_tiles(*a, mask=mask, **kw))
    monkeypatch.setattr(masked_backward, "tiles_for", lambda kernel, *a, mask=None, **kw: asked.append((kernel, mask))
                        or backward_tiles(kernel, *a, mask=mask, **kw))
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (randn(1, 2, 40, 16, dtype=torch.float32, gen=gen) for _ in range(4))
    for mask, kwargs in ((torch.bool, dict(attn_mask=torch.rand(40, 40, generator=gen).to(runtime.DEVICE) < 0.5)),
                         (torch.float32, dict(attn_mask=torch.randn(40, 40, generator=gen).to(runtime.DEVICE))),
                         (None, dict(window=(7, 0), causal=True))):
        asked.clear()
        if "attn_mask" in kwargs:
            kwargs["attn_mask"] = kwargs["attn_mask"].expand(1, 2, 40, 40)
        o, lse = masking.masked_forward(q, k, v, **kwargs)
        masking.masked_backward(q, k, v, o, lse, do, **kwargs)
        assert asked == [("fwd", mask), ("dkdv", mask), ("dq", mask)], asked
