"""Input checks shared by the reference and every kernel.

Each error says what was given and what is accepted, so that a mistake surfaces here and not as a
crash deep inside Triton or, worse, as a silently wrong result.
"""

from __future__ import annotations

import math
import weakref

import torch

from flashattn import runtime

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
POW2_HEAD_DIMS = (16, 32, 64, 128, 256)
INPUT_PRECISIONS = ("ieee", "tf32", "tf32x3")
TILE_KEYS = ("block_m", "block_n", "num_warps", "num_stages")  # the launch options that set the tiles

_DTYPE_NAMES = ", ".join(str(d).replace("torch.", "") for d in KERNEL_DTYPES)


def _check_tensors(q, k, v) -> None:
    """q, k, v: 4-D tensors of one floating-point dtype on one device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dimensions (B, H, N, D), got shape {tuple(t.shape)} ({t.dim()} dims)"
            )


def _check_dtype_device(q, k, v) -> None:
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have one dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device; got q on {q.device}, k on {k.device}, v on {v.device}"
        )
    if not q.dtype.is_floating_point:
        raise TypeError(f"q, k, v must be floating point, got {q.dtype}")


def check_shapes(q, k, v) -> tuple[int, int, int, int]:
    """q, k, v: tensors of one shape (B, H, N, D) with B, H, N, D >= 1, one dtype, one device."""
    _check_tensors(q, k, v)
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            "q, k and v must have the same shape (B, H, N, D); got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if any(s < 1 for s in q.shape):
        raise ValueError(f"every dimension of (B, H, N, D) must be >= 1, got {tuple(q.shape)}")
    _check_dtype_device(q, k, v)
    return tuple(q.shape)


def check_attention_shapes(q, k, v) -> tuple[int, int, int, int, int, int]:
    """q (B, Hq, L, D) and k, v (B, Hkv, S, D), as ``scaled_dot_product_attention`` takes them with
    ``enable_gqa=True``: L and S may differ, and Hq must be a multiple of Hkv (grouped-query attention: query
    head h attends with K/V head h // (Hq / Hkv)). Returns (B, Hq, Hkv, L, S, D)."""
    _check_tensors(q, k, v)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, Hkv, S, D); got k {tuple(k.shape)}, v {tuple(v.shape)}")
    for name, t in (("q", q), ("k", k)):
        if any(s < 1 for s in t.shape):
            raise ValueError(f"every dimension of {name} must be >= 1, got {tuple(t.shape)}")
    (B, Hq, L, D), (Bk, Hkv, S, Dk) = q.shape, k.shape
    if B != Bk or D != Dk:
        raise ValueError(
            "q (B, Hq, L, D) and k, v (B, Hkv, S, D) must have the same batch B and head dimension D; got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if Hq % Hkv:
        raise ValueError(
            f"the query heads must be a multiple of the key/value heads (grouped-query attention); got Hq={Hq} "
            f"(q {tuple(q.shape)}) and Hkv={Hkv} (k {tuple(k.shape)})"
        )
    _check_dtype_device(q, k, v)
    return B, Hq, Hkv, L, S, D


def check_scale(scale, D: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a Python float or None, got {type(scale).__name__}")
    if not math.isfinite(scale) or scale == 0:
        raise ValueError(f"scale must be finite and non-zero, got {scale}")
    return float(scale)


def check_causal(causal) -> bool:
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    return causal


def _check_kernel_dtype_device_and_d(q, variant: str, D: int, head_dims, shapes_only: bool = False) -> None:
    """``shapes_only``: the caller computes no data, only the outputs' shapes (an operator's fake implementation), so
    meta tensors are accepted; elsewhere they are refused by name (a kernel would read their missing data)."""
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(
            f"{variant}: dtype {q.dtype} is not supported; accepted: {_DTYPE_NAMES} "
            "(use flashattn.reference for float64)"
        )
    if runtime.MODE == "interpreter" and q.dtype == torch.bfloat16:
        raise TypeError(
            f"{variant}: bfloat16 is refused in interpreter mode: Triton's CPU interpreter computes "
            "tl.dot on bfloat16 incorrectly (relative errors around 1e9), so the result would be "
            "garbage. Use float16 or float32 here; bfloat16 runs on a GPU."
        )
    if runtime.MODE == "gpu" and not runtime.HAS_GPU:
        raise ValueError(f"{variant}: TRITON_INTERPRET=0 was set but no CUDA GPU is visible")
    sm = f"sm_{runtime.CAPABILITY[0]}{runtime.CAPABILITY[1]}" if runtime.CAPABILITY else None
    if runtime.MODE == "gpu" and runtime.CAPABILITY < (7, 5):
        raise ValueError(f"{variant}: this GPU is {sm}; Triton compiles for sm_75 (Turing) and newer. Use the "
                         "interpreter (TRITON_INTERPRET=1) on this machine")
    if runtime.MODE == "gpu" and q.dtype == torch.bfloat16 and runtime.CAPABILITY < (8, 0):
        raise TypeError(f"{variant}: bfloat16 needs a GPU of sm_80 or newer; this one is {sm} ({runtime.gpu_name()}). "
                        "Use float16 (or float32)")
    if runtime.MODE == "gpu" and q.device.type != "cuda" and not q.is_meta:
        raise ValueError(
            f"{variant}: GPU mode needs CUDA tensors, got tensors on {q.device}; "
            "move them with .cuda() (or set TRITON_INTERPRET=1 to use the CPU interpreter)"
        )
    if D not in head_dims:
        accepted = (f"any D from {head_dims.start} to {head_dims.stop - 1}" if isinstance(head_dims, range)
                    else ", ".join(map(str, head_dims)))
        hint = "" if variant in ("v2_padded", "fast") else "; for other head dimensions use the 'v2_padded' variant"
        raise ValueError(f"{variant}: head dimension D={D} is not supported; accepted: {accepted}{hint}")
    if q.is_meta and not shapes_only:
        raise ValueError(
            f"{variant}: q, k and v are meta tensors, which hold no data for a kernel to read; the operators give "
            "the outputs' shapes on meta tensors: the drop-in scaled_dot_product_attention, "
            "attention(variant='fast') and attention_varlen"
        )


def check_kernel_inputs(q, k, v, *, variant: str, causal, scale, head_dims=POW2_HEAD_DIMS):
    """Everything a Triton variant needs to know is acceptable. Returns (B, H, N, D, scale)."""
    B, H, N, D = check_shapes(q, k, v)
    causal = check_causal(causal)
    _check_kernel_dtype_device_and_d(q, variant, D, head_dims)
    return B, H, N, D, check_scale(scale, D)


def check_attention_inputs(q, k, v, *, variant: str, causal, scale, head_dims=POW2_HEAD_DIMS,
                           shapes_only: bool = False):
    """:func:`check_kernel_inputs` for a variant that takes L != S and grouped K/V heads
    (:func:`check_attention_shapes`); ``shapes_only`` for an operator's fake implementation (meta tensors
    accepted). Returns (B, Hq, Hkv, L, S, D, scale)."""
    B, Hq, Hkv, L, S, D = check_attention_shapes(q, k, v)
    causal = check_causal(causal)
    _check_kernel_dtype_device_and_d(q, variant, D, head_dims, shapes_only)
    return B, Hq, Hkv, L, S, D, check_scale(scale, D)


def _is_pow2(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0 and (x & (x - 1)) == 0


def resolve_options(variant: str, options: dict, defaults: dict, dtype: torch.dtype) -> dict:
    """Merge user options over ``defaults``; unknown names and bad values raise."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(
            f"{variant}: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(defaults))}"
        )
    opts = {**defaults, **options}
    for key in ("block_m", "block_n"):
        if key in opts and (not _is_pow2(opts[key]) or opts[key] < 16):
            raise ValueError(f"{variant}: {key} must be a power of two >= 16, got {opts[key]!r}")
    if "num_warps" in opts and (not _is_pow2(opts["num_warps"]) or opts["num_warps"] > 32):
        raise ValueError(f"{variant}: num_warps must be a power of two <= 32, got {opts['num_warps']!r}")
    if "num_stages" in opts:
        st = opts["num_stages"]
        if isinstance(st, bool) or not isinstance(st, int) or st < 1:
            raise ValueError(f"{variant}: num_stages must be an integer >= 1, got {st!r}")
    if "input_precision" in options and dtype != torch.float32:
        raise ValueError(
            f"{variant}: input_precision applies to float32 inputs only (got {dtype}); "
            "16-bit inputs always use the tensor cores"
        )
    if "input_precision" in opts and opts["input_precision"] not in INPUT_PRECISIONS:
        raise ValueError(
            f"{variant}: input_precision must be one of {', '.join(INPUT_PRECISIONS)}, "
            f"got {opts['input_precision']!r}"
        )
    for key, value in opts.items():
        if isinstance(defaults.get(key), bool) and not isinstance(value, bool):
            raise TypeError(f"{variant}: option {key} must be True or False, got {value!r}")
    return opts


def remembered(cache: dict, key: tuple, options: dict, check):
    """``check()`` (options after defaults and checks) computed once per distinct ``key`` and ``options`` in this
    mode, then returned from ``cache``: checking costs the host as much as a short kernel takes on the GPU.
    Options with an unhashable value are checked every time (and a bad option raises every time)."""
    try:
        full = (runtime.MODE, *key, tuple(sorted((k, type(v), v) for k, v in options.items())))
        hash(full)
    except TypeError:
        return check()
    if full not in cache:
        cache[full] = check()
    return cache[full]


def check_o_lse_do(q, o, lse, do, *, variant: str) -> None:
    """What the backward takes beyond the forward's inputs: ``o`` and ``do`` tensors like q, and ``lse`` the
    forward's float32 log-sum-exp, one per query row (q's first three dimensions). Used by both backwards."""
    def describe(t):
        return f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__

    for name, t in (("o", o), ("do", do)):
        if not isinstance(t, torch.Tensor) or t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{variant}: {name} must be a tensor like q, {describe(q)}; got {describe(t)}")
    rows = tuple(q.shape[:3])
    if not isinstance(lse, torch.Tensor) or lse.shape != rows or lse.dtype != torch.float32 or lse.device != q.device:
        raise ValueError(f"{variant}: lse must be the forward's float32 log-sum-exp, one per query row: {rows} "
                         f"(q's first three dimensions) on {q.device}; got {describe(lse)}")


# --- attention over a key/value cache (notebook 15) ----------------------------------------------------------

KVCACHE_HEAD_DIMS = range(1, 257)
PAGE_MULTIPLE = 16  # a page holds a multiple of 16 keys


def _describe(t) -> str:
    return f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else repr(t)


def check_kvcache_inputs(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale, num_splits,
                         max_splits: int) -> dict:
    """The shapes, dtypes and devices of ``attention_with_kvcache``'s arguments (FlashAttention's
    ``flash_attn_with_kvcache`` layout); nothing here reads a tensor's values (see :func:`check_kvcache_values`).

    q (B, Lq, Hq, D); k_cache, v_cache (B, S_max, Hkv, D), or with ``block_table`` (num_pages, page_size, Hkv, D)
    and block_table (B, max_pages) int32; cache_seqlens (B,) int32 or a Python int. Returns a dict with B, Lq, Hq,
    Hkv, D, capacity (the keys one sequence can hold: S_max, or max_pages · page_size), page_size (0 without a
    block table), num_pages, scale, causal, num_splits and seqlen (the int, or None for a tensor)."""
    name = "attention_with_kvcache"
    for arg, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            layout = "(B, Lq, Hq, D)" if arg == "q" else "(B, S_max, Hkv, D), or (num_pages, page_size, Hkv, D) " \
                                                         "with a block_table"
            raise ValueError(f"{name}: {arg} must have 4 dimensions {layout}, got shape {tuple(t.shape)}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"{name}: k_cache and v_cache must have one shape; got k_cache {tuple(k_cache.shape)}, "
                         f"v_cache {tuple(v_cache.shape)}")
    for arg, t in (("q", q), ("k_cache", k_cache)):
        if any(s < 1 for s in t.shape):
            raise ValueError(f"{name}: every dimension of {arg} must be >= 1, got {tuple(t.shape)}")
    _check_dtype_device(q, k_cache, v_cache)
    _check_kernel_dtype_device_and_d(q, name, q.shape[-1], KVCACHE_HEAD_DIMS)
    (B, Lq, Hq, D), (n0, n1, Hkv, Dk) = q.shape, k_cache.shape
    if Dk != D:
        raise ValueError(f"{name}: q and the caches must have one head dimension D; got q {tuple(q.shape)}, "
                         f"k_cache {tuple(k_cache.shape)}")
    if Hq % Hkv:
        raise ValueError(f"{name}: the query heads must be a multiple of the cache's key/value heads (grouped-query "
                         f"attention); got Hq={Hq} (q {tuple(q.shape)}) and Hkv={Hkv} (k_cache {tuple(k_cache.shape)})")
    if block_table is None:
        if n0 != B:
            raise ValueError(f"{name}: without a block_table, k_cache is (B, S_max, Hkv, D) with q's batch B={B}; got "
                             f"k_cache {tuple(k_cache.shape)} (for a paged cache, pass block_table)")
        capacity, page_size, num_pages = n1, 0, 0
    else:
        if not isinstance(block_table, torch.Tensor):
            raise TypeError(f"{name}: block_table must be a torch.Tensor (B, max_pages) of int32 or None, got "
                            f"{type(block_table).__name__}")
        if block_table.dtype != torch.int32:
            raise TypeError(f"{name}: block_table must be int32 (as in FlashAttention), got {block_table.dtype}; "
                            "convert it with .int()")
        if block_table.dim() != 2 or block_table.shape[0] != B or block_table.shape[1] < 1:
            raise ValueError(f"{name}: block_table must be (B, max_pages) with q's batch B={B}; got "
                             f"{tuple(block_table.shape)}")
        if block_table.device != q.device:
            raise ValueError(f"{name}: block_table must be on q's device {q.device}, got {block_table.device}")
        num_pages, page_size = n0, n1
        if page_size % PAGE_MULTIPLE:
            raise ValueError(f"{name}: a paged cache (num_pages, page_size, Hkv, D) needs page_size a multiple of "
                             f"{PAGE_MULTIPLE}; got k_cache {tuple(k_cache.shape)} (page_size {page_size})")
        capacity = block_table.shape[1] * page_size
    seqlen = None
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.Tensor)):
        raise TypeError(f"{name}: cache_seqlens must be a (B,) int32 tensor or an int, got "
                        f"{type(cache_seqlens).__name__}")
    if isinstance(cache_seqlens, int):
        check_int_seqlen(cache_seqlens, Lq, capacity)
        seqlen = cache_seqlens
    else:
        if cache_seqlens.dtype != torch.int32:
            raise TypeError(f"{name}: cache_seqlens must be int32 (as in FlashAttention), got {cache_seqlens.dtype}; "
                            "convert it with .int()")
        if cache_seqlens.shape != (B,):
            raise ValueError(f"{name}: cache_seqlens must have shape (B,) = ({B},), got {tuple(cache_seqlens.shape)}")
        if cache_seqlens.device != q.device:
            raise ValueError(f"{name}: cache_seqlens must be on q's device {q.device}, got {cache_seqlens.device}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 0 <= num_splits <= max_splits:
        raise ValueError(f"{name}: num_splits must be an int from 0 (chosen from the problem and the GPU) to "
                         f"{max_splits}; got {num_splits!r}")
    return dict(B=B, Lq=Lq, Hq=Hq, Hkv=Hkv, D=D, capacity=capacity, page_size=page_size, num_pages=num_pages,
                scale=check_scale(softmax_scale, D), causal=check_causal(causal), num_splits=num_splits, seqlen=seqlen)


_checked_values: dict = {}  # id(tensor) -> (weak reference, torch's version counter, what else was checked)


def _unchanged(t, extra) -> bool:
    entry = _checked_values.get(id(t))
    return entry is not None and entry[0]() is t and entry[1:] == (t._version, extra)


def _remember(t, extra) -> None:
    if len(_checked_values) > 256:
        _checked_values.clear()
    _checked_values[id(t)] = (weakref.ref(t), t._version, extra)


def check_int_seqlen(cache_seqlens: int, Lq: int, capacity: int) -> None:
    """An int cache_seqlens (every sequence's length) from Lq to the cache's capacity."""
    if not Lq <= cache_seqlens <= capacity:
        raise ValueError(f"attention_with_kvcache: cache_seqlens={cache_seqlens} must count the valid keys of each "
                         f"sequence, the Lq={Lq} new ones included, and fit the cache: from {Lq} to {capacity}")


def check_kvcache_values(cache_seqlens, block_table, *, Lq: int, capacity: int, page_size: int,
                         num_pages: int) -> None:
    """The values of cache_seqlens (each from Lq to the capacity) and of the block table's pages in use (each a page
    of the cache). This reads them on the host (a synchronization), so it is skipped while a CUDA graph is being
    captured, and done once per version of the tensors: torch's version counter, bumped by every in-place torch
    operation (a tensor written by something else, e.g. a custom kernel, is not checked again)."""
    name = "attention_with_kvcache"
    tensors = [t for t in (cache_seqlens, block_table) if isinstance(t, torch.Tensor)]
    extra = (cache_seqlens if isinstance(cache_seqlens, int) else None, Lq, capacity, page_size, num_pages)
    if not tensors or all(_unchanged(t, extra) for t in tensors):
        return
    if tensors[0].is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if isinstance(cache_seqlens, torch.Tensor):
        lens = cache_seqlens.tolist()
        bad = [(b, n) for b, n in enumerate(lens) if not Lq <= n <= capacity]
        if bad:
            b, n = bad[0]
            raise ValueError(f"{name}: cache_seqlens[{b}] = {n}: each must count the valid keys of its sequence, the "
                             f"Lq={Lq} new ones included, and fit the cache: from {Lq} to {capacity} "
                             f"({len(bad)} of {len(lens)} are not)")
    else:
        lens = [cache_seqlens] * block_table.shape[0]
    if block_table is not None:
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] \
            < torch.tensor([-(-n // page_size) for n in lens], device=block_table.device)[:, None]
        bad = (used & ((block_table < 0) | (block_table >= num_pages))).nonzero()
        if len(bad):
            b, p = bad[0].tolist()
            raise ValueError(f"{name}: block_table[{b}, {p}] = {int(block_table[b, p])} names no page of the cache "
                             f"(k_cache has {num_pages} pages, 0 to {num_pages - 1}); sequence {b} uses its first "
                             f"{-(-lens[b] // page_size)} entries")
    for t in tensors:
        _remember(t, extra)
