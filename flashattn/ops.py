"""The ``fast`` forward and backward as PyTorch operators: ``torch.ops.flashattn.fast_forward`` and
``torch.ops.flashattn.fast_backward`` (notebook 13), and masked attention's (notebook 14).

A Python function that launches Triton kernels is opaque to ``torch.compile``: Dynamo tries to trace into it,
meets the launcher's host code (a cache lookup that hashes arguments, a tuner, descriptors) and breaks the
graph there, so the model around it is compiled in pieces and cannot be captured in one CUDA graph. A
registered operator is one node instead: Dynamo and AOTAutograd do not look inside, they ask its *fake*
implementation for the outputs' shapes, dtypes and strides (computed from the inputs' metadata, touching no
data) and its autograd kernel for the backward. FlashAttention's own package made the same change for the
same reason.

The operators are defined with ``torch.library.Library`` (``define``, ``impl``, ``register_fake``), with an
autograd kernel at the ``Autograd`` key, rather than with the ``@torch.library.custom_op`` decorator: the same
operator to every tool (``opcheck`` passes on both), for less host time per call (the decorator's Python
wrappers fill in defaults and flatten arguments on every call; :mod:`flashattn.measure.host_cost` measures
both). ``torch.library.triton_op`` would let Inductor see the Triton kernels themselves, but only kernels
launched through ``wrap_triton(kernel)[grid](...)`` in the operator's body: this launcher's cache, tuner and
descriptors are host code it cannot trace.

* ``fast_forward(q, k, v, causal, scale, options) -> (o, lse)``: :func:`flashattn.kernels.fast.attention_fast`
  with ``return_lse=True``; o (B, Hq, L, D) in q's dtype, lse (B, Hq, L) float32.
* ``fast_backward(q, k, v, o, lse, do, causal, scale, options) -> (dq, dk, dv)``:
  :func:`flashattn.kernels.fast_backward.attention_backward_fast`; each gradient shaped like its input.
* ``masked_forward`` and ``masked_backward``: masked attention's (``masking.py``: windows, packed documents, the
  drop-in's ``attn_mask``), what ``torch.compile`` traces for those calls (the end of this module).

Each output is laid out like its input (``descriptors.model_layout``): o and dq like q, dk like k, dv like v, as
(B, N, H, D) memory seen through ``transpose(1, 2)`` where the input is such a view (a model's q, k, v: then the
kernels read them in place and the model's ``.transpose(1, 2)`` of the result is free), contiguous otherwise.

``options`` is a string (an operator's schema takes no dict): the keyword options of ``attention(...,
variant="fast", **options)`` as ``"block_m=64;num_warps=4"`` (:func:`encode`), empty for the defaults. The
backward gets only the options it follows (:data:`BACKWARD_OPTIONS`).

:func:`attention` is what ``flashattn.attention(..., variant="fast")`` and the drop-in call. Eagerly on real tensors
with nothing watching the dispatcher (:func:`direct`): without gradients the kernel function itself (no operator to
dispatch through), with gradients :class:`_Eager`, an autograd node around the same kernel functions with one
output. Otherwise the operators, so that what watches sees them: tensor subclasses, meta tensors and dispatch modes
(``FlopCounterMode``, selective activation checkpointing) get the forward operator's autograd kernel, what the
dispatcher would call for it; ``torch.compile`` traces the operator. ``FlopCounterMode`` counts each operator with
torch's own formulas for SDPA (the end of this module). While
``torch.compile`` traces, it first runs the kernel's input checks in Python, so that a bad input raises the
same ``ValueError`` or ``TypeError`` as in eager (Dynamo falls back to eager for the frame that raises; with
``fullgraph=True`` Dynamo reports it as ``Unsupported`` carrying that message: it never lets an exception out
of a graph it must keep whole). The operators check their inputs themselves as well, for callers that use them
directly.
"""

from __future__ import annotations

import ast
import functools

import torch
from torch.autograd.function import once_differentiable
from torch.utils import flop_counter

from flashattn.kernels import descriptors, fast, fast_backward, fast_options
from flashattn.validate import check_attention_inputs

NAMESPACE = "flashattn"
BACKWARD_OPTIONS = ("input_precision",)  # forward options the backward follows (the tiles are its own)


def encode(options: dict) -> str:
    """``{"block_m": 64, "num_warps": 4}`` -> ``"block_m=64;num_warps=4"`` (sorted by name; values by ``repr``)."""
    return ";".join(f"{key}={options[key]!r}" for key in sorted(options))


def decode(text: str) -> dict:
    """The inverse of :func:`encode`."""
    if not text:
        return {}
    pairs = (item.split("=", 1) for item in text.split(";"))
    return {key: ast.literal_eval(value) for key, value in pairs}


