"""Attention as a differentiable function (notebooks 12 and 13).

* ``attention(q, k, v, variant=..., causal=..., scale=..., **options)``: one variant by name. For the
  variants with a backward pass (:func:`with_backward`: ``v2`` and ``fast``, whose records in the registry
  name it; their forward returns the log-sum-exp with ``return_lse=True``) it is differentiable through one
  ``torch.autograd.Function`` that saves q, k, v, the output O and each row's log-sum-exp: never an N×N
  tensor; the backward recomputes P from them. Backward through any other variant raises an error that
  names the variants that have one.
* ``scaled_dot_product_attention(query, key, value, ...)``: a drop-in for torch's, with its signature and
  semantics, running ``fast`` forward and backward: (…, L, E) inputs with any leading dimensions, L ≠ S
  (``is_causal`` aligned top-left as torch aligns it: query i sees keys j <= i), grouped-query attention
  (``enable_gqa``), head dimensions up to 256. ``dropout_p > 0`` is not implemented and raises an error naming
  the argument; so does a value head dimension Ev ≠ E.

Masks (notebook 14) run in ``flashattn.masking``: ``attention(..., window=(left, right))`` and the drop-in's
``attn_mask`` are routed there by :func:`_masked` (the only lines here that know about masks).
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from flashattn import masking, ops
from flashattn.kernels import VARIANTS, registry

BACKWARD_OPTIONS = ops.BACKWARD_OPTIONS  # forward options the backward follows (the tiles are its own)


def with_backward() -> list[str]:
    """The variants that have a backward pass (``registry.get(name).backward``)."""
    return [name for name, record in registry.REGISTRY.items() if record.backward is not None]


class _Attention(torch.autograd.Function):
    """O = attention(q, k, v); saves q, k, v, O and the log-sum-exp, and runs the variant's backward."""

    @staticmethod
    def forward(ctx, q, k, v, variant, causal, scale, options):
        o, lse = VARIANTS[variant](q, k, v, causal=causal, scale=scale, return_lse=True, **options)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.variant, ctx.causal, ctx.scale = variant, causal, scale
        ctx.backward_options = {key: options[key] for key in BACKWARD_OPTIONS if key in options}
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = registry.get(ctx.variant).backward(q, k, v, o, lse, do, causal=ctx.causal, scale=ctx.scale,
                                                        **ctx.backward_options)
        return dq, dk, dv, None, None, None, None


class _ForwardOnly(torch.autograd.Function):
    """A variant without a backward pass: the forward runs; asking for gradients raises."""

    @staticmethod
    def forward(ctx, q, k, v, variant, causal, scale, options):
        ctx.variant = variant
        return VARIANTS[variant](q, k, v, causal=causal, scale=scale, **options)

    @staticmethod
    def backward(ctx, do):
        raise RuntimeError(f"variant {ctx.variant!r} has no backward pass; the variants with one are "
                           f"{', '.join(map(repr, with_backward()))}: flashattn.attention(q, k, v, variant='fast')")


def attention(q, k, v, *, variant: str = "v2", causal: bool = False, scale=None, **options):
    """Run one variant by name: ``attention(q, k, v, variant="v1", causal=True)``; differentiable for the
    variants in :func:`with_backward`. ``window=(left, right)`` (variant "fast"): a sliding window, see
    :func:`flashattn.masking.attention`."""
    if "window" in options:
        return _masked(q, k, v, variant=variant, causal=causal, scale=scale, **options)
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; accepted: {', '.join(VARIANTS)}")
    if "return_lse" in options:
        raise TypeError("attention: return_lse is not an option here (the autograd function keeps the log-sum-exp "
                        "itself); call the variant directly, e.g. flashattn.kernels.fast.attention_fast")
    if variant == "fast":  # the registered operators (flashattn.ops): torch.compile sees one node per call
        return ops.attention(q, k, v, causal, scale, options)
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    if not needs_grad:
        return VARIANTS[variant](q, k, v, causal=causal, scale=scale, **options)
    function = _Attention if registry.get(variant).backward is not None else _ForwardOnly
    return function.apply(q, k, v, variant, causal, scale, options)


def _masked(q, k, v, *, attn_mask=None, **kwargs):
    """Masked calls (issue 30) go to ``flashattn.masking``: ``attention(..., window=...)`` with its keywords, and the
    drop-in's (B, H, L, E) inputs with their ``attn_mask`` (checked and seen as (B, H, L, S) by
    ``masking.sdpa_mask``) and ``is_causal``."""
    if attn_mask is None:
        return masking.attention(q, k, v, **kwargs)
    return masking.scaled_dot_product_attention(q, k, v, attn_mask, **kwargs)


