"""The backward kernels: the teaching one (kernels/backward.py) and the fast one (kernels/fast_backward.py).

Gradients are compared with torch's autograd in float64 (its own scaled_dot_product_attention), on the same
inputs rounded to the kernel's dtype. The kernels are fed the forward's O and log-sum-exp computed in float64
too, so that these tests check the backward alone (test_functional.py checks forward and backward together).

Tolerances (relative error ‖g − ref‖ / ‖ref‖, per dtype, from helpers.TOL): float32 runs IEEE float32
products throughout (measured ~3e-7; 1e-5 allows for long sums); float16 rounds P and dS to 16 bits before
the second products, as the forward rounds P (measured 3e-4; 3e-3); bfloat16 has 3 fewer mantissa bits
(2e-2). Where a gradient is exactly zero (every query sees one key: the softmax is constant), its norm is
measured against ‖dV‖ instead: dQ and dK are then sums of terms of dV's size that cancel exactly.
"""

import pytest
import torch
from helpers import DTYPES, TOL
from hypothesis import given
from hypothesis import strategies as st

from flashattn import runtime
from flashattn.kernels import fast_backward
from flashattn.kernels.backward import attention_backward
from flashattn.kernels.fast_backward import attention_backward_fast, padded_head_dim, tuning_space
from flashattn.kernels.v2 import attention_v2
from flashattn.reference import rel_error

GPU = pytest.mark.skipif(runtime.MODE != "gpu", reason="needs a GPU")


def make_inputs(B, HQ, HKV, L, S, D, dtype, seed, contiguous=True):
    """q, k, v, dO rounded to ``dtype``; non-contiguous ones are (B, N, H, D) storage seen as (B, H, N, D)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(H, N):
        if contiguous:
            return torch.randn(B, H, N, D, generator=gen).to(device=runtime.DEVICE, dtype=dtype)
        return torch.randn(B, N, H, D, generator=gen).transpose(1, 2).to(device=runtime.DEVICE, dtype=dtype)

    return rand(HQ, L), rand(HKV, S), rand(HKV, S), rand(HQ, L)


def reference_grads(q, k, v, do, causal, scale=None):
    """(O, lse, dq, dk, dv) in float64 by torch's autograd (GQA by repeat_interleave, causal top-left)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q64 @ kk.transpose(-1, -2)) * scale
    if causal:
        L, S = q.shape[2], k.shape[2]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    o = torch.softmax(s, -1) @ vv
    o.backward(do.double())
    return o.detach(), torch.logsumexp(s, -1).detach(), q64.grad, k64.grad, v64.grad


def grad_errors(grads, ref):
    """Relative errors of dq, dk, dv. A reference that is zero, exactly or up to float64 rounding (with one key,
    softmax is constant and dq = dk = 0, which float64 autograd returns as ~1e-17), has no relative error: it
    is measured against ‖dv‖ instead."""
    errs = []
    dv_norm = ref[2].norm().item()
    for g, r in zip(grads, ref, strict=True):
        assert g.shape == r.shape and g.dtype != torch.float64, (g.shape, r.shape, g.dtype)
        assert torch.isfinite(g).all(), "gradient has NaN or inf"
        scale = r.norm().item()
        if scale <= 1e-12 * dv_norm:
            scale = dv_norm
        errs.append((g.double() - r).norm().item() / scale)
    return errs


def run_backward(kernel, q, k, v, do, causal, **options):
    o64, lse64, *ref = reference_grads(q, k, v, do, causal)
    grads = kernel(q, k, v, o64.to(q.dtype), lse64.float(), do, causal=causal, **options)
    return grad_errors(grads, ref)


# --- the teaching backward ----------------------------------------------------------------------

@pytest.mark.parametrize("N", [1, 17, 100])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_teaching_backward(N, causal, dtype):
    q, k, v, do = make_inputs(2, 3, 3, N, N, 32, dtype, seed=N)
    assert max(run_backward(attention_backward, q, k, v, do, causal)) < TOL[dtype]


