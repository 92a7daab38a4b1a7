"""flashattn.attention with autograd, and the drop-in flashattn.scaled_dot_product_attention.

Gradients against torch's autograd in float64 (torch's own scaled_dot_product_attention on the same inputs
rounded to the kernel's dtype); tolerances from helpers.TOL, with test_backward.py's measure of gradient
error (see there for the reasons).
"""

import pytest
import torch
from helpers import DTYPES, TOL, rel_error
from hypothesis import example, given
from hypothesis import strategies as st
from test_backward import grad_errors

import flashattn
from flashattn import runtime
from flashattn.functional import with_backward

GPU = pytest.mark.skipif(runtime.MODE != "gpu", reason="needs a GPU")


def leaf(t):
    return t.detach().clone().requires_grad_()


def torch_grads(q, k, v, do, causal, enable_gqa=False, scale=None, attn_mask=None):
    """Output and gradients by torch's own SDPA in float64."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, attn_mask=attn_mask, is_causal=causal,
                                                           scale=scale, enable_gqa=enable_gqa)
    out.backward(do.double())
    return out.detach(), (q64.grad, k64.grad, v64.grad)


def ours(fn, q, k, v, do, **kwargs):
    q, k, v = leaf(q), leaf(k), leaf(v)
    out = fn(q, k, v, **kwargs)
    out.backward(do)
    return out.detach(), (q.grad, k.grad, v.grad)


def randn(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen).to(device=runtime.DEVICE, dtype=dtype)


# --- flashattn.attention --------------------------------------------------------------------

@pytest.mark.parametrize("variant", with_backward())
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_attention_gradients(variant, causal, dtype):
    gen = torch.Generator().manual_seed(5)
    q, k, v, do = (randn(2, 3, 77, 32, dtype=dtype, gen=gen) for _ in range(4))
    out, grads = ours(flashattn.attention, q, k, v, do, variant=variant, causal=causal)
    ref_out, ref_grads = torch_grads(q, k, v, do, causal)
    assert rel_error(out, ref_out) < TOL[dtype]
    assert max(grad_errors(grads, ref_grads)) < TOL[dtype]


def test_attention_saves_no_n_by_n_tensor():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (leaf(randn(1, 2, 64, 16, dtype=torch.float32, gen=gen)) for _ in range(3))
    for variant in with_backward():
        out = flashattn.attention(q, k, v, variant=variant, causal=True)
        saved = out.grad_fn.saved_tensors
        assert len(saved) == 5, variant  # q, k, v, O and the log-sum-exp
        assert max(t.numel() for t in saved) == q.numel()  # nothing of size N×N (64·64 > 64·16)


def test_attention_without_gradients_runs_the_plain_forward():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (randn(1, 2, 20, 16, dtype=torch.float32, gen=gen).requires_grad_() for _ in range(3))
    with torch.no_grad():
        out = flashattn.attention(q, k, v, variant="v1")
    assert out.grad_fn is None and rel_error(out, flashattn.reference(q, k, v)) < TOL[torch.float32]


def test_backward_through_a_forward_only_variant_names_the_ones_with_a_backward():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (leaf(randn(1, 2, 20, 16, dtype=torch.float32, gen=gen)) for _ in range(3))
    out = flashattn.attention(q, k, v, variant="v1")  # the forward runs
    assert rel_error(out.detach(), flashattn.reference(q, k, v)) < TOL[torch.float32]
    with pytest.raises(RuntimeError, match="'v1' has no backward pass.*'v2', 'fast'"):
        out.sum().backward()


def test_attention_refuses_bad_arguments():
    q = torch.zeros(1, 1, 4, 16, device=runtime.DEVICE)
    with pytest.raises(ValueError, match="unknown variant"):
        flashattn.attention(q, q, q, variant="v9")
    with pytest.raises(TypeError, match="return_lse"):
        flashattn.attention(q, q, q, variant="fast", return_lse=True)


# --- the drop-in --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(40, 16), (3, 40, 16), (2, 3, 40, 16), (2, 2, 3, 40, 16)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_leading_dimensions(shape, causal):
    gen = torch.Generator().manual_seed(len(shape))
    q, k, v, do = (randn(*shape, dtype=torch.float32, gen=gen) for _ in range(4))
    out, grads = ours(flashattn.scaled_dot_product_attention, q, k, v, do, is_causal=causal)
    ref_out, ref_grads = torch_grads(q, k, v, do, causal)
    assert out.shape == ref_out.shape and rel_error(out, ref_out) < TOL[torch.float32]
    assert max(grad_errors(grads, ref_grads)) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sdpa_non_contiguous_inputs_and_scale(dtype):
    gen = torch.Generator().manual_seed(2)
    q, k, v, do = (randn(2, 50, 3, 32, dtype=dtype, gen=gen).transpose(1, 2) for _ in range(4))  # (B, H, N, E) views
    out, grads = ours(flashattn.scaled_dot_product_attention, q, k, v, do, is_causal=True, scale=0.3)
    ref_out, ref_grads = torch_grads(q, k, v, do, True, scale=0.3)
    assert rel_error(out, ref_out) < TOL[dtype]
    assert max(grad_errors(grads, ref_grads)) < TOL[dtype]


@given(
    B=st.integers(1, 2), HKV=st.integers(1, 2), group=st.sampled_from([1, 2, 4]), L=st.integers(1, 130),
    S=st.integers(1, 130), E=st.sampled_from([16, 40, 64, 80, 96]), causal=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float16]), seed=st.integers(0, 2**16),
)
@example(B=1, HKV=1, group=1, L=1, S=1, E=40, causal=False, dtype=torch.float32, seed=0)  # one key: dq = dk = 0
def test_sdpa_property(B, HKV, group, L, S, E, causal, dtype, seed):
    """L ≠ S (causal top-left), grouped-query heads, head dimensions that are not powers of two."""
    gen = torch.Generator().manual_seed(seed)
    q, do = (randn(B, HKV * group, L, E, dtype=dtype, gen=gen) for _ in range(2))
    k, v = (randn(B, HKV, S, E, dtype=dtype, gen=gen) for _ in range(2))
    out, grads = ours(flashattn.scaled_dot_product_attention, q, k, v, do, is_causal=causal, enable_gqa=True)
    ref_out, ref_grads = torch_grads(q, k, v, do, causal, enable_gqa=True)
    assert rel_error(out, ref_out) < TOL[dtype]
    assert max(grad_errors(grads, ref_grads)) < TOL[dtype]


@pytest.mark.parametrize("L, S", [(30, 70), (70, 30)])
def test_sdpa_causal_alignment_with_unequal_lengths(L, S):
    gen = torch.Generator().manual_seed(L)
    q, do = (randn(1, 4, L, 40, dtype=torch.float32, gen=gen) for _ in range(2))
    k, v = (randn(1, 2, S, 40, dtype=torch.float32, gen=gen) for _ in range(2))
    out, grads = ours(flashattn.scaled_dot_product_attention, q, k, v, do, is_causal=True, enable_gqa=True)
    ref_out, ref_grads = torch_grads(q, k, v, do, True, enable_gqa=True)
    assert rel_error(out, ref_out) < TOL[torch.float32]
    assert max(grad_errors(grads, ref_grads)) < TOL[torch.float32]


def test_sdpa_refuses_what_it_does_not_implement():
    q = torch.zeros(1, 4, 8, 16, device=runtime.DEVICE)
    kv = torch.zeros(1, 2, 8, 16, device=runtime.DEVICE)
    sdpa = flashattn.scaled_dot_product_attention
    with pytest.raises(ValueError, match="attn_mask"):  # masks are taken (tests/test_masked.py), bad ones refused
        sdpa(q, q, q, attn_mask=torch.ones(3, 8, 8, dtype=torch.bool, device=q.device))
    with pytest.raises(ValueError, match="dropout_p"):
        sdpa(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        sdpa(q, kv, kv)
    with pytest.raises(ValueError, match="multiple"):
        sdpa(q[:, :3], kv, kv, enable_gqa=True)
    with pytest.raises(ValueError, match="Ev=8"):
        sdpa(q, q, q[..., :8])
    with pytest.raises(ValueError, match=r"same length S; got query \(1, 4, 8, 16\), key \(1, 4, 8, 16\), "
                                         r"value \(1, 4, 4, 16\)$"):  # the message names every shape
        sdpa(q, q, q[:, :, :4])
    with pytest.raises(ValueError, match="batch dimensions"):
        sdpa(q, torch.cat([q, q]), torch.cat([q, q]))
    with pytest.raises(TypeError, match="is_causal"):
        sdpa(q, q, q, is_causal=1)
    with pytest.raises(TypeError, match="key must be a torch.Tensor"):
        sdpa(q, None, q)
    with pytest.raises(TypeError, match="float64"):
        sdpa(q.double(), q.double(), q.double())


@GPU
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_full_size_on_gpu(dtype, causal):
    gen = torch.Generator().manual_seed(11)
    for (HQ, HKV, L, S, E) in ((8, 8, 4096, 4096, 64), (8, 8, 2048, 2048, 128), (8, 2, 1000, 3000, 96)):
        q, do = (randn(2, HQ, L, E, dtype=dtype, gen=gen) for _ in range(2))
        k, v = (randn(2, HKV, S, E, dtype=dtype, gen=gen) for _ in range(2))
        out, grads = ours(flashattn.scaled_dot_product_attention, q, k, v, do, is_causal=causal, enable_gqa=True)
        ref_out, ref_grads = torch_grads(q, k, v, do, causal, enable_gqa=True)
        assert rel_error(out, ref_out) < TOL[dtype]
        assert max(grad_errors(grads, ref_grads)) < TOL[dtype], (HQ, HKV, L, S, E)


@pytest.mark.parametrize("mask", [False, True], ids=["no mask", "attn_mask"])
@pytest.mark.parametrize("lead", [(), (2, 3)], ids=["3-D", "5-D"])
def test_sdpa_leading_dimensions_with_grouped_heads_and_unequal_lengths(lead, mask):
    """(…, H, L, E) inputs other than 4-D, with Hq ≠ Hkv and L ≠ S: the heads are the dimension before L, and the
    output comes back shaped like the query."""
    gen = torch.Generator().manual_seed(21)
    q, do = (randn(*lead, 4, 24, 16, dtype=torch.float32, gen=gen) for _ in range(2))
    k, v = (randn(*lead, 2, 40, 16, dtype=torch.float32, gen=gen) for _ in range(2))
    attn_mask = (torch.rand(24, 40, generator=gen) < 0.7).to(runtime.DEVICE) if mask else None
    causal = not mask  # (torch takes an attn_mask or is_causal)
    out, grads = ours(flashattn.scaled_dot_product_attention, q, k, v, do, attn_mask=attn_mask, is_causal=causal,
                      enable_gqa=True)
    ref_out, ref_grads = torch_grads(q, k, v, do, causal, enable_gqa=True, attn_mask=attn_mask)
    assert out.shape == q.shape and rel_error(out, ref_out) < TOL[torch.float32]
    assert max(grad_errors(grads, ref_grads)) < TOL[torch.float32]


@pytest.mark.parametrize("which", ["k", "v", "kv"])
def test_sdpa_gradients_reach_whichever_inputs_ask_for_them(which):
    """A query that takes no gradient (a frozen projection) and keys or values that do."""
    gen = torch.Generator().manual_seed(22)
    q, k, v, do = (randn(1, 2, 30, 16, dtype=torch.float32, gen=gen) for _ in range(4))
    leaves = {name: leaf(t) if name in which else t for name, t in zip("qkv", (q, k, v), strict=True)}
    out = flashattn.scaled_dot_product_attention(*leaves.values(), is_causal=True)
    out.backward(do)
    _, ref_grads = torch_grads(q, k, v, do, True)
    for name, want in zip("qkv", ref_grads, strict=True):
        if name in which:
            assert rel_error(leaves[name].grad, want) < TOL[torch.float32], name


def test_sdpa_names_a_key_of_another_head_dimension():
    """Refused by the drop-in's own check, for 3-D inputs too (not a reshape's RuntimeError)."""
    q, k = torch.randn(2, 8, 16, device=runtime.DEVICE), torch.randn(2, 8, 8, device=runtime.DEVICE)
    with pytest.raises(ValueError, match=r"key's last dimension must equal query's \(E=16\)"):
        flashattn.scaled_dot_product_attention(q, k, q)
