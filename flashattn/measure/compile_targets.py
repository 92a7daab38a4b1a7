"""Every kernel the course launches, compiled for every GPU target it supports, without a GPU (README: "Where it
runs"; ``tests/test_compile_targets.py`` runs it in ``make test``).

For each target of ``kernels.device.TARGETS`` (sm_75, sm_80, sm_86, sm_89, sm_90) it compiles each kernel with
the configurations the code would choose *on that target*: the tuning spaces after ``device`` pruned them to
the target's shared memory, and the teaching kernels' fixed tiles as chosen there. Each compile reports what
the driver checks before it launches a kernel: shared memory against the target's limit, registers against
the register file, and the local memory its spills take (``kernels.aot``).

The representative set, and why it is enough (about 290 compiles, a few minutes on two cores):

* float16 stands for both 16-bit types (same tile bytes); bfloat16 is compiled too at D = 128 on sm_90, and
  refused by name below sm_80;
* causal programs stand for both (they hold the unmasked and the masked loop);
* head dimensions 64, 128 and 256, the padded widths the course uses and the largest of each space, plus 32
  for the tuning spaces on sm_90; float32 at D = 64 for the CUDA-core path of notebooks 05 to 09;
* sm_89 has sm_86's limits, so its spaces prune to the same configurations: there it compiles the first
  configuration of each kernel (what runs when nothing is tuned), sm_86 all of them;
* sm_75 compiles slowly (its CUDA-core products unroll into long code): there the tuning spaces at D = 128 and
  256 (where its 64 KB prunes them) and the teaching kernels at D = 128 (their largest tiles).

    python -m flashattn.measure.compile_targets [--targets sm_75 sm_90] [--jobs 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import sys
import time

import torch

from flashattn import runtime
from flashattn.kernels import aot, backward, device, fast, fast_backward, fast_options, masked, naive, v1, v2
from flashattn.kernels.constants import LOG2_E
from flashattn.validate import TILE_KEYS

B, H, N = 1, 2, 256  # the example problem: only its dtypes, strides and alignments reach the compiler


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel with one configuration, as a launch on ``target`` would compile it."""

    kernel: str  # "fast forward", ...
    target: tuple[int, int]
    detail: str  # dtype, D, tiles
    build: object  # () -> (jit function, args, constexprs, launch options, estimated shared bytes or None)


def _qkv(D: int, dtype: torch.dtype, n: int = N):
    q, k, v = (torch.empty(B, H, n, D, dtype=dtype) for _ in range(3))
    return q, k, v, torch.empty_like(q), torch.empty(B, H, n, dtype=torch.float32)


def _fast_forward(where: device.Target, D: int, dtype: torch.dtype, config: dict, use_tma: bool):
    q, k, v, o, lse = _qkv(D, dtype)
    tiles = tuple(config[k] for k in TILE_KEYS)
    args = (q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, 1, N, N, 0.1 * LOG2_E.value)
    if use_tma:
        from flashattn.kernels import descriptors
        args = (descriptors.rows(q, tiles[0]), descriptors.rows(k, tiles[1]), descriptors.rows(v, tiles[1]), *args[3:])
    constexprs = dict(D=D, D_PAD=fast_options.padded_head_dim(D), BLOCK_M=tiles[0], BLOCK_N=tiles[1], CAUSAL=True,
                      MORE_QUERIES=False, USE_TMA=use_tma, PRECISION="ieee" if dtype == torch.float32 else "tf32",
                      STORE_LSE=True)
    options = dict(num_warps=tiles[2], num_stages=tiles[3], maxnreg=config.get("maxnreg"))
    return fast.attn_kernel_fast, args, constexprs, options, fast_options.forward_shared_bytes(tiles, D, dtype, where)


def _qkv_columns(D: int, dtype: torch.dtype):
    """As :func:`_qkv`, but q, k, v and o (B, H, N, D) views of (B, N, H, D) memory."""
    q, k, v, o, lse = _qkv(D, dtype)
    q, k, v, o = (torch.empty((B, N, H, D), dtype=t.dtype).transpose(1, 2) for t in (q, k, v, o))
    return q, k, v, o, lse