@pytest.mark.parametrize("D", [16, 64])
def test_teaching_backward_head_dims_blocks_and_strides(D):
    q, k, v, do = make_inputs(1, 2, 2, 70, 70, D, torch.float32, seed=D, contiguous=False)
    for tiles in (dict(block_m=16, block_n=32), dict(block_m=32, block_n=16)):  # tails and diagonals both ways
        assert max(run_backward(attention_backward, q, k, v, do, True, **tiles)) < TOL[torch.float32]


def test_teaching_backward_from_v2_forward():
    q, k, v, do = make_inputs(2, 2, 2, 45, 45, 32, torch.float16, seed=3)
    o, lse = attention_v2(q, k, v, causal=True, return_lse=True)
    _, lse64, *ref = reference_grads(q, k, v, do, True)
    assert (lse.double() - lse64).abs().max().item() < 1e-3
    assert max(grad_errors(attention_backward(q, k, v, o, lse, do, causal=True), ref)) < TOL[torch.float16]


def test_teaching_backward_refuses_bad_inputs():
    q, k, v, do = make_inputs(1, 2, 2, 8, 8, 16, torch.float32, seed=0)
    o, lse = attention_v2(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="lse must be"):
        attention_backward(q, k, v, o, lse[:, :1], do)
    with pytest.raises(ValueError, match="do must be a tensor like q"):
        attention_backward(q, k, v, o, lse, do[..., :8])
    with pytest.raises(ValueError, match="q, k and v must have the same shape"):
        attention_backward(q, k[:, :, :4], v, o, lse, do)
    with pytest.raises(TypeError, match="unknown option"):
        attention_backward(q, k, v, o, lse, do, block_k=16)
    with pytest.raises(TypeError, match="return_lse"):
        attention_v2(q, k, v, return_lse=1)


# --- the fast backward --------------------------------------------------------------------------

@given(
    B=st.integers(1, 2), HKV=st.integers(1, 2), group=st.sampled_from([1, 2, 3]),
    L=st.integers(1, 200), S=st.integers(1, 200), D=st.sampled_from([16, 24, 40, 64, 80, 96]),
    causal=st.booleans(), contiguous=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float16]),
    dq_mode=st.sampled_from(["kernel", "atomic"]), seed=st.integers(0, 2**16),
)
def test_fast_backward_property(B, HKV, group, L, S, D, causal, contiguous, dtype, dq_mode, seed):
    q, k, v, do = make_inputs(B, HKV * group, HKV, L, S, D, dtype, seed, contiguous)
    # small tiles: several blocks, ragged tails and diagonals even at these sizes
    tiles = dict(dkdv_tiles=(32, 16, 4, 1), dq_tiles=(16, 32, 4, 1)) if runtime.MODE == "interpreter" else {}
    errs = run_backward(attention_backward_fast, q, k, v, do, causal, dq_mode=dq_mode, **tiles)
    assert max(errs) < TOL[dtype], errs


@pytest.mark.parametrize("dq_mode", ["kernel", "atomic"])
@pytest.mark.parametrize("causal", [False, True])
def test_fast_backward_gqa_and_unequal_lengths(causal, dq_mode):
    for L, S in ((100, 37), (37, 100)):  # causal, L < S: the keys past L are seen by no query (zero dK, dV)
        q, k, v, do = make_inputs(2, 4, 2, L, S, 40, torch.float16, seed=L)
        errs = run_backward(attention_backward_fast, q, k, v, do, causal, dq_mode=dq_mode)
        assert max(errs) < TOL[torch.float16], (L, S, errs)


@pytest.mark.parametrize("dq_mode", ["kernel", "atomic"])
def test_fast_backward_causal_with_key_blocks_wider_than_query_blocks(dq_mode):
    """dK/dV tiles with block_n > block_m: a K/V block's causal diagonal spans several Q blocks, all masked (the
    other tests' tiles have block_n <= block_m, where the diagonal is one Q block)."""
    q, k, v, do = make_inputs(1, 2, 2, 70, 70, 32, torch.float32, seed=11)
    errs = run_backward(attention_backward_fast, q, k, v, do, True, dq_mode=dq_mode,
                        dkdv_tiles=(16, 32, 4, 1), dq_tiles=(16, 32, 4, 1))
    assert max(errs) < TOL[torch.float32], errs