def _check_sdpa_arguments(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0 <= dropout_p <= 1:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be a number from 0 to 1, got {dropout_p!r}")
    if dropout_p != 0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p={dropout_p} is not supported here (no dropout "
                         "on the attention weights); pass dropout_p=0.0")
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not isinstance(flag, bool):
            raise TypeError(f"scaled_dot_product_attention: {name} must be True or False, got {flag!r}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"scaled_dot_product_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"scaled_dot_product_attention: {name} must have shape (..., length, head dim), got "
                             f"{tuple(t.shape)}")
    def shapes():  # for the messages only: formatting it on every call costs the host more than the checks
        return f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"

    if not query.dim() == key.dim() == value.dim():
        raise ValueError(f"scaled_dot_product_attention: query, key and value must have the same number of "
                         f"dimensions; got {shapes()}")
    E, S, Ev = query.shape[-1], key.shape[-2], value.shape[-1]
    if key.shape[-1] != E:
        raise ValueError(f"scaled_dot_product_attention: key's last dimension must equal query's (E={E}); "
                         f"got {shapes()}")
    if value.shape[-2] != S:
        raise ValueError(f"scaled_dot_product_attention: key and value must have the same length S; got {shapes()}")
    if Ev != E:
        raise ValueError(f"scaled_dot_product_attention: a value head dimension Ev={Ev} other than E={E} is not "
                         f"supported here; got {shapes()}")
    if not query.shape[:-3] == key.shape[:-3] == value.shape[:-3]:
        raise ValueError(f"scaled_dot_product_attention: query, key and value must have the same batch dimensions "
                         f"(no broadcasting here); got {shapes()}")
    if query.dim() >= 3:
        Hq, Hk, Hv = query.shape[-3], key.shape[-3], value.shape[-3]
        if Hk != Hv:
            raise ValueError(f"scaled_dot_product_attention: key and value must have the same number of heads; "
                             f"got {shapes()}")
        if Hq != Hk and not enable_gqa:
            raise ValueError(f"scaled_dot_product_attention: query has {Hq} heads and key/value {Hk}: pass "
                             "enable_gqa=True for grouped-query attention")
        if Hq % Hk:
            raise ValueError(f"scaled_dot_product_attention: with enable_gqa, query heads ({Hq}) must be a multiple "
                             f"of key/value heads ({Hk}); got {shapes()}")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention``, forward and backward, by the ``fast`` kernels.

    query (…, Hq, L, E), key (…, Hkv, S, E), value (…, Hkv, S, E) → (…, Hq, L, E); any number of leading
    dimensions (3-D (…, L, E) included: the dimension before L counts as the heads). ``is_causal``: query i sees
    keys j <= i (torch's top-left alignment when L ≠ S). ``enable_gqa``: Hq a multiple of Hkv, query head h
    reads key/value head h // (Hq / Hkv), as torch's ``repeat_interleave`` does, without copying them.
    ``scale`` defaults to 1/sqrt(E). ``attn_mask``: torch's (boolean, True = takes part, or float added to the
    scores; broadcastable to (…, L, S), read without expanding it; combined with ``is_causal``), run by
    ``flashattn.masking``: only the key blocks the mask leaves are computed.
    """
    _check_sdpa_arguments(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    mask = None if attn_mask is None else masking.sdpa_mask(attn_mask, query, key)
    (L, E), S = query.shape[-2:], key.shape[-2]

    def as_4d(t, length):  # (…, H, N, E) -> (B, H, N, E), a view wherever the strides allow it
        if t.dim() == 4:  # already: no view, so no extra node in the autograd graph (host time per step)
            return t
        if t.dim() == 2:
            return t.reshape(1, 1, length, E)
        return t.reshape(math.prod(t.shape[:-3]), t.shape[-3], length, E)

    if mask is not None:
        out = _masked(as_4d(query, L), as_4d(key, S), as_4d(value, S), attn_mask=mask, is_causal=is_causal, scale=scale)
        return out if out.shape == query.shape else out.reshape(query.shape)
    out = attention(as_4d(query, L), as_4d(key, S), as_4d(value, S), variant="fast", causal=is_causal, scale=scale)
    return out if out.shape == query.shape else out.reshape(query.shape)
