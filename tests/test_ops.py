"""The drop-in as PyTorch operators (flashattn/ops.py): opcheck on each operator, autograd through them, and
torch.compile of a model that calls the drop-in: one graph with fullgraph=True, outputs and gradients as in
eager, dynamic lengths, and the same errors as in eager.

On the CPU torch.compile runs with backend "aot_eager" (Dynamo and AOTAutograd, no code generation); on a GPU
with the default (Inductor).
"""

import contextlib

import pytest
import torch
from helpers import DTYPES, TOL, qkv, rel_error
from torch.utils.flop_counter import FlopCounterMode

import flashattn
from flashattn import ops, runtime
from flashattn.models.gpt import GPT, GPTConfig

BACKEND = "inductor" if runtime.MODE == "gpu" else "aot_eager"


def leaf(t):
    return t.detach().clone().requires_grad_()


def fused_views(B, H, N, D, dtype, seed):
    """q, k, v sliced from one (B, N, 3, H, D) projection and seen as (B, H, N, D): what a model passes."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, 3, H, D, generator=gen).to(runtime.DEVICE, dtype)
    return [x[:, :, i].transpose(1, 2) for i in range(3)]


CASES = [  # (B, Hq, Hkv, L, S, D, causal, dtype)
    (2, 3, 3, 17, 17, 16, True, torch.float32),
    (1, 4, 2, 1, 100, 32, False, torch.float16),
    (2, 2, 1, 100, 17, 64, True, torch.float16),
    (1, 2, 2, 33, 33, 24, False, torch.float32),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}H{c[1]}/{c[2]}L{c[3]}S{c[4]}D{c[5]}"
                                                       f"{'c' if c[6] else ''}{str(c[7])[6:]}")
def test_opcheck_passes_on_both_operators(case):
    B, Hq, Hkv, L, S, D, causal, dtype = case
    gen = torch.Generator().manual_seed(L + S + D)
    q = torch.randn(B, Hq, L, D, generator=gen).to(runtime.DEVICE, dtype)
    k, v = (torch.randn(B, Hkv, S, D, generator=gen).to(runtime.DEVICE, dtype) for _ in range(2))
    forward_args = (leaf(q), leaf(k), leaf(v), causal, None, "")
    result = torch.library.opcheck(ops.FORWARD, forward_args)
    assert set(result.values()) == {"SUCCESS"}, result
    o, lse = ops.FORWARD(q, k, v, causal, None, "")
    do = torch.randn(o.shape, generator=gen).to(runtime.DEVICE, dtype)
    result = torch.library.opcheck(ops.BACKWARD, (q, k, v, o, lse, do, causal, 0.3, ""))
    assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_on_views_of_a_fused_projection_and_with_options():
    q, k, v = fused_views(2, 2, 17, 16, torch.float32, 1)
    assert not q.is_contiguous()
    result = torch.library.opcheck(ops.FORWARD, (leaf(q), leaf(k), leaf(v), False, None, ops.encode({"block_m": 16})))
    assert set(result.values()) == {"SUCCESS"}, result


def test_options_survive_the_schema_as_a_string():
    options = {"block_m": 64, "num_warps": 4, "gluon": False, "dkdv_tiles": (64, 64, 4, 2), "schedule": "auto"}
    assert ops.decode(ops.encode(options)) == options
    assert ops.encode({}) == "" and ops.decode("") == {}


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_drop_in_differentiates_through_the_operators(dtype):
    q, k, v = (leaf(t) for t in fused_views(2, 3, 17, 16, dtype, 2))
    out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert type(out.grad_fn).__name__ == "_EagerBackward", out.grad_fn  # eager: the kernels, one output
    do = torch.randn_like(out)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    ref.backward(do.double())
    assert rel_error(out, ref) < TOL[dtype]
    for got, want in zip((q.grad, k.grad, v.grad), (q64.grad, k64.grad, v64.grad), strict=True):
        assert rel_error(got, want) < 4 * TOL[dtype]


def test_a_second_derivative_is_refused_by_name():
    q, k, v = (leaf(t) for t in qkv(1, 1, 8, 16, torch.float32, 3))
    out = flashattn.scaled_dot_product_attention(q, k, v)
    (dq,) = torch.autograd.grad((out ** 2).sum(), q, create_graph=True)  # dO = 2·O depends on q
    with pytest.raises(RuntimeError, match="differentiate twice a function that was marked with @once_differentiable"):
        dq.sum().backward()


def small_gpt(seed=0, n_kv_heads=None):
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=32, seq_len=64, n_layers=2, n_heads=2, n_kv_heads=n_kv_heads, d_model=32)
    return GPT(config, flashattn.scaled_dot_product_attention).to(runtime.DEVICE)


def loss_and_grads(model, tokens):
    model.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {name.removeprefix("_orig_mod."): p.grad.clone() for name, p in model.named_parameters()}


def tokens_of(B, N, seed):
    return torch.randint(0, 32, (B, N + 1), generator=torch.Generator().manual_seed(seed)).to(runtime.DEVICE)


@pytest.mark.parametrize("n_kv_heads", [None, 1], ids=["heads", "grouped"])
def test_a_model_compiles_whole_and_matches_eager(n_kv_heads):
    model = small_gpt(n_kv_heads=n_kv_heads)
    tokens = tokens_of(2, 17, 4)
    eager_loss, eager_grads = loss_and_grads(model, tokens)
    explanation = torch._dynamo.explain(model)(tokens[:, :-1])
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=BACKEND)
    loss, grads = loss_and_grads(compiled, tokens)
    assert torch.allclose(loss, eager_loss, rtol=1e-5, atol=1e-6), (loss, eager_loss)
    for name, g in eager_grads.items():
        assert rel_error(grads[name], g) < 1e-5, name


def test_a_second_length_recompiles_once_and_stays_correct():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = small_gpt(1)
    counter = CompileCounterWithBackend(BACKEND)
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    for N in (17, 33, 40, 5):
        tokens = tokens_of(2, N, N)
        eager_loss, eager_grads = loss_and_grads(model, tokens)
        loss, grads = loss_and_grads(compiled, tokens)
        assert torch.allclose(loss, eager_loss, rtol=1e-5, atol=1e-6), N
        assert all(rel_error(grads[name], g) < 1e-5 for name, g in eager_grads.items()), N
    assert counter.frame_count <= 2, f"{counter.frame_count} compiles for four lengths (at most one recompile)"


BAD_CALLS = [  # (what, call, the exception, a piece of its message)
    ("dropout", dict(dropout_p=0.5), ValueError, "dropout_p=0.5 is not supported"),
    ("float64", dict(dtype=torch.float64), TypeError, "dtype torch.float64 is not supported"),
    ("Ev != E", dict(value_dim=8), ValueError, "a value head dimension Ev=8"),
    ("heads", dict(k_heads=3), ValueError, "pass enable_gqa=True"),
]


def bad_call(dropout_p=0.0, dtype=torch.float32, value_dim=16, k_heads=2):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 8, 16, generator=gen).to(runtime.DEVICE, dtype)
    k = torch.randn(1, k_heads, 8, 16, generator=gen).to(runtime.DEVICE, dtype)
    v = torch.randn(1, k_heads, 8, value_dim, generator=gen).to(runtime.DEVICE, dtype)
    return q, k, v, dropout_p


@pytest.mark.parametrize("what,kwargs,error,message", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_compiled_calls_refuse_what_eager_refuses_with_the_same_message(what, kwargs, error, message):
    q, k, v, p = bad_call(**kwargs)

    def call(q, k, v):
        return flashattn.scaled_dot_product_attention(q, k, v, dropout_p=p)

    with pytest.raises(error, match=message):
        call(q, k, v)
    torch._dynamo.reset()
    with pytest.raises(error, match=message):  # Dynamo falls back to eager for the frame that raises
        torch.compile(call, backend=BACKEND)(q, k, v)
    torch._dynamo.reset()
    # fullgraph: one graph or none, so Dynamo reports the exception as Unsupported, with its message
    with pytest.raises(torch._dynamo.exc.Unsupported, match=message.replace("(", r"\(")):
        torch.compile(call, fullgraph=True, backend=BACKEND)(q, k, v)


def test_a_bad_option_is_refused_under_compile_too():
    q, k, v = (leaf(t) for t in qkv(1, 2, 8, 16, torch.float32, 6))

    def call(q, k, v):
        return flashattn.attention(q, k, v, variant="fast", block_m=48)

    with pytest.raises(ValueError, match="block_m") as eager:
        call(q, k, v)
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="block_m") as compiled:
        torch.compile(call, backend=BACKEND)(q, k, v)
    assert str(compiled.value) == str(eager.value)
    torch._dynamo.reset()  # fullgraph: Dynamo reports eager's ValueError as Unsupported while tracing, before any run
    with pytest.raises(torch._dynamo.exc.Unsupported, match="block_m"):
        torch.compile(call, fullgraph=True, backend=BACKEND)(q, k, v)


def test_a_call_with_something_else_than_tensors_gets_the_kernels_type_error():
    q, k, v = (leaf(t) for t in qkv(1, 2, 8, 16, torch.float32, 8))
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        flashattn.attention([[1.0]], k, v, variant="fast")


def test_the_operators_check_inputs_themselves():
    q, k, v = qkv(1, 2, 8, 16, torch.float32, 7)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        ops.FORWARD(q, k, v[..., :4, :], False, None, "")
    with pytest.raises(TypeError, match="unknown option"):
        ops.FORWARD(q, k, v, False, None, "tile=3")


def test_options_encode_the_same_in_any_order():
    """One string per set of options, whatever the dict's order: the string is a constant of the compiled graph (a
    second spelling would compile again) and the key of the backward options' cache."""
    assert ops.encode({"num_warps": 4, "block_m": 64}) == ops.encode({"block_m": 64, "num_warps": 4})
    assert ops.encode({"num_warps": 4, "block_m": 64}) == "block_m=64;num_warps=4"