def _gluon_forward(where: device.Target, D: int, dtype: torch.dtype, config: dict, window: bool = False,
                   key_mask: int = 0, docs: bool = False):
    """fast's Gluon forward, causal; ``window``: with a sliding window, ``key_mask`` (1 or 2, fast_gluon's KEY_MASK):
    not causal, with a key-padding mask; ``docs``: causal in each of 9 packed documents (masked attention's paths on
    Hopper)."""
    from flashattn.kernels import descriptors, fast_gluon

    q, k, v, o, lse = _qkv_columns(D, dtype)  # a model's (B, N, H, D) layout, the kernel's other addressing
    kmask = torch.empty((B, N), dtype=torch.uint8)
    opts = fast_options.FastOptions(gluon=True, autotune=False, use_tma=True, **config)
    ws = opts.schedule != "single"
    ends = torch.empty((B,) if key_mask == 1 else (B, 1 + N // opts.block_n), dtype=torch.int32)
    args = (descriptors.gluon_heads(q, opts.block_m, True), descriptors.gluon_heads(k, opts.block_n, True),
            descriptors.gluon_heads(v, opts.block_n, True), o, lse, N, B * H, H, *o.stride()[:3], 0.1,
            255 if window else 0, *((kmask, ends, N, 1) if key_mask else (lse, lse, 0, 0)),
            *((torch.empty(10, dtype=torch.int32), torch.empty((N + 9, 2), dtype=torch.int32), 9) if docs
              else (lse, lse, 0)))
    constexprs = dict(D=D, BLOCK_M=opts.block_m, BLOCK_N=opts.block_n, STAGES=opts.num_stages, CAUSAL=not key_mask,
                      WINDOW=window, KEY_MASK=key_mask, DOCS=docs, STORE_LSE=True, OVERLAP=True, WARP_SPECIALIZE=ws,
                      PERSISTENT=opts.schedule == "persistent", CONSUMERS=opts.consumers if ws else 2,
                      HEADS_IN_COLUMNS=True)
    options = dict(num_warps=opts.num_warps, maxnreg=fast_options.WS_MAXNREG[opts.consumers] if ws else None)
    return fast_gluon.attn_kernel_gluon, args, constexprs, options, None


def _fast_backward(where: device.Target, kernel: str, D: int, dtype: torch.dtype, tiles: tuple, atomic: bool,
                   use_tma: bool):
    from flashattn.kernels import descriptors

    q, k, v, o, lse = _qkv(D, dtype)
    bm, bn, warps, stages = tiles
    dq_acc = torch.empty(q.shape, dtype=torch.float32) if atomic else None
    named = dict(Q=q, K=k, V=v, DO=o)
    if use_tma:
        named = {name: descriptors.rows(t, bm if name in ("Q", "DO") else bn) for name, t in named.items()}
    scalars = (N, N, H, H, 0.1 * LOG2_E.value, 0.1)
    common = dict(D=D, D_PAD=fast_options.padded_head_dim(D), BLOCK_M=bm, BLOCK_N=bn, GROUP=1, CAUSAL=True,
                  USE_TMA=use_tma, PRECISION="ieee" if dtype == torch.float32 else "tf32")
    if kernel == "dkdv":
        dq_desc = descriptors.rows(dq_acc, bm) if use_tma and atomic else None
        args = (named["Q"], named["K"], named["V"], named["DO"], torch.empty_like(k), torch.empty_like(v), lse, lse,
                dq_acc, dq_desc, *scalars)
        fn, constexprs = fast_backward.bwd_dkdv_fast, dict(common, DQ_ATOMIC=atomic)
    else:
        args = (named["Q"], named["K"], named["V"], named["DO"], torch.empty_like(q), lse, lse, *scalars)
        fn, constexprs = fast_backward.bwd_dq_fast, common
    estimate = fast_options.backward_shared_bytes(kernel, tiles, D, dtype, where, atomic=atomic)
    return fn, args, constexprs, dict(num_warps=warps, num_stages=stages), estimate


def _gluon_backward(D: int, dtype: torch.dtype, docs: bool = False):
    """The fast backward's Gluon kernel, causal; ``docs``: in each of 9 packed documents (masked attention's)."""
    from flashattn.kernels import descriptors
    from flashattn.kernels import fast_backward_gluon as fbg

    q, k, v, o, lse = _qkv(D, dtype)
    bm, bn = fbg.BLOCK_M.value, fbg.BLOCK_N.value
    dq_acc = torch.empty(q.shape, dtype=torch.float32)
    dk = torch.empty_like(k)
    args = (descriptors.gluon_rows(q, bm), descriptors.gluon_rows(k, bn), descriptors.gluon_rows(v, bn),
            descriptors.gluon_rows(o, bm), descriptors.gluon_vector(lse, bm), descriptors.gluon_vector(lse, bm),
            descriptors.gluon_rows(dq_acc, bm), dk, torch.empty_like(v), N, H, *dk.stride()[:3], 0.1, 0.1,
            *((torch.empty(10, dtype=torch.int32), torch.empty((N // bn + 9, 2), dtype=torch.int32)) if docs
              else (dk, dk)), lse, lse)
    return (fbg.bwd_kernel_gluon, args, dict(D=D, CAUSAL=True, DOCS=docs, STAGES=fbg.STAGES[D],
                                             HEADS_IN_COLUMNS=False), dict(num_warps=4, maxnreg=fbg.MAXNREG), None)


def _v2(where: device.Target, variant: str, D: int, dtype: torch.dtype):
    q, k, v, o, lse = _qkv(D, dtype)
    opts = (v2.padded_default_options if variant == "v2_padded" else v2.default_options)(dtype, D, "gpu")
    d_pad = max(16, v2.compute_padded_headdim(D)) if variant == "v2_padded" else D
    k_transposed = variant in ("v2_kt", "v2_kt_view")
    args = (q, k, v, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, N, 0.1)
    constexprs = dict(LSE=lse, D=D, D_PAD=d_pad, BLOCK_M=opts["block_m"], BLOCK_N=opts["block_n"], CAUSAL=True,
                      PRECISION="ieee", K_TRANSPOSED=k_transposed, DEFERRED_NORM=True, USE_EXP2=False, STORE_LSE=True)
    tiles = tuple(opts[k] for k in TILE_KEYS)
    return (v2.attn_kernel_v2, args, constexprs, dict(num_warps=opts["num_warps"], num_stages=opts["num_stages"]),
            fast_options.forward_shared_bytes(tiles, d_pad, dtype, where))


def _v1(where: device.Target, D: int, dtype: torch.dtype):
    q, k, v, o, lse = _qkv(D, dtype)
    opts = v1.default_options(dtype, D, "gpu")
    m = torch.empty(B * H, N)
    args = (q, k, v, o, m, m, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, N, 0.1)
    constexprs = dict(D=D, BLOCK_M=opts["block_m"], BLOCK_N=opts["block_n"], CAUSAL=True, PRECISION="ieee",
                      UPDATE=v1.v1_update)
    tiles = tuple(opts[k] for k in TILE_KEYS)
    return (v1.attn_kernel_v1, args, constexprs, dict(num_warps=opts["num_warps"], num_stages=opts["num_stages"]),
            v1._shared_bytes(tiles, D, dtype))


def _naive(which: str, D: int, dtype: torch.dtype):
    q, k, v, o, _ = _qkv(D, dtype)
    opts = naive.default_options(dtype, D, "gpu")
    bm, bn = opts["block_m"], opts["block_n"]
    S, P = torch.empty(B, H, N, N), torch.empty(B, H, N, N, dtype=dtype)
    launch = dict(num_warps=opts["num_warps"], num_stages=opts["num_stages"])
    if which == "scores":
        return (naive.scores_kernel, (q, k, S, *q.stride(), *k.stride(), H, N, 0.1),
                dict(D=D, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=True, PRECISION="ieee"), launch, None)
    if which == "softmax":
        return naive.softmax_kernel, (S, P, N), dict(BLOCK_M=bm, BLOCK_N=bn), launch, None
    return (naive.pv_kernel, (P, v, o, *v.stride(), *o.stride(), H, N),
            dict(D=D, BLOCK_M=bm, BLOCK_N=bn, PRECISION="ieee"), launch, None)


def _teaching_backward(where: device.Target, kernel: str, D: int, dtype: torch.dtype):
    q, k, v, o, lse = _qkv(D, dtype)
    opts = backward.default_options(dtype, D, "gpu")
    tiles = tuple(opts[key] for key in TILE_KEYS)
    constexprs = dict(D=D, BLOCK_M=tiles[0], BLOCK_N=tiles[1], CAUSAL=True, PRECISION="ieee")
    launch = dict(num_warps=tiles[2], num_stages=tiles[3])
    if kernel == "dkdv":
        args = (q, k, v, o, lse, lse, torch.empty_like(k), torch.empty_like(v), N, 0.1)
        fn = backward.bwd_dkdv_kernel
    else:
        args = (q, k, v, o, lse, lse, torch.empty_like(q), N, 0.1)
        fn = backward.bwd_dq_kernel
    estimate = fast_options.backward_shared_bytes(kernel, tiles, D, dtype, where, teaching=True)
    return fn, args, constexprs, launch, estimate


def _captured_launches(where: device.Target, D: int, dtype: torch.dtype) -> dict:
    """The kernels of masks (notebook 14) and decoding (notebook 15), as their host code launches them with the tiles
    it picks on ``where`` (the launches recorded by ``launch_cache.capturing`` instead of run)."""
    from flashattn import masking
    from flashattn.kernels import decode, launch_cache, mask_blocks, masked, masked_backward

    dev = runtime.DEVICE  # the host code checks its inputs as a launch would (CUDA tensors in GPU mode)
    q, k, v, do = (torch.zeros(1, 2, N, D, dtype=dtype, device=dev) for _ in range(4))
    o, lse = torch.empty_like(q), torch.zeros(1, 2, N, device=dev)
    cu = mask_blocks.cu_seqlens([100, N - 100], dev)
    packed = [t[0].transpose(0, 1) for t in (q, k, v, do, o)]
    mask = torch.ones(N, N, dtype=torch.bool, device=dev).tril()
    masks = {"window": dict(window=(63, 0)), "attn_mask": dict(attn_mask=mask.expand(1, 2, N, N)),
             "documents": dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=N - 100, max_seqlen_k=N - 100)}
    found = {}
    with launch_cache.capturing() as launches:
        for name, kw in masks.items():
            args, out, grad = ((packed[:3], (packed[4], lse[0]), packed[3]) if name == "documents"
                               else ((q, k, v), (o, lse), do))
            fwd, dkdv, dq = masking.default_tiles(dtype, D, torch.bool if name == "attn_mask" else None, mode="gpu")
            masking.masked_forward(*args, causal=True, tiles=fwd, **kw)
            masking.masked_backward(*args, *out, grad, causal=True, dkdv_tiles=dkdv, dq_tiles=dq, **kw)
        tiles = decode.tile_configs(D, dtype, where.shared_bytes, mode="gpu")[0]
        cache = torch.zeros(2, N, 2, D, dtype=dtype, device=dev)
        for merge in ("kernel", "last program"):  # the merge kernel, and the split kernel that merges itself
            decode.decode_attention(torch.zeros(2, 1, 8, D, dtype=dtype, device=dev), cache, cache, N, num_splits=4,
                                    tiles=tiles, merge=merge)
        _table_row_launch(D, dtype, tiles, dev)
    kernels = {*masked.JIT_KERNELS, *masked_backward.JIT_KERNELS, decode.decode_split_kernel,
               decode.decode_merge_kernel}
    for kernel, _, args, constexprs, options in launches:
        if kernel in kernels:
            name = kernel.fn.__name__ + (" (merges its splits)" if constexprs.get("MERGE") else "") + (
                " (table row)" if constexprs.get("TABLE_ROW") else "")
            found.setdefault(name, (kernel, args, constexprs, options))
    return found


def _table_row_launch(D: int, dtype: torch.dtype, tiles: tuple, dev) -> None:
    """A paged decoding launch with the split kernel's TABLE_ROW (``decode_plan.TABLE_ROW_MAX_PAGES`` set to this
    launch's row for it alone, its plan and prepared problem not kept)."""
    from flashattn.kernels import decode

    page = 2 * tiles[0]  # pages of two key blocks
    pages = torch.zeros(2 * N // page, page, 2, D, dtype=dtype, device=dev)
    table = torch.arange(2 * N // page, dtype=torch.int32, device=dev).view(2, -1)
    with decode.table_rows(N // page):
        decode.decode_attention(torch.zeros(2, 1, 8, D, dtype=dtype, device=dev), pages, pages, N, block_table=table,
                                num_splits=4, tiles=tiles)


def _captured_case(where: device.Target, D: int, dtype: torch.dtype, name: str):
    kernel, args, constexprs, options = _captured_launches(where, D, dtype)[name]
    return kernel, args, constexprs, dict(options), None


def cases(where: device.Target) -> list[Case]:
    """The representative set for one target (see the module docstring)."""
    every = _cases(where)
    if where.capability == (8, 9):  # sm_86's limits: the first configuration of each kernel
        seen, first = set(), []
        for case in every:
            key = (case.kernel, case.detail.split(" (")[0])
            if key not in seen:
                seen.add(key)
                first.append(case)
        return first
    return every


def _cases(where: device.Target) -> list[Case]:
    t = where.capability
    out = []
    dtypes = [torch.float16] + ([torch.bfloat16] if t == (9, 0) else [])
    spaces_d = {(7, 5): (128, 256), (9, 0): (32, 64, 128, 256)}.get(t, (64, 128, 256))
    teaching_d = (128,) if t == (7, 5) else (64, 128)
    with device.pretend(where):
        for dtype in dtypes:
            for D in spaces_d if dtype == torch.float16 else (128,):
                for config in fast_options.tuning_configs(D, dtype, where=where):
                    tiles = tuple(config[k] for k in TILE_KEYS)
                    out.append(Case("fast forward (Triton)", t, f"{dtype} D={D} {tiles}",
                                    _bind(_fast_forward, where, D, dtype, config, where.hopper and D >= 16)))
                for atomic in (False, True):
                    for kernel in ("dkdv",) if atomic else ("dkdv", "dq"):
                        for tiles in fast_options.tuning_space(kernel, D, dtype, atomic, where):
                            name = f"fast backward {kernel}{' (atomic dQ)' if atomic else ''}"
                            build = _bind(_fast_backward, where, kernel, D, dtype, tiles, atomic, where.hopper)
                            out.append(Case(name, t, f"{dtype} D={D} {tiles}", build))
            if where.hopper:
                for D in fast_options.GLUON_SPACE if dtype == torch.float16 else (128,):
                    for config in fast_options.tuning_configs(D, dtype, gluon=True):
                        out.append(Case("fast forward (Gluon)", t, f"{dtype} D={D} {config['schedule']} "
                                        f"{tuple(config[k] for k in TILE_KEYS)}",
                                        _bind(_gluon_forward, where, D, dtype, config)))
                    out.append(Case("fast backward (Gluon)", t, f"{dtype} D={D}", _bind(_gluon_backward, D, dtype)))
                    out.append(Case("masked documents backward (Gluon)", t, f"{dtype} D={D}",
                                    _bind(_gluon_backward, D, dtype, True)))
                    config = dict(masked.GLUON_WINDOW[D], maxnreg=None)  # a sliding window's Gluon kernel
                    out.append(Case("masked window forward (Gluon)", t, f"{dtype} D={D} {config['schedule']} "
                                    f"{tuple(config[k] for k in TILE_KEYS)}",
                                    _bind(_gluon_forward, where, D, dtype, config, True)))
                    config = dict(masked.GLUON_KEY_MASK[D], maxnreg=None)  # a key-padding mask's Gluon kernel
                    for mode in (1, 2):  # every block's mask bytes, or the partial blocks' only
                        out.append(Case(f"masked key-padding forward (Gluon, KEY_MASK {mode})", t,
                                        f"{dtype} D={D} {config['schedule']} {tuple(config[k] for k in TILE_KEYS)}",
                                        _bind(_gluon_forward, where, D, dtype, config, False, mode)))
                    config = dict(masked.GLUON_DOCUMENTS[D], maxnreg=None)  # packed documents' Gluon kernel
                    out.append(Case("masked documents forward (Gluon)", t, f"{dtype} D={D} {config['schedule']} "
                                    f"{tuple(config[k] for k in TILE_KEYS)}",
                                    _bind(_gluon_forward, where, D, dtype, config, False, 0, True)))
        for dtype in (torch.float16, torch.float32):
            for D in teaching_d:
                for variant in ("v2", "v2_kt", "v2_padded"):
                    out.append(Case(f"{variant} (defaults)", t, f"{dtype} D={D}", _bind(_v2, where, variant, D, dtype)))
                out.append(Case("v1 (defaults)", t, f"{dtype} D={D}", _bind(_v1, where, D, dtype)))
                for kernel in ("dkdv", "dq"):
                    out.append(Case(f"teaching backward {kernel} (defaults)", t, f"{dtype} D={D}",
                                    _bind(_teaching_backward, where, kernel, D, dtype)))
            for which in ("scores", "softmax", "pv"):
                out.append(Case(f"naive {which} (defaults)", t, f"{dtype} D=64", _bind(_naive, which, 64, dtype)))
        for D in teaching_d:  # the kernels of notebooks 14 and 15 at the tiles they choose here
            for name in _captured_launches(where, D, torch.float16):
                out.append(Case(f"{name} (defaults)", t, f"torch.float16 D={D}",
                                _bind(_captured_case, where, D, torch.float16, name)))
        for config in fast_options.tuning_configs(64, torch.float32, where=where):
            tiles = tuple(config[k] for k in TILE_KEYS)
            out.append(Case("fast forward (Triton)", t, f"torch.float32 D=64 {tiles}",
                            _bind(_fast_forward, where, 64, torch.float32, config, False)))
    return out


def _bind(fn, *args):
    return lambda: fn(*args)


@dataclasses.dataclass(frozen=True)
class Result:
    kernel: str
    target: tuple[int, int]
    detail: str
    compiled: aot.Compiled
    estimate: int | None  # the shared memory the tiles were chosen by (None: a fixed Hopper kernel)
    seconds: float


def run_case(case: Case) -> Result:
    where = device.TARGETS[case.target]
    t0 = time.perf_counter()
    with device.pretend(where):
        fn, args, constexprs, options, estimate = case.build()
    options = {k: v for k, v in options.items() if v is not None}
    compiled = aot.compile_for(fn, args, constexprs, where, num_warps=options.pop("num_warps", 4),
                               num_stages=options.pop("num_stages", 3), maxnreg=options.pop("maxnreg", None),
                               name=case.kernel)
    return Result(case.kernel, case.target, case.detail, compiled, estimate, time.perf_counter() - t0)


def _run_indices(args: tuple) -> list[Result]:
    """A worker's share: the cases of ``targets`` at ``indices`` (cases are rebuilt in the worker: they hold
    closures)."""
    targets, indices = args
    every = [c for t in targets for c in cases(device.TARGETS[t])]
    return [run_case(every[i]) for i in indices]


def run(targets=None, jobs: int = 1) -> list[Result]:
    """Compile every case for ``targets`` (capabilities; default: all), in ``jobs`` processes."""
    targets = [tuple(t) for t in (targets or device.TARGETS)]
    every = [c for t in targets for c in cases(device.TARGETS[t])]
    if jobs <= 1:
        return [run_case(c) for c in every]
    # slow compiles (sm_75's CUDA-core code) spread over the workers: deal the cases out in turn
    shares = [(targets, list(range(i, len(every), jobs))) for i in range(jobs)]
    ctx = __import__("multiprocessing").get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        done = [r for part in pool.map(_run_indices, shares) for r in part]
    order = {(r.kernel, r.target, r.detail): r for r in done}
    return [order[(c.kernel, c.target, c.detail)] for c in every]


def table(results: list[Result]) -> str:
    """A Markdown table: kernel × target, with shared memory, registers, spills and the verdict."""
    lines = ["| kernel | configuration | target | shared memory (B) | limit (B) | registers | spills (B) | verdict |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        c = r.compiled
        shown = ["-" if x is None else x for x in (c.shared_bytes, c.registers, c.spill_bytes)]
        lines.append(f"| {r.kernel} | {r.detail} | {c.target} | {shown[0]} | {c.limit_shared} | {shown[1]} | "
                     f"{shown[2]} | {c.verdict()} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="*", help="e.g. sm_75 sm_90 (default: every target)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    targets = [(int(t[3]), int(t[4])) for t in args.targets] if args.targets else None
    results = run(targets, args.jobs)
    print(table(results))
    bad = [r for r in results if not r.compiled.fits]
    print(f"\n{len(results)} compiles, {len(bad)} that would not launch", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