_LIBRARY = torch.library.Library(NAMESPACE, "DEF")  # kept alive: dropping it would unregister the operators
_LIBRARY.define("fast_forward(Tensor q, Tensor k, Tensor v, bool causal, float? scale, str options) "
                "-> (Tensor, Tensor)")
_LIBRARY.define("fast_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, bool causal, "
                "float? scale, str options) -> (Tensor, Tensor, Tensor)")


def fast_forward(q, k, v, causal, scale, options):
    """The forward operator's kernel (CPU and CUDA): ``attention_fast(..., return_lse=True)``."""
    return fast.attention_fast(q, k, v, causal=causal, scale=scale, return_lse=True, **decode(options))


def fast_backward_kernel(q, k, v, o, lse, do, causal, scale, options):
    """The backward operator's kernel: ``attention_backward_fast``."""
    return fast_backward.attention_backward_fast(q, k, v, o, lse, do, causal=causal, scale=scale, **decode(options))


def _fast_forward_fake(q, k, v, causal, scale, options):
    B, Hq, _, L, _, D, _ = check_attention_inputs(q, k, v, variant="fast", causal=causal, scale=scale,
                                                  head_dims=fast.HEAD_DIMS, shapes_only=True)
    return descriptors.empty_in_layout_of(q), q.new_empty((B, Hq, L), dtype=torch.float32)


def _fast_backward_fake(q, k, v, o, lse, do, causal, scale, options):
    fast_backward.check_inputs(q, k, v, o, lse, do, causal=causal, scale=scale, shapes_only=True)
    return tuple(descriptors.empty_in_layout_of(t) for t in (q, k, v))


def direct(*tensors) -> bool:
    """Real tensors with data, outside a trace and outside any ``TorchDispatchMode``: the operators' kernels can be
    called as Python functions, without the dispatcher's round trip (what each registered kernel would run anyway).
    Otherwise the call goes through the operators, so that whatever watches the dispatcher sees them: torch.compile,
    tensor subclasses, meta tensors (their shapes from the fake implementations), and dispatch modes such as
    ``FlopCounterMode`` and selective activation checkpointing's."""
    return (all(type(t) is torch.Tensor and not t.is_meta for t in tensors) and not torch.compiler.is_compiling()
            and not torch._C._len_torch_dispatch_stack())


class _FastForward(torch.autograd.Function):
    """The forward operator's autograd kernel: below autograd the operator runs again (so that fake tensors reach
    the fake implementation), and its backward is the backward operator. On real tensors in eager both call their
    kernels directly (:func:`direct`): the same code, two dispatches fewer per step."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, options):
        if direct(q, k, v):
            o, lse = fast_forward(q, k, v, causal, scale, options)
        else:
            with torch._C._AutoDispatchBelowAutograd():
                o, lse = FORWARD(q, k, v, causal, scale, options)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.options = causal, scale, _backward_options(options)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # lse's gradient stays None (not a tensor of zeros made on every step)
        return o, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        backward = fast_backward_kernel if direct(q, k, v, o, lse, do) else BACKWARD
        dq, dk, dv = backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, ctx.options)
        return dq, dk, dv, None, None, None


class _Eager(torch.autograd.Function):
    """Eager calls with gradients on real tensors: the forward and backward kernels themselves, as the operators'
    kernels run them, with one output (lse is saved, not returned, so no gradient for it passes through the
    autograd engine; saved, so that saved-tensor hooks, for offloading or checkpointing, see it). The engine runs
    a CUDA backward on a thread of its own, handed over from the caller's on every step (notebook 13), so the
    backward does as little Python as it can: it reuses the backward's bound launches, remembered on the forward's
    prepared problem for each layout of dO (``fast_backward.prepared``)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, options):
        o, lse, prepared = fast.forward_prepared(q, k, v, causal, scale, options)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.prepared = prepared
        ctx.causal, ctx.scale = causal, scale
        ctx.options = {key: options[key] for key in BACKWARD_OPTIONS if key in options} if options else options
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        prepared = ctx.prepared
        if prepared is not None:  # the forward's prepared problem fixes all but dO's strides and the alignments
            signature = (do.stride(), do.data_ptr() % 16, o.data_ptr() % 16, lse.data_ptr() % 16)
            run = prepared.backward.get(signature, _UNSEEN)
            if run is _UNSEEN:  # (dO's shape, dtype and device are o's: the autograd engine checks them)
                if len(prepared.backward) >= 8:
                    prepared.backward.clear()
                run = prepared.backward[signature] = fast_backward.prepared(q, k, v, o, lse, do, ctx.causal,
                                                                            ctx.scale, ctx.options)
            if run is not None:
                return (*run(q, k, v, o, lse, do), None, None, None)
        dq, dk, dv = fast_backward.attention_backward_fast(q, k, v, o, lse, do, causal=ctx.causal, scale=ctx.scale,
                                                           **ctx.options)
        return dq, dk, dv, None, None, None


