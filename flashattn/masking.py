"""Masked attention as differentiable functions (notebook 14): sliding windows, packed documents and ``attn_mask``.

* ``attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, window, scale)``:
  FlashAttention's ``flash_attn_varlen_func`` (its arguments, its packed layout: q (total_q, H, D), k and v
  (total_k, Hkv, D), int32 ``cu_seqlens`` (B + 1,); causal and windows aligned bottom-right in each document).
* ``attention(q, k, v, variant="fast", causal=..., window=(left, right))``: what ``flashattn.attention`` runs when
  it is given a window: FlashAttention's ``window_size`` (query i sees keys i - left .. i + right, -1 unbounded;
  with ``causal`` the right side is 0), aligned top-left as torch's ``is_causal`` (and ``fast``).
* ``scaled_dot_product_attention(...)``: what the drop-in runs when it is given an ``attn_mask``.
* ``masked_forward(...) -> (o, lse)`` and ``masked_backward(...) -> (dq, dk, dv)``: the plain functions under
  all three, for an operator to wrap.

The kernels are ``kernels/masked.py`` (forward) and ``kernels/masked_backward.py``; the mask's block structure
(which tiles are skipped, partial, full) is ``kernels/mask_blocks.py``. On Hopper a causal sliding window's
forward runs ``fast``'s Gluon kernel with its WINDOW instead (``kernels/fast_gluon.py``;
``masking_gluon.takes_gluon_window`` says when).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch.autograd.function import once_differentiable

from flashattn import masking_gluon, ops, runtime
from flashattn.kernels import launch_cache, mask_blocks, masked
from flashattn.kernels import masked_backward as masked_bwd
from flashattn.kernels.fast_backward import delta_rows
from flashattn.kernels.fast_options import check_tiles
from flashattn.validate import check_attention_inputs

HEAD_DIMS = range(1, 257)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A masked problem, checked: the window (left, right; -1 unbounded), causal, and either packed documents
    (``cu_q``, ``cu_k``, the longest ``max_q``, ``max_k``) or a dense ``mask`` seen as (B, Hq, L, S)."""

    left: int = -1
    right: int = -1
    causal: bool = False
    cu_q: torch.Tensor | None = None
    cu_k: torch.Tensor | None = None
    max_q: int = 0
    max_k: int = 0
    mask: torch.Tensor | None = None

    @property
    def packed(self) -> bool:
        return self.cu_q is not None


# --- checks --------------------------------------------------------------------------------------------------

def _check_tiles(name: str, tiles):
    return check_tiles(name, tiles, variant="masked attention")


def check_cu_seqlens(cu, name: str, total: int, max_seqlen, device) -> int:
    """``cu`` an int32 (B + 1,) tensor on ``device``; on the CPU its values too (from 0 to ``total``, never
    decreasing, no document longer than ``max_seqlen``). On a GPU the values are trusted, as
    ``flash_attn_varlen_func`` trusts them: reading them would make the host wait for the GPU. Returns B."""
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
        got = f"{cu.dtype} of shape {tuple(cu.shape)}" if isinstance(cu, torch.Tensor) else type(cu).__name__
        raise ValueError(f"attention_varlen: {name} must be an int32 tensor of shape (B + 1,), the offsets of the B "
                         f"documents (flash_attn_varlen_func's layout); got {got}")
    if cu.device != device:
        raise ValueError(f"attention_varlen: {name} must be on the inputs' device {device}, got {cu.device}")
    if cu.device.type == "cpu" and not torch.compiler.is_compiling():  # (a trace has no values to read)
        values = cu.tolist()
        lengths = [b - a for a, b in zip(values, values[1:], strict=False)]
        if values[0] != 0 or values[-1] != total or min(lengths) < 0:
            raise ValueError(f"attention_varlen: {name} must rise from 0 to {total} (the packed length), never "
                             f"decreasing; got {values[:8]}{' ...' if len(values) > 8 else ''}")
        if max(lengths) > max_seqlen:
            raise ValueError(f"attention_varlen: a document of {name} has {max(lengths)} rows, more than "
                             f"max_seqlen {max_seqlen}")
    return cu.numel() - 1


