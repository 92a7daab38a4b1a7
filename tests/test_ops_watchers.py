"""What watches PyTorch's dispatcher sees the drop-in's operators (flashattn/ops.py, ``ops.direct``): meta tensors get
their shapes from the fake implementations, ``FlopCounterMode`` counts the attention as torch counts SDPA's,
selective activation checkpointing saves or recomputes it as its policy says; the kernel variants refuse meta
tensors by name. Without a watcher, eager calls keep the direct path (test_ops.py)."""

import functools

import pytest
import torch
from helpers import TOL, rel_error
from torch.utils import flop_counter
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import flashattn
from flashattn import ops, runtime
from flashattn.kernels import fast

DTYPE = runtime.HALF if runtime.MODE == "gpu" else torch.float32


def meta(*shape):
    return torch.empty(*shape, device="meta")


def random(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(runtime.DEVICE, DTYPE).requires_grad_()


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"enable_gqa": True, "kv_heads": 2},
                                    {"attn_mask": "bool"}, {"attn_mask": "float"}],
                         ids=["plain", "causal", "gqa", "bool mask", "float mask"])
def test_meta_tensors_get_torchs_shapes_through_the_operators(kwargs):
    kwargs = dict(kwargs)
    kv = kwargs.pop("kv_heads", 4)
    q, k, v = meta(2, 4, 17, 32).requires_grad_(), meta(2, kv, 17, 32), meta(2, kv, 17, 32)
    mask = kwargs.pop("attn_mask", None)
    if mask is not None:
        kwargs["attn_mask"] = torch.empty(2, 1, 1, 17, device="meta", dtype=torch.bool if mask == "bool" else None)
    out = flashattn.scaled_dot_product_attention(q, k, v, **kwargs)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    assert (out.shape, out.dtype, out.device) == (want.shape, want.dtype, want.device)
    out.sum().backward()
    assert q.grad.shape == q.shape and q.grad.is_meta


def test_meta_tensors_through_windows_and_packed_documents():
    q = meta(2, 4, 17, 32)
    assert flashattn.attention(q, q, q, variant="fast", window=(4, 0)).shape == q.shape
    packed, cu = meta(30, 4, 32), torch.tensor([0, 10, 30], dtype=torch.int32, device="meta")
    out = flashattn.attention_varlen(packed, packed, packed, cu, cu, 20, 20, causal=True)
    assert out.shape == packed.shape and out.is_meta


@pytest.mark.parametrize("call", ["v2", "naive", "kvcache"])
def test_the_kernel_variants_refuse_meta_tensors_by_name(call):
    q = meta(2, 4, 16, 32)
    with pytest.raises(ValueError, match="meta tensors, which hold no data"):
        if call == "kvcache":
            cache = meta(2, 64, 4, 32)
            flashattn.attention_with_kvcache(meta(2, 1, 4, 32), cache, cache, 10)
        else:
            flashattn.attention(q, q, q, variant=call)


def sdpa_count(B, Hq, L, S, D, backward=False):
    """torch's own count for SDPA at these shapes (grouped heads counted per query head, as torch counts them)."""
    q, kv = (B, Hq, L, D), (B, Hq, S, D)
    return flop_counter.sdpa_backward_flop_count(q, q, kv, kv) if backward else flop_counter.sdpa_flop_count(q, kv, kv)


def test_flop_counter_counts_the_drop_in_as_torch_counts_sdpa():
    q, k, v = random(2, 4, 33, 32, seed=1), random(2, 2, 33, 32, seed=2), random(2, 2, 33, 32, seed=3)
    with flop_counter.FlopCounterMode(display=False) as counter:
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(torch.ones_like(out))
    counts = counter.get_flop_counts()["Global"]
    assert counts[torch.ops.flashattn.fast_forward] == sdpa_count(2, 4, 33, 33, 32)
    assert counts[torch.ops.flashattn.fast_backward] == sdpa_count(2, 4, 33, 33, 32, backward=True)
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.detach().double() for t in (q, k, v)), is_causal=True,
                                                           enable_gqa=True)
    assert rel_error(out, ref) < TOL[DTYPE]  # the operator path computes as the direct one


