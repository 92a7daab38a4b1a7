"""GPU probe for attention_with_kvcache (issue 31, notebook 15): correctness at full size and the tuning curves.

    python tools/gpu/decode/probe.py               # about 3-4 minutes on an H200
    python tools/gpu/decode/probe.py --quick       # correctness and one shape of the sweep (~1 minute)

Without a GPU it runs as a dry run of its own plumbing: tiny sizes in Triton's interpreter, a wall-clock timer
instead of do_bench (the numbers mean nothing there).

1. correctness: against the float64 reference (the first group of query heads of every sequence): fp16 and bf16;
   Hq/Hkv = 32/8 and 32/32; a 128k cache, contiguous and in shuffled pages of 256 and of 16 keys; ragged lengths
   (131072, 100003, 1 and a page boundary ± 1); Lq = 1 and 4, causal and not; num_splits 0 (the rule), 1, 7 and 128
   (more splits than the short sequences have blocks); D = 64, 96, 256 at 8k. Then a CUDA graph: the call captured
   once, replayed after new lengths and queries were written into its inputs, against the eager call.
2. sweep: fp16 D = 128, Lq = 1, a full contiguous cache, at a few (B, Hkv, S): every tile configuration of
   decode.TILES[128] × numbers of splits around the rule's, and SDPA, in interleaved rounds. Then D = 64 and 256,
   bf16. 3. pages: the paged cache (pages of 16, 64, 256 keys) against the contiguous one at the rule's splits,
   and at one shape every tile configuration on each (paged ones with decode.paged_stages).

Printed: a correctness table, and per shape SDPA's share of the copy bandwidth and, per tile configuration, the
share at each number of splits (best marked). $OUT/decode_probe.json (default ./probe_out) holds every number.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

OUT = Path(os.environ.get("OUT", "probe_out"))
QUICK = "--quick" in sys.argv
BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "270"))  # no new work starts after this (the summary prints)
ROUNDS = 3
T0 = time.perf_counter()
LOG: list[str] = []

import flashattn  # noqa: E402  (after the constants: sets TRITON_INTERPRET when there is no GPU)
from flashattn import runtime  # noqa: E402
from flashattn.kernels import decode, decode_plan  # noqa: E402
from flashattn.reference import reference_with_kvcache, rel_error  # noqa: E402

DRY = runtime.MODE != "gpu"
DEV = runtime.DEVICE
TOL = {"float16": 3e-3, "bfloat16": 2e-2, "float32": 1e-5}


def log(line: str) -> None:
    print(line, flush=True)
    LOG.append(line)


def over_budget() -> bool:
    return time.perf_counter() - T0 > BUDGET_S


FLUSH = "read"  # how do_bench empties the L2 before each call (bench.l2_flush), as decode_vs_sdpa times (since 12-04)


def timer(fn) -> float:
    if DRY:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from flashattn import bench

    return bench.time_ms(fn, warmup=5, rep=40, flush=FLUSH)


def interleaved(fns: dict, rounds: int = ROUNDS) -> dict:
    """Median ms of each function over ``rounds`` rounds of alternating order."""
    times, order = {n: [] for n in fns}, list(fns)
    for _ in range(rounds if not DRY else 1):
        for n in order:
            times[n].append(timer(fns[n]))
        order.reverse()
    return {n: statistics.median(t) for n, t in times.items()}


# --- problems ------------------------------------------------------------------------------------------------

def cache(B, S, Hkv, D, dtype, seed):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    return tuple(torch.randn(B, S, Hkv, D, generator=gen, device=DEV, dtype=dtype) for _ in range(2))


def paged(k, v, page_size, seed):
    """The cache in shuffled pages (two spare pages full of NaN) and its block table."""
    B, S, Hkv, D = k.shape
    per_seq = S // page_size
    num_pages = B * per_seq + 2
    gen = torch.Generator(device=DEV).manual_seed(seed)
    order = torch.randperm(num_pages, generator=gen, device=DEV)[: B * per_seq]
    kp = torch.full((num_pages, page_size, Hkv, D), float("nan"), device=DEV, dtype=k.dtype)
    vp = kp.clone()
    kp[order], vp[order] = k.reshape(-1, page_size, Hkv, D), v.reshape(-1, page_size, Hkv, D)
    return kp, vp, order.view(B, per_seq).int()


def ragged_problems(S: int, page: int):
    """The full-size problems of the probes that check a change of the split kernel (merge.py, table_row.py): fp16 and
    bf16, 32/8 and 32/32 heads, 4 sequences in a cache of S keys, contiguous and in shuffled pages of ``page``, of
    S, about 3S/4, 5 and page + 1 keys; Lq = 1 causal, 4 causal and 4 not. Yields (q, k, v, kp, vp, table, seqlens,
    causal). A dry run: fp16, 2 K/V heads, D = 16."""
    for dtype in (("float16",) if DRY else ("float16", "bfloat16")):
        dt = getattr(torch, dtype)
        for Hkv in ((2,) if DRY else (8, 32)):
            k, v = cache(4, S, Hkv, 16 if DRY else 128, dt, seed=Hkv)
            kp, vp, table = paged(k, v, page, seed=Hkv)
            seqlens = torch.tensor([S, S - S // 4 + 3, 1 + 4, page + 1], dtype=torch.int32, device=DEV)
            for Lq, causal in ((1, True), (4, True), (4, False)):
                q = torch.randn(4, Lq, 4 * Hkv if DRY else 32, k.shape[-1], device=DEV, dtype=dt)
                yield q, k, v, kp, vp, table, seqlens, causal
            del k, v, kp, vp


def check(q, k, v, seqlens, *, block_table=None, causal=True, num_splits=0, label=""):
    """Max relative error over the sequences, on the first group of query heads (its K/V head), against float64."""
    out = flashattn.attention_with_kvcache(q, k, v, seqlens, block_table=block_table, causal=causal,
                                           num_splits=num_splits)
    group = q.shape[2] // k.shape[2]
    ref = reference_with_kvcache(q[:, :, :group], k[..., :1, :], v[..., :1, :], seqlens, block_table=block_table,
                                 causal=causal)
    err = rel_error(out[:, :, :group], ref)
    dtype = str(q.dtype).replace("torch.", "")
    row = dict(label=label, dtype=dtype, shape=list(q.shape), cache=list(k.shape), paged=block_table is not None,
               causal=causal, num_splits=num_splits, rel_error=err, ok=err < TOL[dtype] and bool(out.isfinite().all()))
    log(f"  {'ok ' if row['ok'] else 'BAD'} {label:<34} {dtype:<9} q {tuple(q.shape)} cache {tuple(k.shape)} "
        f"causal={causal} splits={num_splits}: rel_error {err:.1e}")
    return row


def correctness() -> list[dict]:
    rows = []
    S, pages = (128, (32, 16)) if DRY else (131072, (256, 16))
    dtypes = ("float16",) if DRY else ("float16", "bfloat16")
    heads = ((4, 2), (4, 4)) if DRY else ((32, 8), (32, 32))
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for Hq, Hkv in heads:
            if over_budget():
                return rows
            k, v = cache(2, S, Hkv, 128 if not DRY else 16, dtype, seed=Hkv)
            D = k.shape[-1]
            gen = torch.Generator(device=DEV).manual_seed(Hq + Hkv)
            q1 = torch.randn(2, 1, Hq, D, generator=gen, device=DEV, dtype=dtype)
            q4 = torch.randn(2, 4, Hq, D, generator=gen, device=DEV, dtype=dtype)
            full = torch.tensor([S, S - 29 if not DRY else S - 3], dtype=torch.int32, device=DEV)
            ragged = torch.tensor([pages[0] + 1, 1], dtype=torch.int32, device=DEV)
            label = f"{Hq}/{Hkv} heads"
            rows.append(check(q1, k, v, full, label=f"{label}, contiguous"))
            rows.append(check(q4, k, v, full, label=f"{label}, contiguous, Lq 4"))
            rows.append(check(q4, k, v, full, causal=False, num_splits=7, label=f"{label}, contiguous, Lq 4"))
            rows.append(check(q1, k, v, ragged, num_splits=decode.MAX_SPLITS, label=f"{label}, 1 key, page + 1"))
            for page in pages:
                kp, vp, table = paged(k, v, page, seed=page)
                rows.append(check(q1, kp, vp, full, block_table=table, label=f"{label}, pages of {page}"))
                rows.append(check(q4, kp, vp, full, block_table=table, num_splits=1,
                                  label=f"{label}, pages of {page}, Lq 4"))
                edge = torch.tensor([page - 1, 3 * page + 1], dtype=torch.int32, device=DEV)
                rows.append(check(q1, kp, vp, edge, block_table=table, num_splits=3,
                                  label=f"{label}, pages of {page}, edges"))
                del kp, vp
            del k, v
    for D in ((40,) if DRY else (64, 96, 256)):
        k, v = cache(2, 64 if DRY else 8192, 8 if not DRY else 2, D, torch.float16, seed=D)
        q = torch.randn(2, 2, 4 * k.shape[2], D, device=DEV, dtype=torch.float16)
        rows.append(check(q, k, v, torch.tensor([k.shape[1], 777 if not DRY else 33], dtype=torch.int32, device=DEV),
                          label=f"D = {D}"))
    return rows


def graph_capture() -> dict:
    """Capture one call in a CUDA graph; write new lengths and queries into its inputs; replay; compare with eager."""
    if DRY:
        return {"skipped": "no GPU"}
    k, v = cache(4, 32768, 8, 128, torch.float16, seed=5)
    q = torch.randn(4, 1, 32, 128, device=DEV, dtype=torch.float16)
    seqlens = torch.tensor([32768, 1000, 17, 20000], dtype=torch.int32, device=DEV)
    flashattn.attention_with_kvcache(q, k, v, seqlens)  # compile, and check the values, outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flashattn.attention_with_kvcache(q, k, v, seqlens)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashattn.attention_with_kvcache(q, k, v, seqlens)
    seqlens.copy_(torch.tensor([5, 32000, 4097, 1], dtype=torch.int32))
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    eager = flashattn.attention_with_kvcache(q, k, v, seqlens)
    err = rel_error(out, eager)
    log(f"  {'ok ' if err < 1e-6 else 'BAD'} CUDA graph replay after new lengths and queries: rel_error {err:.1e}")
    return {"rel_error_vs_eager": err, "ok": err < 1e-6}


# --- sweep ---------------------------------------------------------------------------------------------------

def copy_gbps() -> float:
    if DRY:
        return 1.0
    from flashattn.measure.hardware import copy_bandwidth_gbps

    return copy_bandwidth_gbps()


def sweep_shape(B, Hkv, S, D, dtype, bandwidth, configs, split_choices) -> dict:
    dt = getattr(torch, dtype)
    k, v = cache(B, S, Hkv, D, dt, seed=S + B)
    q = torch.randn(B, 1, 32, D, device=DEV, dtype=dt)
    seqlens = torch.full((B,), S, dtype=torch.int32, device=DEV)
    nbytes = 2 * k.numel() * k.element_size()
    rule = decode.make_plan(B, 1, 32, Hkv, D, S, dt, 0, q.device).num_splits
    splits = sorted({n for n in (*split_choices, rule) if 1 <= n <= decode.MAX_SPLITS})
    fns = {("sdpa", 0): lambda: torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=Hkv != 32)}
    errors = {}
    for tiles in configs:
        for n in splits:
            def fn(tiles=tiles, n=n):
                return decode.decode_attention(q, k, v, seqlens, num_splits=n, tiles=tiles)
            try:
                fn()
                fns[(tiles, n)] = fn
            except Exception as err:  # noqa: BLE001 - a configuration that does not fit is a result
                errors[str(tiles)] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
    ms = interleaved(fns)
    share = {key: nbytes / (m * 1e-3) / 1e9 / bandwidth for key, m in ms.items()}
    best = max((key for key in share if key[0] != "sdpa"), key=share.get)
    log(f"  B={B} Hkv={Hkv} S={S} D={D} {dtype}: SDPA {share[('sdpa', 0)]:.0%}; rule {rule} splits; best "
        f"{best[0]} × {best[1]} splits {share[best]:.0%} ({ms[('sdpa', 0)] / ms[best]:.2f}× SDPA)")
    log("      tiles \\ splits " + "".join(f"{n:>6}" for n in splits))
    for tiles in configs:
        cells = "".join(f"{share[(tiles, n)]:>6.0%}" if (tiles, n) in share else f"{'-':>6}" for n in splits)
        log(f"      {str(tiles):<16}{cells}")
    for tiles, err in errors.items():
        log(f"      {tiles}: {err}")
    return dict(B=B, Hkv=Hkv, S=S, D=D, dtype=dtype, rule=rule, splits=splits, cache_bytes=nbytes,
                sdpa_share=share[("sdpa", 0)], errors=errors,
                share={f"{t}|{n}": s for (t, n), s in share.items() if t != "sdpa"},
                best={"tiles": list(best[0]), "num_splits": best[1], "share": share[best],
                      "vs_sdpa": ms[("sdpa", 0)] / ms[best]})


def sweep(bandwidth: float) -> list[dict]:
    if DRY:
        shapes, configs, choices = [(1, 2, 128, 16)], [(32, 4, 1), (16, 4, 1)], (1, 2, 4)
    else:
        shapes = [(1, 8, 32768, 128), (1, 8, 131072, 128), (4, 32, 4096, 128), (16, 8, 16384, 128),
                  (1, 32, 131072, 128), (64, 8, 4096, 128), (1, 8, 1024, 128), (1, 32, 4096, 128)]
        smem = decode_plan._device_facts(DEV)[1]
        configs, choices = decode.tile_configs(128, torch.float16, smem), (1, 4, 8, 16, 32, 64)
        if QUICK:
            shapes = shapes[1:2]
    rows = []
    for B, Hkv, S, D in shapes:
        if over_budget():
            log("  (budget reached: the remaining shapes are left out)")
            return rows
        rows.append(sweep_shape(B, Hkv, S, D, "float16", bandwidth, configs, choices))
        torch.cuda.empty_cache() if not DRY else None
    if not DRY and not QUICK:
        smem = decode_plan._device_facts(DEV)[1]
        for D, dtype in ((64, "float16"), (256, "float16"), (128, "bfloat16")):
            if over_budget():
                return rows
            rows.append(sweep_shape(1, 8, 65536, D, dtype, bandwidth, decode.tile_configs(D, getattr(torch, dtype),
                                                                                          smem), (1, 16, 32, 64)))
    return rows


def page_timing(B, Hkv, S, D, pages, bandwidth, configs=()) -> dict:
    """The default (rule's splits, default tiles) on the contiguous cache and in pages; with ``configs``, also every
    one of those tile configurations on each (paged: with decode.paged_stages)."""
    k, v = cache(B, S, Hkv, D, torch.float16, seed=3)
    q = torch.randn(B, 1, 32, D, device=DEV, dtype=torch.float16)
    seqlens = torch.full((B,), S, dtype=torch.int32, device=DEV)
    fns = {"contiguous": functools.partial(flashattn.attention_with_kvcache, q, k, v, seqlens)}
    for tiles in configs:
        fns[f"contiguous {tiles}"] = functools.partial(decode.decode_attention, q, k, v, seqlens, tiles=tiles)
    for page in pages:
        kp, vp, table = paged(k, v, page, seed=page)
        fns[f"pages of {page}"] = functools.partial(flashattn.attention_with_kvcache, q, kp, vp, seqlens,
                                                    block_table=table)
        for tiles in configs:
            fns[f"pages of {page} {tiles}"] = functools.partial(decode.decode_attention, q, kp, vp, seqlens,
                                                                block_table=table, tiles=tiles)
    for fn in fns.values():
        fn()
    ms = interleaved(fns)
    nbytes = 2 * k.numel() * k.element_size()
    share = {n: nbytes / (m * 1e-3) / 1e9 / bandwidth for n, m in ms.items()}
    log(f"  B={B} Hkv={Hkv} S={S} (share of the bandwidth, speed against the default on the contiguous cache):")
    for n, s in share.items():
        log(f"      {n:<34}{s:>6.0%}{ms['contiguous'] / ms[n]:>7.2f}×")
    return dict(B=B, Hkv=Hkv, S=S, D=D, share=share, vs_contiguous={n: ms["contiguous"] / m for n, m in ms.items()})


def page_sizes(bandwidth: float) -> list[dict]:
    shapes = [(1, 2, 128, 16, (16, 32))] if DRY else [(1, 8, 131072, 128, (16, 64, 256)),
                                                     (16, 8, 16384, 128, (16, 64, 256))]
    rows = []
    for i, shape in enumerate(shapes):
        if over_budget():
            break
        smem = decode_plan._device_facts(DEV)[1]
        configs = () if DRY or QUICK or i else decode.tile_configs(128, torch.float16, smem)
        rows.append(page_timing(*shape, bandwidth, configs))
    return rows


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    log(f"{runtime.describe()}{' (dry run: tiny sizes, wall-clock timer)' if DRY else ''}")
    result = {}
    log("1. correctness (first group of query heads of every sequence, against float64)")
    result["correctness"] = correctness()
    result["graph"] = graph_capture()
    bandwidth = copy_gbps()
    log(f"2. sweep (share of the copy bandwidth, {bandwidth:.0f} GB/s measured now)")
    result["copy_bandwidth_gbps"] = bandwidth
    result["sweep"] = sweep(bandwidth)
    log("3. paged against contiguous (the rule's splits, the default tiles)")
    result["pages"] = page_sizes(bandwidth)
    bad = [r["label"] for r in result["correctness"] if not r["ok"]] + (["graph"] if not result["graph"].get("ok", 1)
                                                                        else [])
    log(f"summary: {len(result['correctness'])} correctness cases, {len(bad)} bad {bad if bad else ''}; "
        f"{time.perf_counter() - T0:.0f} s")
    result["log"] = LOG
    (OUT / "decode_probe.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
