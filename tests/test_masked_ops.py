"""Masked attention as PyTorch operators (``torch.ops.flashattn.masked_forward`` / ``masked_backward``, ops.py):
opcheck on each, and torch.compile with fullgraph=True of the drop-in with an attn_mask, a sliding window and
packed documents: one graph, outputs and gradients as in eager, and eager's errors.

On the CPU torch.compile runs with backend "aot_eager"; on a GPU with the default (Inductor).
"""

import pytest
import torch
from helpers import TOL, rel_error

import flashattn
from flashattn import masking, ops, runtime
from flashattn.kernels import mask_blocks as mb

BACKEND = "inductor" if runtime.MODE == "gpu" else "aot_eager"
DTYPE = torch.float16 if runtime.MODE == "gpu" else torch.float32


def randn(*shape, seed, dtype=DTYPE):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(runtime.DEVICE, dtype)


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def _padding_mask(B, S, seed):
    lengths = torch.randint(1, S + 1, (B,), generator=torch.Generator().manual_seed(seed))
    return (torch.arange(S)[None, :] < lengths[:, None]).view(B, 1, 1, S).to(runtime.DEVICE)


def _specs():
    """(name, q, k, v, spec): the operators' argument sets, checked as masking checks them."""
    q, k, v = randn(2, 4, 40, 16, seed=1), randn(2, 2, 40, 16, seed=2), randn(2, 2, 40, 16, seed=3)
    out = [("window, GQA", q, k, v, masking.make_spec(q, k, v, causal=True, window=(7, 0)))]
    mask = _padding_mask(2, 40, 4).expand(2, 4, 40, 40)  # a broadcast (B, 1, 1, S) mask: zero strides
    out.append(("bool attn_mask", q, k, v, masking.make_spec(q, k, v, causal=True, attn_mask=mask)))
    bias = randn(1, 1, 40, 40, seed=5, dtype=torch.float32).expand(2, 4, 40, 40)
    out.append(("float attn_mask", q, k, v, masking.make_spec(q, k, v, attn_mask=bias)))
    cu = torch.tensor([0, 1, 17, 40], dtype=torch.int32, device=runtime.DEVICE)
    qp, kp, vp = randn(40, 4, 16, seed=6), randn(40, 2, 16, seed=7), randn(40, 2, 16, seed=8)
    spec = masking.make_spec(qp, kp, vp, causal=True, window=(5, -1), cu_seqlens_q=cu, cu_seqlens_k=cu,
                             max_seqlen_q=23, max_seqlen_k=23)
    out.append(("packed documents", qp, kp, vp, spec))
    return out


def _mask_args(spec, scale=0.25, options=""):
    return (spec.mask, spec.cu_q, spec.cu_k, spec.max_q, spec.max_k, spec.left, spec.right, spec.causal, scale,
            options)


@pytest.mark.parametrize("case", range(4), ids=["window", "bool mask", "float mask", "documents"])
def test_opcheck_passes_on_both_masked_operators(case):
    name, q, k, v, spec = _specs()[case]
    result = torch.library.opcheck(ops.MASKED_FORWARD, (*leaves(q, k, v), *_mask_args(spec)))
    assert set(result.values()) == {"SUCCESS"}, (name, result)
    o, lse = ops.MASKED_FORWARD(q, k, v, *_mask_args(spec))
    do = randn(*o.shape, seed=9)
    result = torch.library.opcheck(ops.MASKED_BACKWARD, (q, k, v, o, lse, do, *_mask_args(spec)))
    assert set(result.values()) == {"SUCCESS"}, (name, result)


def test_the_masked_operators_options_reach_the_kernels():
    _, q, k, v, spec = _specs()[0]
    tiles = (16, 16, 4, 1) if runtime.MODE == "interpreter" else (64, 64, 4, 3)
    o, _ = ops.MASKED_FORWARD(q, k, v, *_mask_args(spec, options=ops.encode({"tiles": tiles})))
    ref, _ = masking._forward(q, k, v, spec, 0.25, tiles, None)
    assert torch.equal(o, ref)


def _cases():
    """(name, fn(q, k, v) -> output, q, k, v): the three masked entry points."""
    q, k, v = randn(2, 4, 40, 16, seed=11), randn(2, 2, 40, 16, seed=12), randn(2, 2, 40, 16, seed=13)
    padding = _padding_mask(2, 40, 14)
    cu = torch.tensor([0, 9, 40], dtype=torch.int32, device=runtime.DEVICE)
    return [
        ("drop-in with attn_mask", lambda q, k, v: flashattn.scaled_dot_product_attention(
            q, k, v, attn_mask=padding, enable_gqa=True), q, k, v),
        ("window", lambda q, k, v: flashattn.attention(q, k, v, variant="fast", causal=True, window=(6, 0)), q, k, v),
        ("packed documents", lambda q, k, v: flashattn.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1),
                                                                        v[0].transpose(0, 1), cu, cu, 31, 31,
                                                                        causal=True), q, k, v),
    ]


@pytest.mark.parametrize("case", range(3), ids=["attn_mask", "window", "documents"])
def test_masked_attention_compiles_whole_and_matches_eager(case):
    name, fn, q, k, v = _cases()[case]

    def step(q, k, v):
        return (fn(q, k, v).float() ** 2).sum()

    eager = leaves(q, k, v)
    step(*eager).backward()
    explanation = torch._dynamo.explain(step)(*leaves(q, k, v))
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), (name, explanation.break_reasons)
    torch._dynamo.reset()
    compiled = leaves(q, k, v)
    loss = torch.compile(step, fullgraph=True, backend=BACKEND)(*compiled)
    loss.backward()
    assert rel_error(loss, step(q, k, v)) < TOL[DTYPE], name
    for a, b, which in zip(compiled, eager, "qkv", strict=True):
        assert rel_error(a.grad, b.grad) < TOL[DTYPE], (name, which)


def test_compiled_masked_calls_refuse_what_eager_refuses():
    q = randn(1, 2, 16, 16, seed=15)
    with pytest.raises(ValueError, match="causal window's right side is 0"):
        torch.compile(lambda q: flashattn.attention(q, q, q, variant="fast", causal=True, window=(2, 3)),
                      backend=BACKEND)(q)
    bias = randn(16, 16, seed=16, dtype=torch.float32).requires_grad_()
    with pytest.raises(ValueError, match="attn_mask requires grad"):
        torch.compile(lambda q, m: flashattn.scaled_dot_product_attention(q, q, q, attn_mask=m),
                      backend=BACKEND)(q, bias)


def test_a_compiled_window_is_the_window():
    """Against float64 (not only against eager): a compiled causal window of 5 keys, B 2, 3 heads, N 33."""
    q, k, v = (randn(2, 3, 33, 16, seed=s) for s in (17, 18, 19))
    out = torch.compile(lambda q, k, v: flashattn.attention(q, k, v, variant="fast", causal=True, window=(4, 0)),
                        fullgraph=True, backend=BACKEND)(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=mb.window_mask(33, 33, (4, 0), True, device=q.device))
    assert rel_error(out, ref.to(out.dtype)) < TOL[DTYPE]


def test_the_masked_forward_operators_log_sum_exp_takes_no_gradient():
    _, q, k, v, spec = _specs()[0]
    o, lse = ops.MASKED_FORWARD(*leaves(q, k, v), *_mask_args(spec))
    assert o.requires_grad and not lse.requires_grad
