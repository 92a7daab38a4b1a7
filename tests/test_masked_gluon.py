"""Masked attention through fast's Gluon kernel (``fast_gluon.py``, Hopper only): a causal sliding window (its
WINDOW), a key-padding mask (KEY_MASK) and packed documents (DOCS). Which calls take it (on any machine), and on a
Hopper GPU its output, log-sum-exp and gradients against float64."""

import pytest
import torch
from helpers import TOL, rel_error
from hypothesis import given, settings
from hypothesis import strategies as st
from test_backward import grad_errors
from test_masked import torch_reference

import flashattn
from flashattn import masking, masking_gluon, runtime
from flashattn.kernels import fast_options, masked
from flashattn.kernels import mask_blocks as mb

HOPPER = pytest.mark.skipif(not fast_options.gluon_available(torch.float16, 64),
                            reason="needs a Hopper GPU and Triton's Gluon")


def test_which_windows_take_the_gluon_kernel(monkeypatch):
    """Only a causal window (left >= 0, right 0) over as many keys as queries, one K/V head per query head, inputs
    the kernel reads in place, no explicit tiles and no counts; everything else takes the Triton window kernel."""
    monkeypatch.setattr(masking_gluon, "gluon_available", lambda dtype, D: True)
    q = torch.randn(2, 4, 64, 64, dtype=torch.float16)
    window = masking.Spec(31, 0, True)
    assert masking_gluon.takes_gluon_window(q, q, q, window, None, None)
    assert masking_gluon.takes_gluon_window(q, q, q, masking.Spec(31, 0, False), None, None)  # (left, 0): the same mask
    wide = torch.randn(2, 4, 64, 128, dtype=torch.float16)[..., :64]  # rows 256 bytes apart: no layout it reads
    cu = torch.tensor([0, 64], dtype=torch.int32)
    for why, args in (("explicit tiles", (q, q, q, window, (64, 64, 4, 3), None)),
                      ("counts asked for", (q, q, q, window, None, {})),
                      ("no window (fast's causal)", (q, q, q, masking.Spec(-1, 0, True), None, None)),
                      ("a right side", (q, q, q, masking.Spec(31, 5, False), None, None)),
                      ("grouped K/V heads", (q, q[:, :2], q[:, :2], window, None, None)),
                      ("fewer keys than queries", (q, q[:, :, :32], q[:, :, :32], window, None, None)),
                      ("an input it cannot read in place", (wide, q, q, window, None, None)),
                      ("packed documents", (q, q, q, masking.Spec(31, 0, True, cu, cu, 64, 64), None, None)),
                      ("a dense mask", (q, q, q, masking.Spec(-1, -1, True, mask=torch.ones(2, 4, 64, 64) > 0),
                                        None, None))):
        assert not masking_gluon.takes_gluon_window(*args), why
    monkeypatch.setattr(masking_gluon, "gluon_available", lambda dtype, D: False)
    assert not masking_gluon.takes_gluon_window(q, q, q, window, None, None)


def _spy(monkeypatch) -> list:
    """The ``left`` of every Gluon window launch masking binds (once per problem; none bound or prepared before the
    test)."""
    from flashattn.kernels import fast_gluon

    calls, bind = [], fast_gluon.bind
    monkeypatch.setattr(masking_gluon, "_RUNS", {})
    monkeypatch.setattr(masking, "_FORWARD_RUNS", {})
    monkeypatch.setattr(fast_gluon, "bind", lambda *a, **kw: calls.append(kw.get("left")) or bind(*a, **kw))
    return calls


@HOPPER
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gluon_window_against_float64(dtype, D, monkeypatch):
    """Odd lengths (1, 17, 100, 1000), windows from one key (left 0) to wider than the sequence, B and H > 1."""
    calls = _spy(monkeypatch)
    gen = torch.Generator().manual_seed(D)
    cases = [(N, left) for N in (1, 17, 100, 1000) for left in (0, 1, 63, 64, 255, 2000)]
    for N, left in cases:
        q, k, v = (torch.randn(2, 3, N, D, generator=gen).to(runtime.DEVICE, dtype) for _ in range(3))
        o, lse = masking.masked_forward(q, k, v, causal=True, window=(left, 0))
        keep = mb.window_mask(N, N, (left, 0), True, device=q.device)
        s = (q.double() @ k.double().transpose(-1, -2) * D ** -0.5).masked_fill(~keep, float("-inf"))
        assert rel_error(o, (torch.softmax(s, -1) @ v.double()).to(dtype)) < TOL[dtype], (N, left)
        assert rel_error(lse, torch.logsumexp(s, -1).float()) < 1e-5, (N, left)
    # one bind per problem; a window wider than the sequence goes as its length (so it is the same problem)
    problems = list(dict.fromkeys((N, min(left, N)) for N, left in cases))
    assert calls == [left for _, left in problems]