@pytest.mark.parametrize("D", [128, 200, 256])
def test_backward_large_head_dims(D):
    q, k, v, do = make_inputs(1, 2, 1, 20, 33, D, torch.float16, seed=D)
    assert max(run_backward(attention_backward_fast, q, k, v, do, True)) < TOL[torch.float16]
    if D in (128, 256):  # the teaching kernel takes v2's head dimensions (powers of two) and L = S
        q, k, v, do = make_inputs(1, 2, 2, 20, 20, D, torch.float16, seed=D)
        assert max(run_backward(attention_backward, q, k, v, do, False)) < TOL[torch.float16]


@GPU
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_kernels_are_deterministic_and_right_over_many_blocks_on_gpu(D, causal):
    """Without atomics each gradient is a sum in a fixed order: repeated runs agree bit for bit. N = 1024, so
    every program walks many blocks (the small tests above run one or two loop iterations). With two stages,
    Triton 3.6's pipelined loop raced in the teaching dK/dV kernel at D = 128 (tiles 32 x 64, 8 warps): dK
    changed from run to run, above the tolerance (see kernels/backward.default_options). The Gluon kernel adds
    into dQ atomically: its dK and dV are still sums in a fixed order, its dQ only agrees within rounding."""
    q, k, v, do = make_inputs(2, 4, 4, 1024, 1024, D, torch.float16, seed=128 + D)
    o64, lse64, *ref = reference_grads(q, k, v, do, causal)
    o, lse = o64.half(), lse64.float()
    kernels = (("teaching", attention_backward, {}), ("fast, Triton", attention_backward_fast, {"gluon": False}),
               ("fast, Gluon", attention_backward_fast, {"gluon": True}))
    for name, kernel, options in kernels:
        kernel(q, k, v, o, lse, do, causal=causal, **options)  # on a GPU the Triton one autotunes on its first call
        first, *again = (kernel(q, k, v, o, lse, do, causal=causal, **options) for _ in range(4))
        exact = slice(1, 3) if options.get("gluon") else slice(0, 3)
        for run in again:
            assert all(torch.equal(a, b) for a, b in zip(first[exact], run[exact], strict=True)), f"{name}: runs differ"
            assert rel_error(run[0], first[0]) < 1e-3, name
        assert max(grad_errors(first, ref)) < TOL[torch.float16], (name, grad_errors(first, ref))


@GPU
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_fast_backward_gluon_small_problems_on_gpu(dtype, D, causal):
    """The Gluon kernel at its smallest tiles (one and three 128-key programs per head, B and H > 1) and a
    length where the causal diagonal meets Q blocks of every kind."""
    for B, H, N in ((2, 3, 128), (1, 2, 384), (3, 1, 640)):
        q, k, v, do = make_inputs(B, H, H, N, N, D, dtype, seed=N + D)
        errs = run_backward(attention_backward_fast, q, k, v, do, causal, gluon=True)
        assert max(errs) < TOL[dtype], (B, H, N, errs)


@GPU
def test_fast_backward_gluon_takes_lse_as_any_view_on_gpu():
    """The kernel reads lse through the TMA engine (16-byte-aligned rows): an lse that is a view at an odd offset
    into a larger buffer, or a transposed one, gives the same gradients."""
    q, k, v, do = make_inputs(2, 2, 2, 256, 256, 64, torch.float16, seed=11)
    o64, lse64, *ref = reference_grads(q, k, v, do, True)
    o, lse = o64.half(), lse64.float()
    buffer = torch.empty(lse.numel() + 1, device=lse.device)
    shifted = buffer[1:].view(lse.shape)  # 4 bytes past an aligned start
    shifted.copy_(lse)
    transposed = lse.transpose(1, 2).contiguous().transpose(1, 2)
    for view in (shifted, transposed):
        grads = attention_backward_fast(q, k, v, o, view, do, causal=True, gluon=True)
        assert max(grad_errors(grads, ref)) < TOL[torch.float16]


