"""Decoding over a key/value cache (notebook 15): ``attention_with_kvcache`` against SDPA, ``fast`` without splits
and FlexAttention, as a share of the copy bandwidth; the number of splits; tokens per second of generation.

* ``decode_vs_sdpa``: one new query per sequence (Lq = 1) against a full cache, D = 128, Hq = 32 with Hkv = 8 and
  32, B ∈ {1, 4, 16, 64}, contexts 1k–128k, fp16 and bf16. Each cell times, on the same inputs and in interleaved
  rounds: ``attention_with_kvcache`` on the contiguous cache (num_splits chosen by the rule) and on the same cache
  in shuffled pages, SDPA on the contiguous cache (q and the cache as (B, H, ·, D) views), ``fast`` (one program
  per (batch, query head): no splits) and, where torch has it, FlexAttention (compiled; its decoding kernel), on
  some cells; where the rule splits, also ``attention_with_kvcache``'s splits merged by a second launch
  (``flashattn_merge_kernel``: ``merge="kernel"``) beside the default, where the last split program merges. GB/s
  counts the cache's bytes (K and V, read once) over the median time; the share is of the copy bandwidth measured
  at the start of the run (bytes read + written per second by a device-to-device copy). Every
  kernel is timed twice in the same rounds: called (``ms``: do_bench of the Python call, so a call whose host work
  outlasts the GPU's shows the host's time) and replayed from a CUDA graph (``graph``: the GPU's time alone, as an
  inference server runs its decoding step). Also the time against num_splits at a few shapes (the curve the rule
  is set from), both ways.
* ``decode_generation``: the small GPT of notebook 13, larger (Llama-like heads), generating greedily with a KV
  cache through ``attention_with_kvcache`` and through the same loop on SDPA: ms per step and tokens per second
  at a long context, and the tokens of both loops and of generation without a cache compared (float32).

The functions below run at any size with any timer, so that the host logic is tested in interpreter mode; the
registered measurements call them at full size on the GPU.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

from flashattn import bench, runtime
from flashattn.kernels import VARIANTS, decode_plan
from flashattn.kernels.decode import attention_with_kvcache, decode_attention, make_plan
from flashattn.measure.hardware import copy_bandwidth_gbps
from flashattn.models.gpt import GPTConfig, sdpa_with_kvcache
from flashattn.record import measurement
from flashattn.reference import reference_with_kvcache, rel_error

GRID = dict(batches=(1, 4, 16, 64), contexts=(1024, 4096, 16384, 32768, 131072), heads=((32, 8), (32, 32)), D=128,
            dtypes=("float16", "bfloat16"))
MAX_CACHE_BYTES = 40e9  # K and V of one cell; the paged copy doubles it (B = 64, 128k, Hkv = 32 would be 137 GB)
PAGE_SIZE = 256  # keys per page of the paged copy (FlashAttention's paged cache takes multiples of 256)
ROUNDS = 3
WARMUP_MS, REP_MS = 5, 40  # per do_bench call: short, because the grid has ~80 cells of 4-5 kernels
FAST_OPTIONS = dict(gluon=False, use_tma=False, block_m=16, block_n=64, num_warps=4, num_stages=3)
FLEX_CELLS = dict(batches=(1, 16), contexts=(4096, 32768, 131072), dtypes=("float16",))  # it compiles per shape
FLEX_BUDGET_S = 60  # no FlexAttention on new cells after this many seconds spent on it (it compiles per shape)
# do_bench's own L2 flush writes zeros that stay in the L2 as dirty lines; the timed call's misses write them back to
# DRAM, ~10 µs of another's bytes in a decoding step of 10-50 µs (tools/gpu/decode/flush.py, 2026-12-04: B = 1 with
# 32/8 heads at 32k keys, 75 % of the copy bandwidth after a read, 63-64 % after the zeros, for SDPA as for ours).
# Every timing here empties the L2 by reading instead (bench.l2_flush); flush_effect times a few cells both ways.
FLUSH = "read"
FLUSH_CELLS = ((1, 8, 1024), (1, 8, 4096), (1, 8, 32768), (1, 8, 131072), (4, 32, 4096), (16, 8, 1024),
               (16, 32, 32768))  # (B, Hkv, S), Hq = 32, fp16
SPLIT_CURVE = dict(shapes=((1, 8, 4096), (1, 8, 16384), (1, 8, 32768), (1, 8, 131072), (4, 8, 32768), (1, 32, 32768)),
                   dtype="float16",
                   splits=(1, 2, 4, 8, 9, 12, 16, 24, 32, 48, 64, 96, 128))  # 9: one past a wave of 8 splits


def cache_bytes(B: int, S: int, Hkv: int, D: int, dtype_bytes: int) -> int:
    """The bytes of K and V of B sequences of S keys: what one decoding step must read at least."""
    return 2 * B * S * Hkv * D * dtype_bytes


def _size(dtype: str) -> int:
    return torch.finfo(getattr(torch, dtype)).bits // 8


def cells(grid: dict = GRID, max_bytes: float = MAX_CACHE_BYTES) -> tuple[list[dict], list[dict]]:
    """The grid's cells, and those left out because their cache exceeds ``max_bytes`` (with the reason)."""
    kept, skipped = [], []
    for dtype in grid["dtypes"]:
        for Hq, Hkv in grid["heads"]:
            for B in grid["batches"]:
                for S in grid["contexts"]:
                    cell = dict(dtype=dtype, B=B, S=S, Hq=Hq, Hkv=Hkv, D=grid["D"], Lq=1,
                                cache_bytes=cache_bytes(B, S, Hkv, grid["D"], _size(dtype)))
                    if cell["cache_bytes"] > max_bytes:
                        skipped.append({**cell, "reason": f"cache {cell['cache_bytes'] / 1e9:.0f} GB > "
                                                          f"{max_bytes / 1e9:.0f} GB (twice that with the paged copy)"})
                    else:
                        kept.append(cell)
    return kept, skipped