def _packed_view(t: torch.Tensor) -> torch.Tensor:
    """(total, H, D) seen as (1, H, total, D), no copy."""
    return t.transpose(0, 1).unsqueeze(0)


def _varlen_spec(q, k, v, cu_q, cu_k, max_q, max_k, causal, window) -> Spec:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"attention_varlen: {name} must have shape (total, heads, D) (packed documents), got "
                             f"{shape}")
    for name, n in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"attention_varlen: {name} must be a positive int (the longest document), got {n!r}")
    docs_q = check_cu_seqlens(cu_q, "cu_seqlens_q", q.shape[0], max_q, q.device)
    docs_k = check_cu_seqlens(cu_k, "cu_seqlens_k", k.shape[0], max_k, q.device)
    if docs_q != docs_k:
        raise ValueError(f"attention_varlen: cu_seqlens_q and cu_seqlens_k must list as many documents, got {docs_q} "
                         f"and {docs_k}")
    left, right = mask_blocks.normalize_window(window, causal)
    return Spec(left, right, causal, cu_q, cu_k, max_q, max_k)


def _as_4d(q, k, v, spec: Spec):
    return tuple(map(_packed_view, (q, k, v))) if spec.packed else (q, k, v)


def _check(q, k, v, spec: Spec, scale, shapes_only: bool = False) -> tuple:
    """The inputs as (B, H, N, D) views, checked (``shapes_only``: for the operator, meta tensors accepted); returns
    (q4, k4, v4, scale)."""
    q4, k4, v4 = _as_4d(q, k, v, spec)
    *_, scale = check_attention_inputs(q4, k4, v4, variant="masked attention", causal=spec.causal, scale=scale,
                                       head_dims=HEAD_DIMS, shapes_only=shapes_only)
    return q4, k4, v4, scale


def _reach(side: int) -> int:
    """A window side as the kernels take it: -1 (unbounded), and any side farther than every key (a side near int32's
    largest value would overflow the kernels' 32-bit index arithmetic), as :data:`masked.REACH`."""
    return masked.REACH if side == -1 or side > masked.REACH else side


def _unique(mask4: torch.Tensor) -> torch.Tensor:
    """The dimensions of a (B, H, L, S) mask view that it broadcasts along (zero strides), as size 1: the
    classification reads each element of the mask once, not once per head or per query."""
    return mask4[tuple(slice(0, 1) if mask4.stride(i) == 0 else slice(None) for i in range(4))]


def _mask_dtype(spec: Spec):
    """The dense mask's dtype (its kernels have their own tiles), None for windows and documents."""
    return None if spec.mask is None else spec.mask.dtype


def default_tiles(dtype: torch.dtype, D: int, mask: torch.dtype | None = None, mode: str | None = None) -> tuple:
    """The (forward, dK/dV, dQ) tiles masked attention launches with when none are given: the window kernels'
    (``mask`` None: windows, documents), or the blocks kernels' for a dense mask of dtype ``mask``."""
    return (masked.tiles_for(dtype, D, mode, mask=mask)[0],
            *(masked_bwd.tiles_for(kernel, dtype, D, mode, mask=mask)[0] for kernel in ("dkdv", "dq")))


def _tables(spec: Spec, L: int, S: int, tiles) -> mask_blocks.BlockTables:
    kinds = mask_blocks.classify(_unique(spec.mask), tiles[0], tiles[1], shape=(L, S), causal=spec.causal)
    return mask_blocks.block_tables(kinds, tiles[0], tiles[1])


# --- forward and backward -------------------------------------------------------------------------------------