def test_fast_backward_gluon_applies_only_where_it_can():
    """Which problems the Gluon kernel takes (shapes and dtypes only: meta tensors, no GPU needed)."""
    gluon = pytest.importorskip("flashattn.kernels.fast_backward_gluon", reason="Triton without Gluon")

    def why(B, HQ, HKV, L, S, D, dtype=torch.float16):
        return gluon.applies(torch.empty(B, HQ, L, D, dtype=dtype, device="meta"),
                             torch.empty(B, HKV, S, D, dtype=dtype, device="meta"), False)

    assert why(2, 3, 3, 128, 128, 64) is None and why(1, 1, 1, 4096, 4096, 128, torch.bfloat16) is None
    assert "multiples of 128" in why(1, 2, 2, 100, 100, 64)
    assert "head dimension 32" in why(1, 2, 2, 128, 128, 32)
    assert "grouped-query" in why(1, 4, 2, 128, 128, 64) and "L != S" in why(1, 2, 2, 128, 256, 64)
    assert "float32" in why(1, 2, 2, 128, 128, 64, torch.float32)


def test_fast_backward_gluon_path_host_side(monkeypatch):
    """The host side of the Gluon path, anywhere: with the kernel replaced by a stand-in that checks the ``delta``
    it is given and returns the float32 sums of dQ, ``attention_backward_fast`` scales and rounds them
    (``finish_dq``) and returns dk and dv as they are."""
    gluon = pytest.importorskip("flashattn.kernels.fast_backward_gluon", reason="Triton without Gluon")
    q, k, v, do = make_inputs(1, 2, 2, 128, 128, 64, torch.float16, seed=5)
    o64, lse64, *ref = reference_grads(q, k, v, do, False)
    o = o64.half()
    seen = {}

    def stand_in(q_, k_, v_, lse_, do_, delta_, *, causal, scale):  # fast_backward_gluon.bind: the kernel, bound

        def run(q_, k_, v_, lse_, do_, delta, dq_acc):
            seen["delta"], seen["scale"] = rel_error(delta, (o.double() * do.double()).sum(-1)), scale
            seen["zeroed"] = dq_acc.shape == q.shape and dq_acc.dtype == torch.float32 and not dq_acc.any()
            return dq_acc + (ref[0] / scale).float(), ref[1].to(q.dtype), ref[2].to(q.dtype)

        return run

    monkeypatch.setattr(fast_backward.device, "hopper", lambda: True)
    monkeypatch.setattr(gluon, "bind", stand_in)
    grads = attention_backward_fast(q, k, v, o, lse64.float(), do, gluon=True)
    assert seen["delta"] < 1e-3 and seen["scale"] == 64 ** -0.5 and max(grad_errors(grads, ref)) < TOL[torch.float16]
    assert seen["zeroed"]  # dQ's sums arrive zeroed (by the delta kernel), in the inputs' layout
    assert grads[0].dtype == torch.float16


@GPU
def test_fast_backward_gluon_falls_back_or_says_why_on_gpu():
    """Problems the Gluon kernel does not take run the Triton kernels by default; gluon=True names the reason."""
    cases = {"multiples of 128": (1, 2, 2, 200, 200, 64, torch.float16),
             "head dimension 96": (1, 2, 2, 256, 256, 96, torch.float16),
             "grouped-query": (1, 4, 2, 256, 256, 64, torch.float16),
             "L != S": (1, 2, 2, 128, 256, 64, torch.bfloat16),
             "float32": (1, 2, 2, 128, 128, 64, torch.float32)}
    for reason, (B, HQ, HKV, L, S, D, dtype) in cases.items():
        q, k, v, do = make_inputs(B, HQ, HKV, L, S, D, dtype, seed=L + D)
        assert max(run_backward(attention_backward_fast, q, k, v, do, True)) < TOL[dtype], reason
        with pytest.raises(ValueError, match=reason):
            run_backward(attention_backward_fast, q, k, v, do, True, gluon=True)
    q, k, v, do = make_inputs(1, 2, 2, 128, 128, 64, torch.float16, seed=0)
    with pytest.raises(ValueError, match="Triton kernels' options"):
        run_backward(attention_backward_fast, q, k, v, do, False, gluon=True, dq_mode="atomic")


def test_fast_backward_keys_no_query_sees_get_zero_gradients():
    q, k, v, do = make_inputs(1, 2, 1, 20, 90, 32, torch.float32, seed=1)
    o64, lse64, *_ = reference_grads(q, k, v, do, True)
    _, dk, dv = attention_backward_fast(q, k, v, o64.float(), lse64.float(), do, causal=True)
    assert dk[:, :, 20:].abs().max().item() == 0 and dv[:, :, 20:].abs().max().item() == 0
    assert dk[:, :, :20].abs().max().item() > 0