def make_problem(cell: dict, device, seed: int = 0, page_size: int = PAGE_SIZE) -> dict:
    """Random q (B, 1, Hq, D) and a full cache (B, S, Hkv, D), the same cache in shuffled pages of ``page_size`` keys
    (a divisor of S) and its block table, and cache_seqlens = S for every sequence."""
    dtype = getattr(torch, cell["dtype"])
    B, S, Hq, Hkv, D = cell["B"], cell["S"], cell["Hq"], cell["Hkv"], cell["D"]
    if S % page_size:
        raise ValueError(f"make_problem: page_size={page_size} must divide the context S={S}")
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, cell["Lq"], Hq, D, generator=gen, device=device, dtype=dtype)
    k, v = (torch.randn(B, S, Hkv, D, generator=gen, device=device, dtype=dtype) for _ in range(2))
    pages = B * S // page_size
    order = torch.randperm(pages, generator=gen, device=device)
    kp = torch.empty((pages, page_size, Hkv, D), device=device, dtype=dtype)
    vp = torch.empty_like(kp)
    kp[order], vp[order] = k.view(pages, page_size, Hkv, D), v.view(pages, page_size, Hkv, D)  # page i at order[i]
    return dict(q=q, k=k, v=v, kp=kp, vp=vp, table=order.view(B, S // page_size).int(),
                seqlens=torch.full((B,), S, dtype=torch.int32, device=device))


def _flex():
    """FlexAttention compiled, or None where torch has none."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return None
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(flex_attention)


def kernels(p: dict, flex=None) -> dict:
    """Name -> a function of no arguments, each computing the same (B, 1, Hq, D) output."""
    q, k, v = p["q"], p["k"], p["v"]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, ·, D) views: no copy
    gqa = q.shape[2] != k.shape[2]
    fns = {
        "flashattn": lambda: attention_with_kvcache(q, k, v, p["seqlens"]),
        "flashattn_paged": lambda: attention_with_kvcache(q, p["kp"], p["vp"], p["seqlens"], block_table=p["table"]),
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa).transpose(1, 2),
        "fast": lambda: VARIANTS["fast"](qt, kt, vt, **FAST_OPTIONS).transpose(1, 2),
    }
    (B, _, Hq, D), (S, Hkv) = q.shape, k.shape[1:3]
    if make_plan(B, 1, Hq, Hkv, D, S, q.dtype, 0, q.device).num_splits > 1:  # the split merged by a second launch
        fns["flashattn_merge_kernel"] = lambda: decode_attention(q, k, v, p["seqlens"], merge="kernel")
    if flex is not None:
        fns["flex"] = lambda: flex(qt, kt, vt, enable_gqa=gqa).transpose(1, 2)
    return fns


def time_interleaved(fns: dict, rounds: int, timer) -> dict[str, list[float]]:
    """Each function timed by ``timer(fn)`` (ms) once per round, the rounds in alternating order (a, b, c, c, b, a,
    ...: a steady drift of the clock costs each the same)."""
    times, order = {name: [] for name in fns}, list(fns)
    for _ in range(rounds):
        for name in order:
            times[name].append(timer(fns[name]))
        order.reverse()
    return times


def gpu_timer(fn, flush: str = FLUSH) -> float:
    return bench.time_ms(fn, warmup=WARMUP_MS, rep=REP_MS, flush=flush)


def cuda_graph_replay(fn):
    """``fn`` captured in a CUDA graph: returns its replay, a function of no arguments that runs the captured kernels
    without any of the host's Python, as an inference server replays its decoding step. ``fn`` has run before (its
    kernels are compiled); it runs once more on a side stream before the capture, as ``torch.cuda.graphs`` advises."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def wall_timer(fn) -> float:
    """For the interpreter (tests, stand-ins): one call's wall-clock time, meaning nothing about a GPU."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _timings(cell: dict, rounds_by_name: dict, copy_gbps: float) -> dict:
    """ms (median), GB/s, share of the copy bandwidth and ratio to SDPA of each name's rounds."""
    out = {"ms": {}, "gbps": {}, "share": {}, "vs_sdpa": {}, "ms_rounds": rounds_by_name}
    for name, times in rounds_by_name.items():
        ms = out["ms"][name] = statistics.median(times)
        out["gbps"][name] = cell["cache_bytes"] / (ms * 1e-3) / 1e9
        out["share"][name] = out["gbps"][name] / copy_gbps
    for name, ms in out["ms"].items():
        if "sdpa" in out["ms"] and name != "sdpa":
            out["vs_sdpa"][name] = out["ms"]["sdpa"] / ms
    return out