def make_spec(q, k, v, *, causal=False, window=(-1, -1), attn_mask=None, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q=None, max_seqlen_k=None) -> Spec:
    """The :class:`Spec` of :func:`masked_forward`'s arguments, checked."""
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if attn_mask is not None:
            raise ValueError("masked attention: attn_mask and packed documents (cu_seqlens) cannot be combined")
        return _varlen_spec(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window)
    left, right = mask_blocks.normalize_window(window, causal)
    if attn_mask is None:
        return Spec(left, right, causal)
    if not mask_blocks.window_is_unbounded(left, -1 if causal else right):
        raise ValueError("masked attention: a window and attn_mask cannot be combined (fold the window into the mask)")
    L, S = q.shape[-2], k.shape[-2]
    if (not isinstance(attn_mask, torch.Tensor) or attn_mask.dim() != 4 or attn_mask.shape[2:] != (L, S)
            or attn_mask.shape[:2] != (q.shape[0], q.shape[1])):
        raise ValueError(f"masked attention: attn_mask must be a (B, Hq, L, S) = {(*q.shape[:2], L, S)} view (expand "
                         f"a broadcast mask: zero strides are read as such), got "
                         f"{tuple(attn_mask.shape) if isinstance(attn_mask, torch.Tensor) else attn_mask!r}")
    return Spec(-1, -1, causal, mask=attn_mask)


