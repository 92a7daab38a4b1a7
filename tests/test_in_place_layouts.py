"""q, k, v as a model hands them (views of (B, N, H, D) memory, slices of one fused QKV projection) reach the
kernels without copies (issue 28, point 3): which layouts the Gluon kernels read in place, the output and the
gradients laid out like the inputs (so that the model's ``.transpose(1, 2)`` is free), delta read through
strides, and on a Hopper GPU the forward and backward on such views against float64 with every copy forbidden."""

import pytest
import torch
from helpers import TOL, rel_error

import flashattn
from flashattn import runtime
from flashattn.kernels import descriptors, fast_backward
from flashattn.kernels.fast import attention_fast
from flashattn.kernels.fast_options import gluon_available

HOPPER = pytest.mark.skipif(not gluon_available(torch.float16, 64), reason="needs a Hopper GPU and Triton's Gluon")


def fused(B, N, H, D, dtype, seed, parts=3):
    """q, k, v (B, H, N, D): slices of one (B, N, parts·H·D) projection, viewed as (B, N, H, D), transposed."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, parts * H * D, generator=gen).to(runtime.DEVICE, dtype)
    return [p.view(B, N, H, D).transpose(1, 2) for p in x.split(H * D, dim=-1)]


def test_which_layouts_are_read_in_place():
    contiguous = torch.empty(2, 3, 16, 64, dtype=torch.float16)
    bnhd = torch.empty(2, 16, 3, 64, dtype=torch.float16).transpose(1, 2)
    q, k, v = fused(2, 16, 3, 64, torch.float16, seed=0)
    assert descriptors.heads_in_columns(contiguous, contiguous) is False
    assert descriptors.heads_in_columns(bnhd) is True and descriptors.heads_in_columns(q, k, v, bnhd) is True
    assert descriptors.heads_in_columns(contiguous, bnhd) is None  # not alike: the caller copies
    assert descriptors.heads_in_columns(torch.empty(2 * 3 * 16 * 64 + 8, dtype=torch.float16)[1:][:6144]
                                        .view(2, 3, 16, 64)) is None  # 2 bytes past a 16-byte boundary
    assert descriptors.heads_in_columns(torch.empty(2, 16, 64, 3, dtype=torch.float16).permute(0, 3, 1, 2)) is None
    gap = torch.empty(2, 16, 3, 72, dtype=torch.float16)[..., :64].transpose(1, 2)  # heads not side by side
    assert descriptors.heads_in_columns(gap) is None
    odd_rows = torch.empty(2, 16, 3 * 64 + 4, dtype=torch.float16)[..., :192].view(2, 16, 3, 64).transpose(1, 2)
    assert descriptors.heads_in_columns(odd_rows) is None  # rows of 392 bytes: not 16-byte aligned
    assert descriptors._bnhd_row_stride(q) == 3 * 3 * 64  # the fused projection's row


def test_gluon_descriptors_of_a_fused_projection():
    pytest.importorskip("triton.experimental.gluon", reason="Triton without Gluon")
    from flashattn.kernels import triton_compat as tc
    if not tc.HAS_GLUON:
        pytest.skip(f"Gluon incomplete: {tc.MISSING}")
    q, k, v = fused(2, 16, 3, 64, torch.float16, seed=1)
    desc = descriptors.gluon_heads(k, 64, True)
    assert list(desc.shape) == [2 * 16, 3 * 64] and list(desc.strides) == [9 * 64, 1]
    assert list(desc.block_shape) == [64, 64] and desc.base.data_ptr() == k.data_ptr()
    rows = descriptors.gluon_heads(q.contiguous(), 64, False)
    assert list(rows.shape) == [2 * 3 * 16, 64]


@pytest.mark.parametrize("shape", [(2, 3, 17, 16), (1, 2, 100, 32), (3, 1, 1, 64)])
def test_delta_reads_strided_outputs(shape):
    B, H, N, D = shape
    o, do = fused(B, N, H, D, torch.float32, seed=N, parts=2)
    want = (o.double() * do.double()).sum(-1)
    got = fast_backward.delta_rows(o, do)
    assert got.shape == (B, H, N) and got.is_contiguous()
    assert rel_error(got, want) < 1e-6
    flat = fast_backward.delta_rows(o.contiguous().view(B * H, N, D), do.contiguous().view(B * H, N, D))
    assert flat.shape == (B * H, N) and rel_error(flat.view(B, H, N), want) < 1e-6


@pytest.mark.parametrize("in_columns", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 17, 16), (1, 2, 100, 64)])
def test_the_delta_kernel_zeroes_dq_sums_through_their_strides(shape, in_columns):
    """The Gluon backward adds dQ into float32 sums; bwd_preprocess_fast zeroes them (no launch of their own), for
    sums laid out as the inputs: contiguous, or (B, N, H, D) memory seen as (B, H, N, D)."""
    B, H, N, D = shape
    o, do = fused(B, N, H, D, torch.float32, seed=N + D, parts=2)
    if not in_columns:
        o, do = o.contiguous(), do.contiguous()
    sums = torch.full((B, N, H, D) if in_columns else (B, H, N, D), float("nan"), device=o.device)
    sums = sums.transpose(1, 2) if in_columns else sums
    spare = torch.full_like(sums, float("nan"))  # a tensor with the same strides, not given: left as it is
    run = fast_backward.bind_delta(o, do, sums)
    got = run(o, do, sums)
    assert rel_error(got, (o.double() * do.double()).sum(-1)) < 1e-6
    assert not sums.isnan().any() and not sums.any(), "every sum zeroed"
    assert spare.isnan().all()
    run(o, do, spare)
    assert not spare.any()


def test_the_output_is_laid_out_like_the_model_view():
    q, k, v = fused(2, 33, 3, 16, torch.float32, seed=2)
    out = attention_fast(q, k, v, causal=True)
    assert out.transpose(1, 2).is_contiguous()  # the model's y.transpose(1, 2).reshape(B, N, C) copies nothing
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert rel_error(out, want) < TOL[torch.float32]
    contiguous = attention_fast(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert contiguous.is_contiguous()


@HOPPER
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_reads_a_fused_projection_in_place_on_gpu(monkeypatch, D, dtype, causal):
    """Forward and backward of the drop-in on slices of a fused projection (B, H > 1; N = 384, a multiple of the
    backward's 128 keys, and 1000 for the forward's ragged tail), with every copy path forbidden."""

    def no_copy(x):
        raise AssertionError(f"copied a {tuple(x.shape)} input with strides {x.stride()}")

    monkeypatch.setattr(descriptors, "tma_ready", no_copy)
    for N in (384, 1000):
        q, k, v = (t.detach().requires_grad_() for t in fused(2, N, 3, D, dtype, seed=N + D))
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert out.transpose(1, 2).is_contiguous()
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
        assert rel_error(out, ref) < TOL[dtype], N
        if N % 128:
            continue
        do = torch.randn(2, N, 3, D, device="cuda", dtype=dtype).transpose(1, 2)  # as the model's gradient comes
        out.backward(do)
        ref.backward(do.double())
        for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), (q64.grad, k64.grad, v64.grad), strict=True):
            assert rel_error(got, want) < 4 * TOL[dtype], (N, name)


@HOPPER
def test_a_prepared_problem_is_right_on_new_data_on_gpu():
    """The second call of a problem (same shapes, strides, dtypes, alignment) takes the prepared path: bound launches,
    descriptors rebased onto the new tensors. Fresh data must give fresh, right results, forward and backward."""
    for seed in (1, 2, 3):
        q, k, v = (t.detach().requires_grad_() for t in fused(2, 256, 4, 64, torch.float16, seed=seed))
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
        do = torch.randn_like(out)
        out.backward(do)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
        ref.backward(do.double())
        assert rel_error(out, ref) < TOL[torch.float16], seed
        for got, want in zip((q.grad, k.grad, v.grad), (q64.grad, k64.grad, v64.grad), strict=True):
            assert rel_error(got, want) < 4 * TOL[torch.float16], seed


@HOPPER
def test_the_backward_is_right_for_each_layout_of_do_on_gpu():
    """The eager drop-in keeps the backward's bound launches on the forward's prepared problem, one per layout of dO
    (its strides and alignment). dO laid out as (B, H, N, D), as (B, N, H, D) memory seen through transpose, and
    contiguous again, on the same forward problem: each backward must be right, none reusing another's launch."""
    B, N, H, D = 2, 256, 4, 64
    layouts = {"contiguous": lambda t: t.contiguous(),
               "(B, N, H, D) view": lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)}
    for step, name in enumerate(("contiguous", "(B, N, H, D) view", "contiguous", "(B, N, H, D) view")):
        q, k, v = (t.detach().requires_grad_() for t in fused(B, N, H, D, torch.float16, seed=10 + step))
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
        do = layouts[name](torch.randn_like(out))
        assert do.is_contiguous() == (name == "contiguous")
        out.backward(do)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True).backward(do.double())
        for got, want in zip((q.grad, k.grad, v.grad), (q64.grad, k64.grad, v64.grad), strict=True):
            assert rel_error(got, want) < 4 * TOL[torch.float16], (step, name)


@HOPPER
@pytest.mark.parametrize("window", [None, (200, 0)])
def test_a_prepared_problem_keeps_none_of_its_first_calls_tensors_on_gpu(window):
    """The bound launches kept per problem (the drop-in's forward and backward, a window's forward) hold descriptor
    templates: layouts and strides, not the tensors they were made from. The first training step of a new problem
    (which prepares it), its tensors then dropped, must give back all their memory."""
    B, N, H, D = 1, 4096 + 64 * (window is not None), 4, 64  # a problem of its own (not prepared by another test)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    q, k, v = (t.detach().requires_grad_() for t in fused(B, N, H, D, torch.float16, seed=0))
    if window is None:
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        out = flashattn.attention(q, k, v, variant="fast", causal=True, window=window)
    out.backward(torch.randn_like(out))
    del q, k, v, out
    torch.cuda.synchronize()
    one_input = B * N * H * D * 2
    assert torch.cuda.memory_allocated() - before < one_input, "a prepared problem keeps a tensor of its first call"