def measure_cell(cell: dict, p: dict, *, copy_gbps: float, timer, rounds: int, flex=None, names=None,
                 capture=None) -> dict:
    """One row of ``decode_vs_sdpa``: times, GB/s, share of the copy bandwidth, ratio to SDPA, and each output's
    relative error against the float64 reference on the first sequence's first group of query heads. ``names``:
    only those of :func:`kernels` (None: all).

    With ``capture`` (:func:`cuda_graph_replay` on the GPU: a function that turns a call into a replay of it), every
    kernel is also timed as a replay, in the same interleaved rounds as the calls themselves: ``row["graph"]`` has
    the same keys (``ms``, ``gbps``, ``share``, ``vs_sdpa``, ``ms_rounds``, ``errors``) for the replays. A call's
    time includes whatever of the host's time the GPU waits for; a replay's is the GPU's alone."""
    fns = {name: fn for name, fn in kernels(p, flex).items() if names is None or name in names}
    row = {**cell, "ms": {}, "gbps": {}, "share": {}, "vs_sdpa": {}, "rel_error": {}, "errors": {}}
    group = cell["Hq"] // cell["Hkv"]
    sl = (slice(0, 1), slice(None), slice(0, group))
    ref = reference_with_kvcache(p["q"][sl], p["k"][:1, :, :1], p["v"][:1, :, :1], cell["S"]).double()
    for name in list(fns):
        try:
            row["rel_error"][name] = rel_error(fns[name]()[sl], ref)  # compiles (and tunes) outside the timing
        except Exception as err:  # noqa: BLE001 - a kernel that cannot run this cell is a result too
            row["errors"][name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            del fns[name]
    replays, graph_errors = {}, {}
    if capture is not None:
        for name, fn in fns.items():
            try:
                replays[name] = capture(fn)
            except Exception as err:  # noqa: BLE001 - a call that cannot be captured is a result too
                graph_errors[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    timed = time_interleaved({**fns, **{(name, "graph"): replay for name, replay in replays.items()}}, rounds, timer)
    row.update(_timings(cell, {name: timed[name] for name in fns}, copy_gbps))
    if capture is not None:
        row["graph"] = {**_timings(cell, {name: timed[(name, "graph")] for name in replays}, copy_gbps),
                        "errors": graph_errors}
    dtype = getattr(torch, cell["dtype"])
    plan = make_plan(cell["B"], 1, cell["Hq"], cell["Hkv"], cell["D"], cell["S"], dtype, 0, p["q"].device)
    row["num_splits"], row["tiles"] = plan.num_splits, [plan.block_n, plan.num_warps, plan.num_stages]
    return row


def split_curve(shapes, dtype: str, splits, *, device, copy_gbps: float, timer, rounds: int, D: int = 128,
                page_size: int = PAGE_SIZE, capture=None) -> list:
    """Time against num_splits (contiguous cache, Lq = 1, Hq = 32) at ``shapes`` (B, Hkv, S): one row per shape
    with ``splits`` (those given and the rule's choice, ``rule``) and, in the same order, ``ms``, ``gbps`` and
    ``share``; with ``capture`` (as :func:`measure_cell`), also ``graph_ms``, ``graph_gbps`` and ``graph_share``
    for the replays, timed in the same interleaved rounds."""
    rows = []
    for B, Hkv, S in shapes:
        cell = dict(dtype=dtype, B=B, S=S, Hq=32, Hkv=Hkv, D=D, Lq=1,
                    cache_bytes=cache_bytes(B, S, Hkv, D, _size(dtype)))
        p = make_problem(cell, device, page_size=page_size)
        rule = make_plan(B, 1, 32, Hkv, D, S, getattr(torch, dtype), 0, p["q"].device).num_splits
        timed = sorted({*splits, rule})
        fns = {n: functools.partial(decode_attention, p["q"], p["k"], p["v"], p["seqlens"], num_splits=n)
               for n in timed}
        for fn in fns.values():
            fn()
        replays = {(n, "graph"): capture(fn) for n, fn in fns.items()} if capture is not None else {}
        times = time_interleaved({**fns, **replays}, rounds, timer)
        row = {**cell, "splits": timed, "rule": rule}
        for prefix, keys in (("", timed), ("graph_", [(n, "graph") for n in timed] if replays else [])):
            if keys:
                ms = row[prefix + "ms"] = [statistics.median(times[key]) for key in keys]
                gbps = row[prefix + "gbps"] = [cell["cache_bytes"] / (m * 1e-3) / 1e9 for m in ms]
                row[prefix + "share"] = [g / copy_gbps for g in gbps]
        rows.append(row)
        del p, replays
    return rows


def flush_effect(shapes, dtype: str, *, device, copy_gbps: float, timers: dict, rounds: int, D: int = 128,
                 page_size: int = PAGE_SIZE, capture=None) -> list:
    """What the L2 flush before each timed call does to the time: at ``shapes`` (B, Hkv, S) with Hq = 32, Lq = 1 and a
    full contiguous cache, attention_with_kvcache and SDPA (replayed from CUDA graphs with ``capture``, as
    :func:`measure_cell`; else called) timed by each of ``timers`` (a flush's name -> its timer) in the same
    interleaved rounds. One row per shape: ``ms`` and ``share`` of the copy bandwidth, by flush, then by kernel."""
    rows = []
    for B, Hkv, S in shapes:
        cell = dict(dtype=dtype, B=B, S=S, Hq=32, Hkv=Hkv, D=D, Lq=1,
                    cache_bytes=cache_bytes(B, S, Hkv, D, _size(dtype)))
        p = make_problem(cell, device, page_size=page_size)
        fns = {name: fn for name, fn in kernels(p).items() if name in ("flashattn", "sdpa")}
        for fn in fns.values():
            fn()
        if capture is not None:
            fns = {name: capture(fn) for name, fn in fns.items()}
        timed = time_interleaved({(flush, name): functools.partial(timer, fn) for flush, timer in timers.items()
                                  for name, fn in fns.items()}, rounds, lambda call: call())
        row = {**cell, "replayed": capture is not None, "ms": {}, "share": {}}
        for (flush, name), times in timed.items():
            ms = row["ms"].setdefault(flush, {})[name] = statistics.median(times)
            row["share"].setdefault(flush, {})[name] = cell["cache_bytes"] / (ms * 1e-3) / 1e9 / copy_gbps
        rows.append(row)
        del p, fns
    return rows


def decode_table(grid: dict = GRID, *, device=None, timer=gpu_timer, rounds: int = ROUNDS,
                 max_bytes: float = MAX_CACHE_BYTES, copy_gbps: float | None = None, page_size: int = PAGE_SIZE,
                 progress=None, capture=None) -> dict:
    """``decode_vs_sdpa``'s table for ``grid`` (see the module docstring), without FlexAttention (:func:`flex_pass`
    adds it to the rows afterwards); ``capture``: as :func:`measure_cell`."""
    device = runtime.DEVICE if device is None else device
    copy_gbps = copy_bandwidth_gbps() if copy_gbps is None else copy_gbps
    kept, skipped = cells(grid, max_bytes)
    rows = []
    for cell in kept:
        p = make_problem(cell, device, page_size=page_size)
        row = measure_cell(cell, p, copy_gbps=copy_gbps, timer=timer, rounds=rounds, capture=capture)
        rows.append(row)
        if progress:
            progress(format_row(row))
        del p
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"rows": rows, "skipped": skipped, "copy_bandwidth_gbps": copy_gbps, "grid": {k: list(v) if isinstance(
        v, tuple) else v for k, v in grid.items()}, "page_size": page_size, "rounds": rounds,
        "fast_options": FAST_OPTIONS, "flex_cells": {k: list(v) for k, v in FLEX_CELLS.items()}}


def flex_pass(rows: list, *, device=None, timer=gpu_timer, rounds: int = ROUNDS, page_size: int = PAGE_SIZE,
              copy_gbps: float, flex_fn=None, progress=None, capture=None) -> int:
    """FlexAttention on the rows of FLEX_CELLS, timed after everything else, in interleaved rounds beside SDPA
    (timed again here: ``vs_sdpa['flex']`` is against SDPA's time in this pass, ``sdpa_beside_flex_ms``). It comes
    last because in the recording of 2026-12-03 07:43, where it was timed cell by cell with the others, the short
    calls of attention_with_kvcache and fast after its first compile took up to three times their earlier
    recording's time and SDPA's (C++) did not change; the compiled FlexAttention in the process is the likeliest
    cause, not measured apart. With ``capture`` (as :func:`measure_cell`) both are also timed as replays, into the
    row's ``graph``. Returns the number of rows timed."""
    device = runtime.DEVICE if device is None else device
    flex_fn = _flex() if flex_fn is None else flex_fn
    if flex_fn is None:
        return 0
    spent, done = 0.0, 0
    for row in rows:
        if not (row["B"] in FLEX_CELLS["batches"] and row["S"] in FLEX_CELLS["contexts"]
                and row["dtype"] in FLEX_CELLS["dtypes"]) or spent >= FLEX_BUDGET_S:
            continue
        t0 = time.perf_counter()
        cell = {key: row[key] for key in ("dtype", "B", "S", "Hq", "Hkv", "D", "Lq", "cache_bytes")}
        p = make_problem(cell, device, page_size=page_size)
        beside = measure_cell(cell, p, copy_gbps=copy_gbps, timer=timer, rounds=rounds, flex=flex_fn,
                              names=("sdpa", "flex"), capture=capture)
        if _take_flex(row, beside, ("rel_error",)):
            if capture is not None:
                _take_flex(row["graph"], beside["graph"])
            done += 1
            if progress:
                progress(format_row(row))
        del p
        spent += time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return done


def _take_flex(mine: dict, beside: dict, extra: tuple = ()) -> bool:
    """FlexAttention's timings (and ``extra`` keys) from ``beside`` into ``mine``, with SDPA's time in the same pass
    as ``sdpa_beside_flex_ms``; or its error. True if it ran."""
    if "flex" in beside["errors"]:
        mine["errors"]["flex"] = beside["errors"]["flex"]
        return False
    for key in ("ms", "ms_rounds", "gbps", "share", "vs_sdpa", *extra):
        mine[key]["flex"] = beside[key]["flex"]
    mine["sdpa_beside_flex_ms"] = beside["ms"].get("sdpa")
    return True


def format_row(row: dict) -> str:
    def shares(t, names):
        return "  ".join(f"{n} {t['share'][n]:.0%}" + (f" ({t['vs_sdpa'][n]:.2f}×)" if n in t["vs_sdpa"] else "")
                         for n in names if n in t["share"])

    graph = f"  | replayed: {shares(row['graph'], ('flashattn', 'sdpa', 'flex'))}" if "graph" in row else ""
    return (f"{row['dtype']:<9} B={row['B']:<3} S={row['S']:<7} Hq/Hkv={row['Hq']}/{row['Hkv']:<3} "
            f"splits={row['num_splits']:<4} {shares(row, row['share'])}{graph}")


@measurement("decode_vs_sdpa", description="attention_with_kvcache (contiguous and paged) vs SDPA, fast and "
                                           "FlexAttention at Lq = 1: B 1-64, context 1k-128k, Hkv 8/32, fp16/bf16")
def decode_vs_sdpa() -> dict:
    result = decode_table(progress=lambda line: print("  " + line, flush=True), capture=cuda_graph_replay)
    c = SPLIT_CURVE
    result["split_curve"] = split_curve(c["shapes"], c["dtype"], c["splits"], device=runtime.DEVICE,
                                        copy_gbps=result["copy_bandwidth_gbps"], timer=gpu_timer, rounds=ROUNDS,
                                        capture=cuda_graph_replay)
    result["flex_rows"] = flex_pass(result["rows"], copy_gbps=result["copy_bandwidth_gbps"],
                                    progress=lambda line: print("  " + line, flush=True), capture=cuda_graph_replay)
    result["flush"] = FLUSH
    result["table_row_max_pages"] = decode_plan.TABLE_ROW_MAX_PAGES
    result["flush_effect"] = flush_effect(FLUSH_CELLS, "float16", device=runtime.DEVICE,
                                          copy_gbps=result["copy_bandwidth_gbps"], rounds=ROUNDS,
                                          timers={flush: functools.partial(gpu_timer, flush=flush)
                                                  for flush in bench.L2_FLUSHES}, capture=cuda_graph_replay)
    result["notes"] = (f"Lq = 1, cache_seqlens = S for every sequence (a full cache); per cell every kernel timed on "
                       f"the same inputs in {ROUNDS} interleaved rounds of do_bench (warmup {WARMUP_MS} ms, rep "
                       f"{REP_MS} ms, the L2 emptied before each call by reading a 256 MB buffer: flush = 'read', "
                       "bench.l2_flush; do_bench's own zero fill leaves dirty lines whose write-back falls in the "
                       "timed call, flush_effect times a few cells after each, replayed); GB/s = K and V bytes / "
                       "median time; share = GB/s / the copy bandwidth measured at the start of this run; "
                       "rel_error on the first sequence's first group of query heads against the float64 "
                       "reference; FlexAttention timed last, after "
                       "every other kernel and the split curve (see flex_pass: the short calls issued from Python "
                       "were slower after its compile), beside SDPA timed again (vs_sdpa['flex'] against that, "
                       "sdpa_beside_flex_ms); 'graph': the same kernels captured in CUDA graphs "
                       "(cuda_graph_replay) and their replays timed by do_bench in the same interleaved rounds as the "
                       "calls (the GPU's time without the host's; split curve: graph_ms)")
    return result


# --- generation --------------------------------------------------------------------------------------------

GENERATION = dict(model=dict(n_layers=4, n_heads=32, n_kv_heads=8, d_model=4096), vocab_size=32000, batch=16,
                  prompt=16384, steps=64, dtype="bfloat16",
                  check=dict(model=dict(n_layers=2, n_heads=8, n_kv_heads=2, d_model=256), vocab_size=512, batch=4,
                             prompt=200, steps=48))


def _model(config: GPTConfig, device, dtype, seed: int = 0):
    from flashattn.measure.measurements.training import make_model  # noqa: PLC0415 (the same layer)

    return make_model(config, torch.nn.functional.scaled_dot_product_attention, seed, device).to(dtype).eval()


def tokens_agree(model, prompt, steps: int) -> dict:
    """Greedy tokens of generation without a cache, with attention_with_kvcache and with the SDPA cache loop; the
    fraction of the cached loops' tokens equal to the uncached ones."""
    full = model.generate(prompt, steps)
    out = {}
    for name, attention in (("flashattn", attention_with_kvcache), ("sdpa", sdpa_with_kvcache)):
        got = model.generate(prompt, steps, model.new_cache(prompt.shape[0], attention=attention))
        out[name] = (got == full).float().mean().item()
    return out


def step_times(model, prompt, steps: int, *, rounds: int) -> dict:
    """Per attention (attention_with_kvcache, and the same loop on SDPA): ``steps`` single-token steps after the
    prompt, timed by the wall clock with the GPU synchronized, in interleaved rounds from the same cache each time;
    ms per step and tokens per second. The prompt runs once, through the SDPA loop; the other cache gets a copy of
    its keys and values (the same numbers: what is timed is the steps)."""
    sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
    B, P = prompt.shape
    caches = {name: model.new_cache(B, P + steps, attention=attention)
              for name, attention in (("flashattn", attention_with_kvcache), ("sdpa", sdpa_with_kvcache))}
    with torch.no_grad():
        first = model(prompt, caches["sdpa"])[:, -1:].argmax(-1)
    for k, v, k_src, v_src in zip(caches["flashattn"].k, caches["flashattn"].v, caches["sdpa"].k, caches["sdpa"].v,
                                  strict=True):
        k.copy_(k_src)
        v.copy_(v_src)

    def run(name) -> float:
        cache, token = caches[name], first
        cache.length = P
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(steps):
                token = model(token, cache)[:, -1:].argmax(-1)
        sync()
        return (time.perf_counter() - t0) * 1e3 / steps

    for name in caches:  # once untimed: compile, allocate
        run(name)
    times = time_interleaved({name: functools.partial(run, name) for name in caches}, rounds, lambda fn: fn())
    ms = {name: statistics.median(t) for name, t in times.items()}
    return {"ms_per_step": ms, "ms_rounds": times, "tokens_per_s": {name: B / (m * 1e-3) for name, m in ms.items()}}


@measurement("decode_generation", description="greedy generation with a KV cache: attention_with_kvcache vs the "
                                              "same loop on SDPA (tokens/s, bf16, 16k context), and the tokens checked")
def decode_generation() -> dict:
    g, c = GENERATION, GENERATION["check"]
    check_cfg = GPTConfig(c["vocab_size"], c["prompt"] + c["steps"], **c["model"])
    model = _model(check_cfg, "cuda", torch.float32)
    prompt = torch.randint(0, c["vocab_size"], (c["batch"], c["prompt"]), device="cuda",
                           generator=torch.Generator(device="cuda").manual_seed(1))
    agree = tokens_agree(model, prompt, c["steps"])
    del model
    cfg = GPTConfig(g["vocab_size"], g["prompt"] + g["steps"], **g["model"])
    model = _model(cfg, "cuda", getattr(torch, g["dtype"]))
    prompt = torch.randint(0, g["vocab_size"], (g["batch"], g["prompt"]), device="cuda",
                           generator=torch.Generator(device="cuda").manual_seed(2))
    timing = step_times(model, prompt, g["steps"], rounds=ROUNDS)
    for name in timing["ms_per_step"]:
        print(f"  {name}: {timing['ms_per_step'][name]:.2f} ms per step, {timing['tokens_per_s'][name]:.0f} tokens/s",
              flush=True)
    return {**g, "float32_tokens_equal_to_uncached": agree, **timing,
            "notes": "timing: the prompt once (SDPA loop; its keys and values copied into the other cache), then "
                     f"`steps` greedy single-token steps (wall clock, GPU synchronized), {ROUNDS} interleaved rounds "
                     "from the same cache; tokens/s = batch / time per step. float32_tokens_equal_to_uncached: the "
                     "check model's greedy tokens with each cache loop against generation without a cache (fraction "
                     "equal)"}