_UNSEEN = object()


def _register(forward: str, backward: str, kernels: tuple, fakes: tuple, autograd) -> tuple:
    """A forward and a backward operator: each one's kernel (CPU and CUDA) and fake implementation (which is also
    its kernel for meta tensors), and the forward's autograd kernel. Returns their overloads (forward, backward)."""
    for name, kernel, fake in zip((forward, backward), kernels, fakes, strict=True):
        for device in ("CPU", "CUDA"):  # (not CompositeExplicitAutograd, which would take the Meta key too)
            _LIBRARY.impl(name, kernel, device)
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
    _LIBRARY.impl(forward, autograd, "Autograd")
    return getattr(torch.ops.flashattn, forward).default, getattr(torch.ops.flashattn, backward).default


FORWARD, BACKWARD = _register("fast_forward", "fast_backward", (fast_forward, fast_backward_kernel),
                              (_fast_forward_fake, _fast_backward_fake), _FastForward.apply)
OPERATORS = (FORWARD, BACKWARD)


@functools.lru_cache(maxsize=256)
def _backward_options(options: str) -> str:
    return encode({key: value for key, value in decode(options).items() if key in BACKWARD_OPTIONS})


def attention(q, k, v, causal: bool, scale, options: dict):
    """``fast`` attention, differentiable through the operators (see the module docstring)."""
    compiling = torch.compiler.is_compiling()
    tensors = all(isinstance(t, torch.Tensor) for t in (q, k, v))
    if compiling or not tensors:  # the operator's checks first: a bad input raises here, as in eager
        check_attention_inputs(q, k, v, variant="fast", causal=causal, scale=scale, head_dims=fast.HEAD_DIMS)
        if options:  # (resolve's cache hashes its key, which Dynamo does not trace; the checks themselves it does)
            same_shapes = q.shape[-2] == k.shape[-2] and q.shape[1] == k.shape[1]
            fast_options._check(q.dtype, q.shape[-1], causal, options, same_shapes)
    if not compiling and direct(q, k, v):  # eager: the kernels themselves (through _Eager's autograd for gradients)
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return _Eager.apply(q, k, v, causal, scale, options)
        return fast.attention_fast(q, k, v, causal=causal, scale=scale, **options)
    if not compiling and tensors:  # subclasses, meta tensors, dispatch modes: the forward operator's autograd kernel
        return _FastForward.apply(q, k, v, causal, scale, encode(options))[0]
    return FORWARD(q, k, v, causal, scale, encode(options))[0]


# --- masked attention's operators (notebook 14) ----------------------------------------------------------------
# ``masked_forward(q, k, v, attn_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, left, right, causal,
# scale, options) -> (o, lse)`` and ``masked_backward(q, k, v, o, lse, do, <the same mask arguments>) -> (dq, dk,
# dv)``: ``masking._forward`` and ``masking._backward`` of the checked ``masking.Spec`` spelled out (a window, packed
# documents or a (B, H, L, S) attn_mask view). Eager calls on real tensors run ``masking``'s own autograd node; these
# are what ``torch.compile`` traces instead (and tensor subclasses dispatch to).

_MASK_ARGS = ("Tensor? attn_mask, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
              "int left, int right, bool causal, float scale, str options")
_LIBRARY.define(f"masked_forward(Tensor q, Tensor k, Tensor v, {_MASK_ARGS}) -> (Tensor, Tensor)")
_LIBRARY.define(f"masked_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, {_MASK_ARGS}) "
                "-> (Tensor, Tensor, Tensor)")


def _mask_spec(attn_mask, cu_q, cu_k, max_q, max_k, left, right, causal):
    from flashattn import masking

    return masking.Spec(left, right, causal, cu_q, cu_k, max_q, max_k, attn_mask)


def masked_forward_kernel(q, k, v, attn_mask, cu_q, cu_k, max_q, max_k, left, right, causal, scale, options):
    from flashattn import masking

    spec = _mask_spec(attn_mask, cu_q, cu_k, max_q, max_k, left, right, causal)
    return masking._forward(q, k, v, spec, scale, decode(options).get("tiles"), None)


def masked_backward_kernel(q, k, v, o, lse, do, attn_mask, cu_q, cu_k, max_q, max_k, left, right, causal, scale,
                           options):
    from flashattn import masking

    spec, opts = _mask_spec(attn_mask, cu_q, cu_k, max_q, max_k, left, right, causal), decode(options)
    return masking._backward(q, k, v, o, lse, do, spec, scale, opts.get("dkdv_tiles"), opts.get("dq_tiles"), None)