@HOPPER
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gluon_window_gradients_at_full_size(dtype, monkeypatch):
    """``flashattn.attention(..., window=...)`` forward (Gluon) and backward (the Triton window kernels, from the
    Gluon forward's log-sum-exp), N = 4096 with a window of 1000 keys, and (B, N, H, D) inputs seen through
    ``transpose`` (read in place)."""
    calls = _spy(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 4096, 4, 128, generator=gen).to(runtime.DEVICE, dtype).transpose(1, 2)
                   for _ in range(4))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flashattn.attention(*leaves, variant="fast", causal=True, window=(999, 0))
    out.backward(do)
    ref_out, ref_grads = torch_reference(q, k, v, do, mb.window_mask(4096, 4096, (999, 0), True, device=q.device))
    assert calls == [999]
    assert rel_error(out, ref_out.to(dtype)) < TOL[dtype]
    assert max(grad_errors([t.grad for t in leaves], ref_grads)) < TOL[dtype]


@HOPPER
def test_a_bound_window_launch_serves_new_tensors_of_its_problem(monkeypatch):
    """The second call of a problem launches the launch bound by the first (no new bind) on its own tensors: its
    output is its inputs' attention, not the first call's; another window is another problem."""
    calls = _spy(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    N, D, dtype = 777, 64, torch.float16
    keep = mb.window_mask(N, N, (100, 0), True, device=runtime.DEVICE)
    for _ in range(3):
        q, k, v = (torch.randn(2, 3, N, D, generator=gen).to(runtime.DEVICE, dtype) for _ in range(3))
        o, lse = masking.masked_forward(q, k, v, causal=True, window=(100, 0))
        s = (q.double() @ k.double().transpose(-1, -2) * D ** -0.5).masked_fill(~keep, float("-inf"))
        assert rel_error(o, (torch.softmax(s, -1) @ v.double()).to(dtype)) < TOL[dtype]
        assert rel_error(lse, torch.logsumexp(s, -1).float()) < 1e-5
    assert calls == [100]
    masking.masked_forward(q, k, v, causal=True, window=(101, 0))
    assert calls == [100, 101]


# --- a key-padding mask on the Gluon kernel (fast_gluon.py's KEY_MASK; masked.GLUON_KEY_MASK_DIMS) -----------

def key_padding(lengths, N, device, holes=None):
    """A (B, 1, 1, N) boolean key-padding mask: sequence b keeps its first lengths[b] keys; with ``holes`` (a
    generator), also a random fifth of those dropped, a mask that is no prefix."""
    keep = torch.arange(N)[None, :] < torch.tensor(lengths)[:, None]
    if holes is not None:
        keep &= torch.rand(keep.shape, generator=holes) > 0.2
    return keep[:, None, None, :].to(device)


def test_which_masks_take_the_gluon_key_mask_kernel(monkeypatch):
    """Only a boolean mask that broadcasts over heads and queries ((B, 1, 1, S), as padding is given), causal or
    not, with as many keys as queries, one K/V head per query head, no explicit tiles and no counts, at a head
    dimension in masked.GLUON_KEY_MASK_DIMS (by default 64 and 128); everything else takes the dense mask's Triton
    kernel."""
    monkeypatch.setattr(masking_gluon, "gluon_available", lambda dtype, D: True)
    q128 = torch.randn(2, 4, 64, 128, dtype=torch.float16)
    assert masked.GLUON_KEY_MASK_DIMS == (64, 128) and masked.GLUON_KEY_MASK_BLOCKS
    assert masking_gluon.takes_gluon_key_mask(q128, q128, q128, masking.Spec(-1, -1, False, mask=key_padding(
        (64, 10), 64, "cpu").expand(2, 4, 64, 64)), None, None)
    monkeypatch.setattr(masked, "GLUON_KEY_MASK_DIMS", (64, 128))
    q = torch.randn(2, 4, 64, 64, dtype=torch.float16)
    pad = key_padding((64, 10), 64, "cpu")

    def spec(mask, causal=False, L=64, S=64):
        return masking.Spec(-1, -1, causal, mask=mask.expand(2, 4, L, S))

    assert masking_gluon.takes_gluon_key_mask(q, q, q, spec(pad), None, None)
    assert masking_gluon.takes_gluon_key_mask(q, q, q, spec(pad, causal=True), None, None)
    assert masking_gluon.takes_gluon_key_mask(q, q, q, spec(pad[:1]), None, None)  # one row for every sequence
    for why, args in (("a mask per query", (q, q, q, spec(torch.rand(2, 4, 64, 64) > 0.5), None, None)),
                      ("a mask per head", (q, q, q, spec(torch.rand(2, 4, 1, 64) > 0.5), None, None)),
                      ("a float mask", (q, q, q, spec(pad.float()), None, None)),
                      ("explicit tiles", (q, q, q, spec(pad), (64, 64, 4, 3), None)),
                      ("counts asked for", (q, q, q, spec(pad), None, {})),
                      ("grouped K/V heads", (q, q[:, :2], q[:, :2], spec(pad), None, None)),
                      ("fewer keys than queries", (q, q[:, :, :32], q[:, :, :32],
                                                   spec(key_padding((32, 10), 32, "cpu"), S=32), None, None)),
                      ("no mask (a window)", (q, q, q, masking.Spec(31, 0, True), None, None))):
        assert not masking_gluon.takes_gluon_key_mask(*args), why
    monkeypatch.setattr(masked, "GLUON_KEY_MASK_DIMS", (128,))  # a head dimension not listed: the Triton kernel
    assert not masking_gluon.takes_gluon_key_mask(q, q, q, spec(pad), None, None)


def test_key_mask_rows_are_bytes_and_ends():
    """The kernel's view of a key-padding mask: each sequence's row as bytes (no copy) and its last kept key + 1
    (0 when it keeps none), also for a mask with holes and for one row broadcast to every sequence."""
    holes = torch.Generator().manual_seed(0)
    for mask in (key_padding((5, 0, 17, 1), 17, "cpu"), key_padding((17, 9, 3, 12), 17, "cpu", holes),
                 key_padding((6,), 17, "cpu").expand(4, 1, 1, 17)):
        view = mask.expand(4, 3, 17, 17)
        rows, ends = masking_gluon.key_mask_rows(view)
        assert rows.dtype == torch.uint8 and rows.data_ptr() == mask.data_ptr()
        assert torch.equal(rows.bool(), mask[:, 0, 0].expand(4, 17))
        want = [max((j + 1 for j in range(17) if mask[min(b, mask.shape[0] - 1), 0, 0, j]), default=0)
                for b in range(4)]
        assert ends.dtype == torch.int32 and ends.tolist() == want


def _spy_key_mask(monkeypatch) -> list:
    """Whether each Gluon launch masking binds has a key mask (none bound before the test)."""
    from flashattn.kernels import fast_gluon

    calls, bind = [], fast_gluon.bind
    monkeypatch.setattr(masking_gluon, "_RUNS", {})
    monkeypatch.setattr(fast_gluon, "bind", lambda *a, **kw: calls.append(kw.get("key_mask") is not None)
                        or bind(*a, **kw))
    return calls


def test_key_mask_blocks_flag_the_partial_blocks():
    """KEY_MASK 2's ends: each row's end, then 1 for each block of keys where some key is dropped; S not a multiple
    of the block (the keys past S count as kept), holes in one block only, a row that keeps none."""
    holes = torch.Generator().manual_seed(1)
    for S, block_n in ((17, 4), (16, 4), (300, 128), (5, 128)):
        for mask in (key_padding((S, 0, S // 2 + 1, 1), S, "cpu"), key_padding((S, S, 3, S), S, "cpu", holes)):
            mask[0, 0, 0, S // 3] = False  # one dropped key inside an otherwise full row
            rows, ends = masking_gluon.key_mask_rows(mask)
            got = masking_gluon.key_mask_blocks(rows, ends, block_n)
            assert got.dtype == torch.int32 and got.shape == (4, 1 + -(-S // block_n)) and got.is_contiguous()
            assert torch.equal(got[:, 0], ends)
            for b in range(4):
                for j in range(got.shape[1] - 1):
                    want = not bool(mask[b, 0, 0, j * block_n:(j + 1) * block_n].all())
                    assert got[b, 1 + j].item() == want, (S, block_n, b, j)


@HOPPER
@pytest.mark.parametrize("blocks", [False, True], ids=["every block's bytes", "partial blocks' bytes"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gluon_key_padding_against_float64(dtype, D, blocks, monkeypatch):
    """N = 1000 (not a multiple of the blocks), B = 4, H = 3: lengths 1, a block ± 1 and N; a mask with holes, and
    one with a gap of 10 keys (one partial block among full ones); a sequence that keeps no key (output 0 and
    log-sum-exp +inf, as the Triton kernels store them); causal and not; the kernel reading every block's mask
    bytes (KEY_MASK 1) or only those the host flags partial (2). One bind per problem (a new mask of the same
    shapes is the same problem)."""
    monkeypatch.setattr(masked, "GLUON_KEY_MASK_DIMS", (64, 128))
    monkeypatch.setattr(masked, "GLUON_KEY_MASK_BLOCKS", blocks)
    calls = _spy_key_mask(monkeypatch)
    gen = torch.Generator().manual_seed(D)
    N = 1000
    cases = (((1, 127, 129, 1000), False, False), ((1000, 300, 64, 999), True, False),
             ((0, 1000, 500, 2), False, False), ((700, 1000, 129, 1), False, True),
             ((1000, 999, 640, 1000), "gap", False))
    for lengths, holes, causal in cases:
        q, k, v = (torch.randn(4, 3, N, D, generator=gen).to(runtime.DEVICE, dtype) for _ in range(3))
        keep = key_padding(lengths, N, runtime.DEVICE, gen if holes is True else None)
        if holes == "gap":
            keep[:2, ..., 300:310] = False
        full = keep.expand(4, 3, N, N)
        if causal:
            full = full & torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
        o, lse = masking.masked_forward(q, k, v, causal=causal, attn_mask=keep.expand(4, 3, N, N))
        s = (q.double() @ k.double().transpose(-1, -2) * D ** -0.5).masked_fill(~full, float("-inf"))
        want = torch.nan_to_num(torch.softmax(s, -1)) @ v.double()
        assert rel_error(o, want.to(dtype)) < TOL[dtype], (lengths, holes, causal)
        seen = full.any(-1)
        assert rel_error(lse[seen], torch.logsumexp(s, -1)[seen].float()) < 1e-5, (lengths, holes, causal)
        assert torch.all(lse[~seen] == float("inf")) and torch.all(o[~seen] == 0), (lengths, holes, causal)
    assert calls == [True, True]  # the three non-causal cases are one problem, the causal one another


@HOPPER
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gluon_key_padding_gradients_through_the_drop_in(dtype, monkeypatch):
    """The drop-in with a (B, 1, 1, S) boolean attn_mask, as a model pads its batch: forward on the Gluon kernel, the
    backward on the dense mask's Triton kernels (from the Gluon forward's log-sum-exp), N = 4096, (B, N, H, D)
    inputs seen through ``transpose`` (read in place), against float64."""
    calls = _spy_key_mask(monkeypatch)  # D = 128: on by default
    gen = torch.Generator().manual_seed(4)
    q, k, v, do = (torch.randn(3, 4096, 4, 128, generator=gen).to(runtime.DEVICE, dtype).transpose(1, 2)
                   for _ in range(4))
    keep = key_padding((4096, 1500, 77), 4096, runtime.DEVICE)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flashattn.scaled_dot_product_attention(*leaves, attn_mask=keep)
    out.backward(do)
    ref_out, ref_grads = torch_reference(q, k, v, do, keep)
    assert calls == [True]
    assert rel_error(out, ref_out.to(dtype)) < TOL[dtype]
    assert max(grad_errors([t.grad for t in leaves], ref_grads)) < TOL[dtype]


# --- packed documents on the Gluon kernel (fast_gluon.py's DOCS; masked.GLUON_DOCUMENTS_DIMS) ----------------------

def test_which_packed_documents_take_the_gluon_kernel(monkeypatch):
    """Only packed documents with one cu_seqlens tensor for queries and keys (each document attends to itself), no
    window, causal or not, at a head dimension in masked.GLUON_DOCUMENTS_DIMS (D = 128 by default), one K/V head per
    query head, no explicit tiles and no counts."""
    monkeypatch.setattr(masking_gluon, "gluon_available", lambda dtype, D: True)
    q = torch.randn(1, 4, 64, 128, dtype=torch.float16)
    cu = torch.tensor([0, 20, 64], dtype=torch.int32)
    docs = masking.Spec(-1, 0, True, cu, cu, 44, 44)
    assert masked.GLUON_DOCUMENTS_DIMS == (128,)
    assert not masking_gluon.takes_gluon_documents(q[..., :64], q[..., :64], q[..., :64], docs, None, None)
    monkeypatch.setattr(masked, "GLUON_DOCUMENTS_DIMS", ())
    assert not masking_gluon.takes_gluon_documents(q, q, q, docs, None, None)
    monkeypatch.setattr(masked, "GLUON_DOCUMENTS_DIMS", (64, 128))
    assert masking_gluon.takes_gluon_documents(q, q, q, docs, None, None)
    assert masking_gluon.takes_gluon_documents(q, q, q, masking.Spec(-1, -1, False, cu, cu, 44, 44), None, None)
    for why, args in (("two cu_seqlens tensors", (q, q, q, masking.Spec(-1, 0, True, cu, cu.clone(), 44, 44), None,
                                                  None)),
                      ("a window", (q, q, q, masking.Spec(15, 0, True, cu, cu, 44, 44), None, None)),
                      ("a right side", (q, q, q, masking.Spec(-1, 5, False, cu, cu, 44, 44), None, None)),
                      ("explicit tiles", (q, q, q, docs, (64, 64, 4, 3), None)),
                      ("counts asked for", (q, q, q, docs, None, {})),
                      ("grouped K/V heads", (q, q[:, :2], q[:, :2], docs, None, None)),
                      ("not packed", (q, q, q, masking.Spec(-1, 0, True), None, None))):
        assert not masking_gluon.takes_gluon_documents(*args), why
    monkeypatch.setattr(masked, "GLUON_DOCUMENTS_DIMS", (64,))
    assert not masking_gluon.takes_gluon_documents(q, q, q, docs, None, None)


def _spy_documents(monkeypatch) -> list:
    """The number of documents of each Gluon launch masking binds (None: not documents; none bound before)."""
    from flashattn.kernels import fast_gluon

    calls, bind = [], fast_gluon.bind
    monkeypatch.setattr(masking_gluon, "_RUNS", {})
    monkeypatch.setattr(fast_gluon, "bind", lambda *a, **kw: calls.append(kw.get("docs")) or bind(*a, **kw))
    return calls


@HOPPER
@pytest.mark.parametrize("schedule", ["specialized", "persistent"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gluon_documents_against_float64(dtype, D, schedule, monkeypatch):
    """Packed documents of 1, 127, 128, 129, 0, 300 and 2000 rows (a tile of 128 rows ± 1, an empty one), 3 heads,
    causal and not: output and log-sum-exp against float64 with the documents' dense mask; then the gradients
    through ``attention_varlen`` (the Triton backward, from the Gluon forward's log-sum-exp)."""
    monkeypatch.setattr(masked, "GLUON_DOCUMENTS_DIMS", (64, 128))
    monkeypatch.setattr(masked, "GLUON_DOCUMENTS_BACKWARD_DIMS", ())  # the Triton backward (the Gluon one: below)
    monkeypatch.setattr(masked, "GLUON_DOCUMENTS", {**masked.GLUON_DOCUMENTS,
                                                    D: dict(masked.GLUON_DOCUMENTS[D], schedule=schedule)})
    calls = _spy_documents(monkeypatch)
    gen = torch.Generator().manual_seed(D)
    lengths = (1, 127, 128, 129, 0, 300, 2000)
    total, cu = sum(lengths), mb.cu_seqlens(lengths, runtime.DEVICE)
    q, k, v, do = (torch.randn(total, 3, D, generator=gen).to(runtime.DEVICE, dtype) for _ in range(4))
    packed = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v, do)]  # (1, H, total, D) views
    for causal in (True, False):
        mask = mb.document_mask(lengths, causal=causal, device=runtime.DEVICE)
        o, lse = masking.masked_forward(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=2000,
                                        max_seqlen_k=2000)
        ref_out, ref_grads = torch_reference(*packed, mask)
        assert rel_error(o, ref_out[0].transpose(0, 1).to(dtype)) < TOL[dtype], causal
        s = (packed[0].double() @ packed[1].double().transpose(-1, -2) * D ** -0.5).masked_fill(~mask, float("-inf"))
        assert rel_error(lse, torch.logsumexp(s, -1)[0].float()) < 1e-5, causal
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = flashattn.attention_varlen(*leaves, cu, cu, 2000, 2000, causal=causal)
        out.backward(do)
        assert rel_error(out, ref_out[0].transpose(0, 1).to(dtype)) < TOL[dtype], causal
        grads = [t.grad.transpose(0, 1).unsqueeze(0) for t in leaves]
        assert max(grad_errors(grads, ref_grads)) < TOL[dtype], causal
    assert calls == [7, 7]  # one bind per problem: causal, then not


def test_which_packed_documents_take_the_gluon_backward(monkeypatch):
    """The backward takes the Gluon kernel where the forward would (its own switch:
    masked.GLUON_DOCUMENTS_BACKWARD_DIMS, D = 128 by default) and dO is read in place too."""
    monkeypatch.setattr(masking_gluon, "gluon_available", lambda dtype, D: True)
    q = torch.randn(1, 4, 64, 128, dtype=torch.float16)
    cu = torch.tensor([0, 20, 64], dtype=torch.int32)
    docs = masking.Spec(-1, 0, True, cu, cu, 44, 44)
    assert masked.GLUON_DOCUMENTS_BACKWARD_DIMS == (128,)
    monkeypatch.setattr(masked, "GLUON_DOCUMENTS_BACKWARD_DIMS", ())
    assert not masking_gluon.takes_gluon_documents_backward(q, q, q, q, docs, None, None)
    monkeypatch.setattr(masked, "GLUON_DOCUMENTS_BACKWARD_DIMS", (128,))
    assert masking_gluon.takes_gluon_documents_backward(q, q, q, q, docs, None, None)
    wide = torch.randn(1, 4, 64, 256, dtype=torch.float16)[..., :128]  # rows 512 bytes apart: no layout it reads
    for why, args in (("a dO it cannot read in place", (q, q, q, wide, docs, None, None)),
                      ("explicit tiles", (q, q, q, q, docs, (64, 64, 4, 3), None)),
                      ("two cu_seqlens tensors", (q, q, q, q, masking.Spec(-1, 0, True, cu, cu.clone(), 44, 44), None,
                                                  None)),
                      ("a window", (q, q, q, q, masking.Spec(15, 0, True, cu, cu, 44, 44), None, None))):
        assert not masking_gluon.takes_gluon_documents_backward(*args), why


@HOPPER
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gluon_documents_backward_against_float64(dtype, D, monkeypatch):
    """Both directions of packed documents on the Gluon kernels (documents of 1, 127, 128, 129, 0, 300 and 2000
    rows: key tiles of 128 ± 1, an empty one), causal and not, through ``attention_varlen``: output and gradients
    against float64. One bind of each kernel per problem."""
    from flashattn.kernels import fast_backward_gluon as fbg

    monkeypatch.setattr(masked, "GLUON_DOCUMENTS_DIMS", (64, 128))
    monkeypatch.setattr(masked, "GLUON_DOCUMENTS_BACKWARD_DIMS", (64, 128))
    forward = _spy_documents(monkeypatch)
    backward, bind = [], fbg.bind
    monkeypatch.setattr(fbg, "bind", lambda *a, **kw: backward.append(kw.get("docs")) or bind(*a, **kw))
    gen = torch.Generator().manual_seed(D + 1)
    lengths = (1, 127, 128, 129, 0, 300, 2000)
    total, cu = sum(lengths), mb.cu_seqlens(lengths, runtime.DEVICE)
    q, k, v, do = (torch.randn(total, 3, D, generator=gen).to(runtime.DEVICE, dtype) for _ in range(4))
    packed = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v, do)]  # (1, H, total, D) views
    for causal in (True, False):
        ref_out, ref_grads = torch_reference(*packed, mb.document_mask(lengths, causal=causal, device=runtime.DEVICE))
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = flashattn.attention_varlen(*leaves, cu, cu, 2000, 2000, causal=causal)
        out.backward(do)
        assert rel_error(out, ref_out[0].transpose(0, 1).to(dtype)) < TOL[dtype], causal
        grads = [t.grad.transpose(0, 1).unsqueeze(0) for t in leaves]
        assert all(g.is_contiguous() for g in (t.grad for t in leaves))
        assert max(grad_errors(grads, ref_grads)) < TOL[dtype], causal
    assert forward == [7, 7] and backward == [7, 7]


@HOPPER
@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(0, 700), min_size=1, max_size=6).filter(any), causal=st.booleans(),
       heads=st.integers(1, 3), dtype=st.sampled_from([torch.float16, torch.bfloat16]), seed=st.integers(0, 2**16))
def test_gluon_documents_hypothesis(lengths, causal, heads, dtype, seed):
    """Packed documents at D = 128 as ``attention_varlen`` runs them by default (the Gluon forward and backward, the
    block table built on the GPU): random lengths (1, empty documents, anything around a tile of 128), both
    directions against float64."""
    assert 128 in masked.GLUON_DOCUMENTS_DIMS and 128 in masked.GLUON_DOCUMENTS_BACKWARD_DIMS
    gen = torch.Generator().manual_seed(seed)
    total, cu, longest = sum(lengths), mb.cu_seqlens(lengths, runtime.DEVICE), max(lengths)
    q, k, v, do = (torch.randn(total, heads, 128, generator=gen).to(runtime.DEVICE, dtype) for _ in range(4))
    packed = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v, do)]
    ref_out, ref_grads = torch_reference(*packed, mb.document_mask(lengths, causal=causal, device=runtime.DEVICE))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flashattn.attention_varlen(*leaves, cu, cu, longest, longest, causal=causal)
    out.backward(do)
    assert rel_error(out, ref_out[0].transpose(0, 1).to(dtype)) < TOL[dtype]
    assert max(grad_errors([t.grad.transpose(0, 1).unsqueeze(0) for t in leaves], ref_grads)) < TOL[dtype]


def test_the_gluon_kernels_refuse_documents_they_cannot_run():
    """Packed documents are one (1, H, total, D) sequence: both kernels refuse B > 1 by name, the forward also a
    window and a schedule without warp specialization (before anything reaches a GPU)."""
    from flashattn.kernels import fast_backward_gluon, fast_gluon

    q = torch.randn(2, 4, 64, 64, dtype=torch.float16)
    lse = q[..., 0].float()
    opts = fast_options.FastOptions(gluon=True, autotune=False, use_tma=True, **masked.GLUON_DOCUMENTS[64])
    single = fast_options.FastOptions(gluon=True, autotune=False, use_tma=True, **masked.GLUON_WINDOW[64])
    for named, args, kw in (("got B = 2", (q, q, q, q, lse, True, 0.1, True, opts), {}),
                            ("left = 5", (q[:1], q[:1], q[:1], q[:1], lse[:1], True, 0.1, True, opts), dict(left=5)),
                            ("schedule 'single'", (q[:1], q[:1], q[:1], q[:1], lse[:1], True, 0.1, True, single), {})):
        with pytest.raises(ValueError, match=f"packed documents take B = 1.*{named}"):
            fast_gluon.bind(*args, docs=3, **kw)
    with pytest.raises(ValueError, match=r"packed documents take B = 1 \(got 2\)"):
        fast_backward_gluon.bind(q, q, q, lse, q, lse, causal=True, scale=0.1, docs=3)