def test_flop_counter_counts_masks_in_full_and_packed_documents_each():
    q = random(1, 2, 24, 16, seed=4)
    mask = torch.rand(1, 1, 24, 24, generator=torch.Generator().manual_seed(5)).to(runtime.DEVICE) > 0.3
    with flop_counter.FlopCounterMode(display=False) as counter:
        flashattn.scaled_dot_product_attention(q, q, q, attn_mask=mask).sum().backward()
    counts = counter.get_flop_counts()["Global"]
    assert counts[torch.ops.flashattn.masked_forward] == sdpa_count(1, 2, 24, 24, 16)
    assert counts[torch.ops.flashattn.masked_backward] == sdpa_count(1, 2, 24, 24, 16, backward=True)
    packed = random(30, 2, 16, seed=6)
    cu = torch.tensor([0, 7, 30], dtype=torch.int32, device=runtime.DEVICE)
    with flop_counter.FlopCounterMode(display=False) as counter:
        flashattn.attention_varlen(packed, packed, packed, cu, cu, 23, 23, causal=True).sum().backward()
    counts = counter.get_flop_counts()["Global"]
    assert counts[torch.ops.flashattn.masked_forward] == sdpa_count(1, 2, 7, 7, 16) + sdpa_count(1, 2, 23, 23, 16)


def forward_runs(monkeypatch) -> list:
    """Every run of the fast forward's host function (the direct path and the operator's kernel both call it)."""
    runs, original = [], fast._forward
    monkeypatch.setattr(fast, "_forward", lambda *args: runs.append(1) or original(*args))
    return runs


@pytest.mark.parametrize("policy", [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE],
                         ids=["save attention", "recompute attention"])
def test_selective_checkpointing_saves_or_recomputes_the_attention_as_told(policy, monkeypatch):
    def choose(ctx, op, *args, **kwargs):
        return policy if op == ops.FORWARD else CheckpointPolicy.PREFER_RECOMPUTE

    def block(q, k, v):
        return flashattn.scaled_dot_product_attention(q.sin(), k, v, is_causal=True)

    q, k, v = (random(2, 2, 33, 32, seed=s) for s in (7, 8, 9))
    block(q, k, v).sum().backward()
    want = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    runs = forward_runs(monkeypatch)
    context = functools.partial(create_selective_checkpoint_contexts, choose)
    checkpoint(block, q, k, v, use_reentrant=False, context_fn=context).sum().backward()
    assert len(runs) == (1 if policy == CheckpointPolicy.MUST_SAVE else 2)
    for got, expected in zip((q.grad, k.grad, v.grad), want, strict=True):
        assert rel_error(got, expected) < TOL[DTYPE]


def test_without_a_watcher_eager_calls_stay_direct():
    q = random(1, 2, 16, 16)
    assert ops.direct(q, q, q)
    assert not ops.direct(q, meta(1, 2, 16, 16), q)
    with flop_counter.FlopCounterMode(display=False):
        assert not ops.direct(q, q, q)
    out = flashattn.scaled_dot_product_attention(q, q, q)
    assert type(out.grad_fn).__name__ == "_EagerBackward"


def test_fake_tensors_get_torchs_shapes_through_the_operators():
    """Fake tensors (a tensor subclass: what torch.export and shape propagation hand a model) used outside their mode
    go through the operators, whose fake implementations give the shapes, and never reach a kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    q, k, v = (mode.from_tensor(random(2, 4, 17, 32, seed=s)) for s in (10, 11, 12))
    out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    with mode:
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (out.shape, out.dtype, out.stride()) == (want.shape, want.dtype, want.stride())
    out.sum().backward()
    assert q.grad.shape == q.shape


def test_flop_counter_counts_packed_documents_by_their_own_query_and_key_lengths():
    q, kv = random(30, 2, 16, seed=13), random(20, 2, 16, seed=14)
    cu_q, cu_k = (torch.tensor(cu, dtype=torch.int32, device=runtime.DEVICE) for cu in ([0, 7, 30], [0, 12, 20]))
    with flop_counter.FlopCounterMode(display=False) as counter:
        flashattn.attention_varlen(q, kv, kv, cu_q, cu_k, 23, 12).sum().backward()
    counts = counter.get_flop_counts()["Global"]
    assert counts[torch.ops.flashattn.masked_forward] == sdpa_count(1, 2, 7, 12, 16) + sdpa_count(1, 2, 23, 8, 16)
    assert counts[torch.ops.flashattn.masked_backward] == (sdpa_count(1, 2, 7, 12, 16, backward=True)
                                                           + sdpa_count(1, 2, 23, 8, 16, backward=True))