def _masked_forward_fake(q, k, v, attn_mask, cu_q, cu_k, *_):
    """As ``masking._forward`` allocates them: o contiguous like q; lse (Hq, total_q) packed, else (B, Hq, L)."""
    lse_shape = (q.shape[1], q.shape[0]) if cu_q is not None else tuple(q.shape[:3])
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


def _masked_backward_fake(q, k, v, *_):
    return tuple(torch.empty_like(t) for t in (q, k, v))


class _MaskedForward(torch.autograd.Function):
    """The masked forward operator's autograd kernel: the operator again below autograd, the backward operator."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, cu_q, cu_k, *rest):
        with torch._C._AutoDispatchBelowAutograd():
            o, lse = MASKED_FORWARD(q, k, v, attn_mask, cu_q, cu_k, *rest)
        ctx.save_for_backward(q, k, v, o, lse, attn_mask, cu_q, cu_k)
        ctx.rest = rest
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, attn_mask, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = MASKED_BACKWARD(q, k, v, o, lse, do, attn_mask, cu_q, cu_k, *ctx.rest)
        return dq, dk, dv, *(None,) * (3 + len(ctx.rest))


MASKED_FORWARD, MASKED_BACKWARD = _register("masked_forward", "masked_backward",
                                            (masked_forward_kernel, masked_backward_kernel),
                                            (_masked_forward_fake, _masked_backward_fake), _MaskedForward.apply)
OPERATORS = (*OPERATORS, MASKED_FORWARD, MASKED_BACKWARD)


def masked_attention(q, k, v, spec, scale: float, options: dict):
    """Masked attention's output through the operator (``masking._apply`` under ``torch.compile`` or for tensor
    subclasses), its inputs already checked."""
    return MASKED_FORWARD(q, k, v, spec.mask, spec.cu_q, spec.cu_k, spec.max_q, spec.max_k, spec.left, spec.right,
                          spec.causal, scale, encode(options))[0]


# --- FLOPs for torch.utils.flop_counter.FlopCounterMode ---------------------------------------------------------
# Counted as torch counts SDPA's GPU kernels (``sdpa_flop_count``: the forward's two products;
# ``sdpa_backward_flop_count``: the backward's five, the scores recomputed), with neither the causal half nor a mask
# or window taken off, so that on a GPU a model's count, and the MFU worked out from it, is the same on the drop-in
# as on SDPA (torch has no formula for its CPU kernel, and counts it as nothing); packed documents per
# document, as torch counts varlen attention. Grouped K/V heads are counted per query head, as torch counts them.

def _sdpa_flops(q_shape, k_shape, v_shape, backward: bool) -> int:
    B, Hq, L, D = q_shape
    q, k, v = (B, Hq, L, D), (B, Hq, k_shape[-2], D), (B, Hq, k_shape[-2], v_shape[-1])
    if backward:
        return flop_counter.sdpa_backward_flop_count((B, Hq, L, v_shape[-1]), q, k, v)
    return flop_counter.sdpa_flop_count(q, k, v)


@flop_counter.register_flop_formula(torch.ops.flashattn.fast_forward)
def _fast_forward_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return _sdpa_flops(q_shape, k_shape, v_shape, backward=False)


@flop_counter.register_flop_formula(torch.ops.flashattn.fast_backward)
def _fast_backward_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return _sdpa_flops(q_shape, k_shape, v_shape, backward=True)


def _masked_flops(q, k, v, cu_q, cu_k, backward: bool) -> int:
    if cu_q is None:  # (B, H, L, D): the whole L × S, as for SDPA with the same mask
        return _sdpa_flops(q.shape, k.shape, v.shape, backward)
    lengths_q, lengths_k = ((cu[1:] - cu[:-1]).tolist() for cu in (cu_q, cu_k))  # packed (total, H, D)
    (_, Hq, D), Dv = q.shape, v.shape[-1]
    return sum(_sdpa_flops((1, Hq, lq, D), (1, Hq, lk, D), (1, Hq, lk, Dv), backward)
               for lq, lk in zip(lengths_q, lengths_k, strict=True))


@flop_counter.register_flop_formula(torch.ops.flashattn.masked_forward, get_raw=True)
def _masked_forward_flops(q, k, v, attn_mask, cu_q, cu_k, *args, out_val=None, **kwargs) -> int:
    return _masked_flops(q, k, v, cu_q, cu_k, backward=False)


@flop_counter.register_flop_formula(torch.ops.flashattn.masked_backward, get_raw=True)
def _masked_backward_flops(q, k, v, o, lse, do, attn_mask, cu_q, cu_k, *args, out_val=None, **kwargs) -> int:
    return _masked_flops(q, k, v, cu_q, cu_k, backward=True)