def test_the_forward_operators_log_sum_exp_takes_no_gradient():
    q, k, v = (leaf(t) for t in qkv(1, 2, 8, 16, torch.float32, 9))
    o, lse = ops.FORWARD(q, k, v, False, None, "")
    assert o.requires_grad and not lse.requires_grad


@pytest.mark.parametrize("watched", [False, True], ids=["eager", "operators"])
def test_forward_tiles_are_not_handed_to_the_backward(watched):
    """``attention(..., variant="fast", block_m=16, ...)`` with gradients: the tiles are the forward's own, only
    BACKWARD_OPTIONS reach the backward, on the direct path (_Eager) and through the operators (a dispatch mode)."""
    q, k, v = (leaf(t) for t in qkv(1, 2, 40, 16, torch.float32, 10))
    do = qkv(1, 2, 40, 16, torch.float32, 11)[0]
    with FlopCounterMode(display=False) if watched else contextlib.nullcontext():
        out = flashattn.attention(q, k, v, variant="fast", causal=True, block_m=16, block_n=16, input_precision="ieee")
        out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    ref.backward(do.double())
    assert rel_error(out, ref) < TOL[torch.float32]
    for got, want in zip((q.grad, k.grad, v.grad), (q64.grad, k64.grad, v64.grad), strict=True):
        assert rel_error(got, want) < 4 * TOL[torch.float32]


def test_opcheck_of_the_backward_on_views_of_a_fused_projection():
    """The gradients laid out like their inputs, (B, N, H, D) memory here: the backward's fake implementation says so,
    and the kernel must do so (opcheck compares their strides)."""
    q, k, v = fused_views(2, 2, 17, 16, torch.float32, 12)
    o, lse = ops.FORWARD(q, k, v, True, None, "")
    do = fused_views(2, 2, 17, 16, torch.float32, 13)[0]
    result = torch.library.opcheck(ops.BACKWARD, (q, k, v, o, lse, do, True, None, ""))
    assert set(result.values()) == {"SUCCESS"}, result
    dq, dk, dv = ops.BACKWARD(q, k, v, o, lse, do, True, None, "")
    assert all(g.transpose(1, 2).is_contiguous() for g in (dq, dk, dv))