def test_fast_backward_spaces_and_padding():
    dims = (1, 16, 17, 40, 64, 96, 128, 200, 256)
    assert [padded_head_dim(D) for D in dims] == [16, 16, 32, 64, 64, 128, 128, 256, 256]
    for D in (16, 32, 64, 128, 256):
        for dtype in (torch.float16, torch.float32):
            for kernel, atomic in (("dkdv", False), ("dkdv", True), ("dq", False)):
                space = tuning_space(kernel, D, dtype, atomic)
                assert space and all(len(c) == 4 and c[2] in (4, 8) for c in space), (kernel, D, dtype, space)


def test_fast_backward_refuses_bad_inputs():
    q, k, v, do = make_inputs(1, 4, 2, 8, 8, 16, torch.float32, seed=0)
    o = torch.zeros_like(q)
    lse = torch.zeros(1, 4, 8, device=q.device)
    attention_backward_fast(q, k, v, o, lse, do)  # the good call
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        attention_backward_fast(q[:, :3], k, v, o[:, :3], lse[:, :3], do[:, :3])
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        attention_backward_fast(q, k, v[:, :, :4], o, lse, do)
    with pytest.raises(ValueError, match="lse must be"):
        attention_backward_fast(q, k, v, o, lse.double(), do)
    with pytest.raises(ValueError, match="head dimension D=300"):
        big = torch.zeros(1, 1, 4, 300, device=q.device)
        attention_backward_fast(big, big, big, big, torch.zeros(1, 1, 4, device=q.device), big)
    with pytest.raises(ValueError, match="dq_mode"):
        attention_backward_fast(q, k, v, o, lse, do, dq_mode="fast")
    with pytest.raises(ValueError, match="dkdv_tiles"):
        attention_backward_fast(q, k, v, o, lse, do, dkdv_tiles=(48, 16, 4, 1))
    with pytest.raises(TypeError, match="unknown option"):
        attention_backward_fast(q, k, v, o, lse, do, block_m=16)
    with pytest.raises(TypeError, match="gluon must be None, True or False"):
        attention_backward_fast(q, k, v, o, lse, do, gluon="yes")
    if runtime.MODE == "interpreter":
        with pytest.raises(ValueError, match="gluon=True needs a Hopper GPU"):
            attention_backward_fast(q, k, v, o, lse, do, gluon=True)
        with pytest.raises(ValueError, match="need a GPU"):
            attention_backward_fast(q, k, v, o, lse, do, use_tma=True)
        with pytest.raises(TypeError, match="bfloat16 is refused"):
            attention_backward_fast(*(t.bfloat16() for t in (q, k, v, o)), lse, do.bfloat16())


# --- on a GPU, at full size ---------------------------------------------------------------------

@GPU
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_kernels_full_size_on_gpu(dtype, D, causal):
    s = runtime.SIZES
    q, k, v, do = make_inputs(1, 4, 4, s.N, s.N, D, dtype, seed=D)
    o64, lse64, *ref = reference_grads(q, k, v, do, causal)
    o, lse = o64.to(dtype), lse64.float()
    for name, kernel, options in (("teaching", attention_backward, {}),
                                  ("fast, Gluon", attention_backward_fast, {"gluon": True}),
                                  ("fast, Triton", attention_backward_fast, {"dq_mode": "kernel"}),
                                  ("fast, Triton atomic", attention_backward_fast, {"dq_mode": "atomic"})):
        errs = grad_errors(kernel(q, k, v, o, lse, do, causal=causal, **options), ref)
        assert max(errs) < TOL[dtype], (name, errs)


@GPU
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fast_backward_gqa_padded_full_size_on_gpu(dtype):
    q, k, v, do = make_inputs(1, 8, 2, 3000, 4096, 96, dtype, seed=7)
    for causal in (False, True):
        errs = run_backward(attention_backward_fast, q, k, v, do, causal)
        assert max(errs) < TOL[dtype], (causal, errs)