def _forward(q, k, v, spec: Spec, scale: float, tiles, counts) -> tuple:
    q4, k4, v4 = _as_4d(q, k, v, spec)
    (B, H, L, D), S = q4.shape, k4.shape[2]
    gluon = masking_gluon.takes_gluon_window(q4, k4, v4, spec, tiles, counts)
    key_mask = masking_gluon.takes_gluon_key_mask(q4, k4, v4, spec, tiles, counts)
    documents = masking_gluon.takes_gluon_documents(q4, k4, v4, spec, tiles, counts)
    tiles = (_check_tiles("tiles", tiles) if tiles is not None
             else masked.tiles_for(q.dtype, D, mask=_mask_dtype(spec))[0])
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if spec.packed:
        lse = torch.empty((H, q.shape[0]), dtype=torch.float32, device=q.device)  # flash_attn_varlen_func's layout
        o4, lse3 = _packed_view(o), lse.unsqueeze(0)
    else:
        lse = torch.empty((B, H, L), dtype=torch.float32, device=q.device)
        o4, lse3 = o, lse
    if key_mask:
        masking_gluon.key_mask_forward(q4, k4, v4, o4, lse3, spec, scale)
    elif spec.mask is not None:
        found = None if counts is None else torch.zeros((H, B, -(-L // tiles[0]), 2), dtype=torch.int32,
                                                         device=q.device)
        masked.forward_blocks(q4, k4, v4, o4, lse3, spec.mask, _tables(spec, L, S, tiles), causal=spec.causal,
                              scale=scale, tiles=tiles, counts=found)
    elif gluon:
        masking_gluon.window_forward(q4, k4, v4, o4, lse3, min(spec.left, L), scale)  # wider than the sequence: causal
    elif documents:
        masking_gluon.documents_forward(q4, k4, v4, o4, lse3, spec, scale)
    else:
        docs = spec.cu_q.numel() - 1 if spec.packed else B
        found = None if counts is None else torch.zeros((H, docs, -(-(spec.max_q or L) // tiles[0]), 2),
                                                         dtype=torch.int32, device=q.device)
        masked.forward_window(q4, k4, v4, o4, lse3, left=_reach(spec.left), right=_reach(spec.right), scale=scale,
                              tiles=tiles, cu_q=spec.cu_q, cu_k=spec.cu_k, max_seqlen_q=spec.max_q,
                              bottom_right=spec.packed, counts=found)
    if counts is not None:
        counts["forward"] = found
    return o, lse


def _backward_tiles(q, spec: Spec, dkdv_tiles, dq_tiles) -> tuple:
    D = q.shape[-1]
    dkdv_tiles = (_check_tiles("dkdv_tiles", dkdv_tiles) if dkdv_tiles is not None
                  else masked_bwd.tiles_for("dkdv", q.dtype, D, mask=_mask_dtype(spec))[0])
    dq_tiles = (_check_tiles("dq_tiles", dq_tiles) if dq_tiles is not None
                else masked_bwd.tiles_for("dq", q.dtype, D, mask=_mask_dtype(spec))[0])
    return dkdv_tiles, dq_tiles


def _backward(q, k, v, o, lse, do, spec: Spec, scale: float, dkdv_tiles, dq_tiles, counts) -> tuple:
    explicit = dkdv_tiles if dkdv_tiles is not None else dq_tiles
    dkdv_tiles, dq_tiles = _backward_tiles(q, spec, dkdv_tiles, dq_tiles)
    if do.stride(-1) != 1:  # the kernels read dO through its strides; rows of it they read whole
        do = do.contiguous()
    q4, k4, v4 = _as_4d(q, k, v, spec)
    if spec.packed and masking_gluon.takes_gluon_documents_backward(q4, k4, v4, _packed_view(do), spec, explicit,
                                                                    counts):
        grads = masking_gluon.documents_backward(q4, k4, v4, _packed_view(o), lse.unsqueeze(0), _packed_view(do),
                                                 spec, scale)
        return tuple(g[0].transpose(0, 1) for g in grads)  # (total, H, D), as the inputs
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if spec.packed:
        do4, lse3 = _packed_view(do), lse.unsqueeze(0)
        dq4, dk4, dv4 = map(_packed_view, (dq, dk, dv))
        delta3 = delta_rows(_packed_view(o), do4)  # (1, H, total), read in place: no copy of a strided dO
    else:
        do4, lse3, dq4, dk4, dv4 = do, lse, dq, dk, dv
        delta3 = delta_rows(o, do)  # (B, H, L)
    if spec.mask is not None:
        L, S = q4.shape[2], k4.shape[2]
        dkdv_tables = _tables(spec, L, S, dkdv_tiles)
        dq_tables = dkdv_tables if dq_tiles[:2] == dkdv_tiles[:2] else _tables(spec, L, S, dq_tiles)
        masked_bwd.backward_blocks(q4, k4, v4, do4, lse3, delta3, dq4, dk4, dv4, spec.mask, dkdv_tables,
                                        dq_tables, causal=spec.causal, scale=scale, dkdv_tiles=dkdv_tiles,
                                        dq_tiles=dq_tiles, counts=counts)
    else:
        masked_bwd.backward_window(q4, k4, v4, do4, lse3, delta3, dq4, dk4, dv4, left=_reach(spec.left),
                                        right=_reach(spec.right), scale=scale, dkdv_tiles=dkdv_tiles,
                                        dq_tiles=dq_tiles, cu_q=spec.cu_q, cu_k=spec.cu_k, max_seqlen_q=spec.max_q,
                                        max_seqlen_k=spec.max_k, bottom_right=spec.packed, counts=counts)
    return dq, dk, dv


def masked_forward(q, k, v, *, causal=False, window=(-1, -1), attn_mask=None, cu_seqlens_q=None, cu_seqlens_k=None,
                   max_seqlen_q=None, max_seqlen_k=None, scale=None, tiles=None, counts=None):
    """Masked attention's forward: ``(o, lse)``, the output and the float32 log-sum-exp of each row (natural log;
    +inf for a row that sees no key, whose output is 0).

    Layouts: with ``cu_seqlens_q``/``cu_seqlens_k`` packed documents (q (total_q, Hq, D), k, v (total_k, Hkv, D);
    o like q, lse (Hq, total_q)); otherwise q (B, Hq, L, D), k, v (B, Hkv, S, D), lse (B, Hq, L). The mask: the
    ``window`` (with ``causal``), the documents, or ``attn_mask``, a boolean or float (B, Hq, L, S) view (zero
    strides where it broadcasts: they are read as such, not copied), combined with ``causal``. ``tiles``: the
    forward's (block_m, block_n, num_warps, num_stages); ``counts``: a dict that gets the int32 (Hq, B or
    documents, Q blocks, 2) tensor "forward" of the (full, partial) key blocks each Q block computed."""
    spec = make_spec(q, k, v, causal=causal, window=window, attn_mask=attn_mask, cu_seqlens_q=cu_seqlens_q,
                     cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    *_, scale = _check(q, k, v, spec, scale)
    return _forward(q, k, v, spec, scale, tiles, counts)


def masked_backward(q, k, v, o, lse, do, *, causal=False, window=(-1, -1), attn_mask=None, cu_seqlens_q=None,
                    cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, scale=None, dkdv_tiles=None,
                    dq_tiles=None, counts=None):
    """``(dq, dk, dv)`` of :func:`masked_forward`'s output given its ``o``, ``lse`` and the output's gradient ``do``
    (layouts and mask arguments as there). ``dkdv_tiles``/``dq_tiles``: each kernel's tiles; ``counts``: a dict that
    gets "dkdv" (Hkv, …, key blocks, 2: the (full, partial) Q-block tiles each key block computed, summed over its
    query heads) and "dq" (Hq, …, Q blocks, 2)."""
    spec = make_spec(q, k, v, causal=causal, window=window, attn_mask=attn_mask, cu_seqlens_q=cu_seqlens_q,
                     cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    *_, scale = _check(q, k, v, spec, scale)
    for name, t, want in (("o", o, q.shape), ("do", do, q.shape), ("lse", lse, None)):
        if not isinstance(t, torch.Tensor) or (want is not None and t.shape != want) or t.device != q.device:
            raise ValueError(f"masked_backward: {name} must be the forward's, on {q.device}"
                             + (f", of shape {tuple(want)}" if want else ""))
    return _backward(q, k, v, o, lse, do, spec, scale, dkdv_tiles, dq_tiles, counts)


_BACKWARD_RUNS: dict = {}  # a window problem's bound backward (_bind_window_backward), by launch_cache.problem_key
_ORDINARY = object()  # a problem the bound backward does not take


def _window_backward(q, k, v, o, lse, do, spec: Spec, scale: float, options: dict):
    """A sliding window's backward (no documents, no dense mask) bound once per problem (the tensors' shapes,
    strides, dtypes and alignment, the window, the scale, the options), as the forward's Gluon launch is: run(q, k,
    v, o, lse, do) -> (dq, dk, dv); None where :func:`_backward` runs it."""
    if spec.mask is not None or spec.packed or masked_bwd.CONCURRENT_DQ or launch_cache._captured is not None:
        return None
    key = launch_cache.problem_key((q, k, v, o, lse, do), (spec.left, spec.right, spec.causal, scale), options)
    if key is None:
        return None
    run = launch_cache.kept(_BACKWARD_RUNS, key,
                            lambda: _bind_window_backward(q, k, v, o, lse, do, spec, scale, options) or _ORDINARY)
    return None if run is _ORDINARY else run


def _bind_window_backward(q, k, v, o, lse, do, spec: Spec, scale: float, options: dict):
    from flashattn.kernels.fast_backward import bind_delta

    if do.stride(-1) != 1:
        return None
    dkdv_tiles, dq_tiles = _backward_tiles(q, spec, options.get("dkdv_tiles"), options.get("dq_tiles"))
    delta = torch.empty(o.shape[:-1], dtype=torch.float32, device=o.device)  # as delta_run makes it
    kernels = masked_bwd.bind_window(q, k, v, do, lse, delta, torch.empty_like(q), torch.empty_like(k),
                                     torch.empty_like(v), left=_reach(spec.left), right=_reach(spec.right),
                                     scale=scale, dkdv_tiles=dkdv_tiles, dq_tiles=dq_tiles)
    if kernels is None:
        return None
    delta_run = bind_delta(o, do)

    def run(q, k, v, o, lse, do):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        kernels(q, k, v, do, lse, delta_run(o, do), dq, dk, dv)
        return dq, dk, dv

    return run


_FORWARD_RUNS: dict = {}  # a window problem's prepared forward (_window_forward), by launch_cache.problem_key


def _window_forward(q, k, v, spec: Spec, scale, options: dict):
    """A sliding window's forward (no documents, no dense mask) prepared once per problem (the tensors' shapes,
    strides, dtypes and alignment, the window, the scale given, the options): ``(scale, run)`` with run(q, k, v) ->
    (o, lse), the checks and the choice of kernel made the first time (they depend on nothing else) and the Gluon
    launch bound; None for the ordinary path (:func:`_apply`). On a short window the GPU finishes the forward sooner
    than the host prepares it (checks, tiles, launch), so a training step runs at the host's pace."""
    if launch_cache._captured is not None:  # (a trace, a subclass or a dispatch mode never gets here: ops.direct)
        return None
    key = launch_cache.problem_key((q, k, v), (spec.left, spec.right, spec.causal, scale, runtime.MODE), options)
    return None if key is None else launch_cache.kept(_FORWARD_RUNS, key,
                                                      lambda: _prepare_window_forward(q, k, v, spec, scale, options))


def _prepare_window_forward(q, k, v, spec: Spec, scale, options: dict):
    """:func:`_window_forward`'s ``(scale, run)`` for a new problem: the checks, the kernel, the Gluon launch bound."""
    q4, k4, v4, checked = _check(q, k, v, spec, scale)
    _check_options(options)
    tiles = options.get("tiles")
    if not masking_gluon.takes_gluon_window(q4, k4, v4, spec, tiles, None):
        return checked, lambda q, k, v: _forward(q, k, v, spec, checked, tiles, None)

    def outputs(q):  # o and lse as _forward makes them
        return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
                torch.empty(q.shape[:3], dtype=torch.float32, device=q.device))

    launch = masking_gluon.bind_window(q, k, v, *outputs(q), min(spec.left, q.shape[2]), checked)

    def run(q, k, v):
        o, lse = outputs(q)
        launch(q, k, v, o, lse)
        return o, lse

    return checked, run


class _MaskedAttention(torch.autograd.Function):
    """O = masked attention(q, k, v); saves q, k, v, O and the log-sum-exp (never an L × S tensor). ``run``: a
    window's prepared forward (:func:`_window_forward`), or None."""

    @staticmethod
    def forward(ctx, q, k, v, spec, scale, options, run=None):
        o, lse = run(q, k, v) if run is not None else _forward(q, k, v, spec, scale, options.get("tiles"), None)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.spec, ctx.scale, ctx.options = spec, scale, options
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        run = _window_backward(q, k, v, o, lse, do, ctx.spec, ctx.scale, ctx.options)
        if run is not None:
            return (*run(q, k, v, o, lse, do), None, None, None, None)
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.spec, ctx.scale, ctx.options.get("dkdv_tiles"),
                               ctx.options.get("dq_tiles"), None)
        return dq, dk, dv, None, None, None, None


def _check_options(options: dict) -> None:
    unknown = sorted(set(options) - {"tiles", "dkdv_tiles", "dq_tiles"})
    if unknown:
        raise TypeError(f"masked attention: unknown option(s) {', '.join(unknown)}; accepted: dkdv_tiles, dq_tiles, "
                        "tiles")


def _apply(q, k, v, spec: Spec, scale, options: dict):
    direct = ops.direct(q, k, v)  # eager, real tensors, nothing watching the dispatcher: the kernels themselves
    if direct and not spec.packed and spec.mask is None:
        prepared = _window_forward(q, k, v, spec, scale, options)
        if prepared is not None:
            scale, run = prepared
            if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                return _MaskedAttention.apply(q, k, v, spec, scale, options, run)
            return run(q, k, v)[0]
    *_, scale = _check(q, k, v, spec, scale, shapes_only=not direct)
    _check_options(options)
    if not direct:  # the operator: one node to torch.compile, tensor subclasses, meta tensors and dispatch modes
        return ops.masked_attention(q, k, v, spec, scale, options)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _MaskedAttention.apply(q, k, v, spec, scale, options)
    return _forward(q, k, v, spec, scale, options.get("tiles"), None)[0]


# --- the public entry points -----------------------------------------------------------------------------------

def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                     window=(-1, -1), scale=None):
    """FlashAttention's ``flash_attn_varlen_func`` (its arguments and packed layout), differentiable: documents of
    q (total_q, Hq, D) and k, v (total_k, Hkv, D), packed one after another, document b at rows
    ``cu_seqlens[b] .. cu_seqlens[b + 1]``; each query sees only its own document's keys, through ``window``
    (FlashAttention's ``window_size``; -1 unbounded) and ``causal``, both aligned bottom-right in each document
    (a query row that sees no key gives 0). Hq a multiple of Hkv. Returns (total_q, Hq, D).

    Only key blocks a document (and its window) leaves are computed; every Q block lies inside one document."""
    spec = _varlen_spec(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window)
    return _apply(q, k, v, spec, scale, {})


def attention(q, k, v, *, variant: str = "fast", causal: bool = False, scale=None, window=(-1, -1), **options):
    """``flashattn.attention(..., window=(left, right))``: variant "fast" with FlashAttention's ``window_size``,
    aligned top-left as torch's ``is_causal`` (query i sees keys i - left .. i + right, -1 unbounded; ``causal``:
    right = 0); q (B, Hq, L, D), k, v (B, Hkv, S, D). Options: ``tiles``, ``dkdv_tiles``, ``dq_tiles``."""
    if variant != "fast":
        raise ValueError(f"window is an option of variant 'fast' (the masked kernels), not of {variant!r}")
    left, right = mask_blocks.normalize_window(window, causal)
    return _apply(q, k, v, Spec(left, right, causal), scale, options)


def sdpa_mask(attn_mask, query, key) -> torch.Tensor:
    """The drop-in's ``attn_mask`` checked as torch checks it (boolean, float32 or query's dtype, broadcastable to
    (…, L, S)) and seen as (B, H, L, S) like the drop-in's inputs, broadcast dimensions as zero strides."""
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"scaled_dot_product_attention: attn_mask must be a torch.Tensor or None, got "
                        f"{type(attn_mask).__name__}")
    if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
        raise TypeError(f"scaled_dot_product_attention: attn_mask must be bool (True = takes part), float32 or the "
                        f"query's dtype {query.dtype} (added to the scores), as torch's; got {attn_mask.dtype}")
    if attn_mask.device != query.device:
        raise ValueError(f"scaled_dot_product_attention: attn_mask must be on the query's device {query.device}, got "
                         f"{attn_mask.device}")
    shape = (*query.shape[:-1], key.shape[-2])
    try:
        fits = torch.broadcast_shapes(attn_mask.shape, shape) == shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"scaled_dot_product_attention: attn_mask of shape {tuple(attn_mask.shape)} does not "
                         f"broadcast to (..., L, S) = {shape}")
    if attn_mask.requires_grad and torch.is_grad_enabled():
        raise ValueError("scaled_dot_product_attention: attn_mask requires grad, and its gradient is not computed here "
                         "(only query's, key's and value's); pass attn_mask.detach(), or torch's own function to train "
                         "the mask")
    mask = attn_mask.expand(shape)
    L, S = shape[-2:]
    if mask.dim() == 2:
        return mask.view(1, 1, L, S)
    if mask.dim() == 3:
        return mask.unsqueeze(0)
    # several batch dimensions seen as one: a view where the strides allow it, else (a mask broadcast along some of
    # them only) a copy of the mask, once per call
    return mask if mask.dim() == 4 else mask.reshape(math.prod(shape[:-3]), shape[-3], L, S)


def scaled_dot_product_attention(query4, key4, value4, attn_mask4, *, is_causal: bool, scale=None):
    """The drop-in's masked path: (B, H, L, E) inputs (already checked by the drop-in) and the (B, H, L, S) mask of
    :func:`sdpa_mask`, combined with ``is_causal`` (top-left) as torch's fused kernels combine them."""
    return _apply(query4, key4, value4, Spec(-1, -1, is_causal, mask=attn_mask4), scale, {})
