"""GPU probe for attention_with_kvcache's slow cells (issue 31): the tiles and splits where the recorded
decode_vs_sdpa is below SDPA.

    OUT=... python tools/gpu/decode/waves.py      # about 3-4 minutes on an H200

decode_vs_sdpa (2026-12-02) is below SDPA mostly in two kinds of cell: one split with 512 programs (B = 16 with
32/32 heads, B = 64 with 32/8) at 86-92 % of the copy bandwidth against SDPA's 98-104 %, and short caches
(1k-4k) with 2-4 splits. Here, at those cells (fp16, D = 128, Lq = 1, a full contiguous cache), every tile
configuration of a wider set than decode.TILES[128] (deeper pipelines, 2 and 8 warps) × numbers of splits around
the rule's, and SDPA, in interleaved rounds; then, at the split cells, the split kernel and the merge kernel timed
alone (what one launch fewer would save). $OUT/decode_waves.json holds every number.
Without a GPU: a dry run of its plumbing at tiny sizes in the interpreter.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

OUT = Path(os.environ.get("OUT", "probe_out"))
BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "240"))
T0 = time.perf_counter()
LOG: list[str] = []

import flashattn  # noqa: E402,F401  (sets the mode)
from flashattn import runtime  # noqa: E402
from flashattn.kernels import decode  # noqa: E402

DRY = runtime.MODE != "gpu"
DEV = runtime.DEVICE
ROUNDS = 1 if DRY else 3

# (BLOCK_N, num_warps, num_stages): decode.TILES[128] and deeper or narrower ones
TILES = [(64, 4, 3), (128, 4, 3), (64, 4, 4), (64, 4, 5), (128, 4, 4), (128, 8, 3), (32, 4, 4), (32, 4, 6),
         (64, 2, 3), (64, 2, 4), (64, 8, 3), (128, 8, 2)]
# (B, Hkv, S, split choices)
CELLS = [(16, 32, 16384, (1, 2, 3, 4)), (16, 32, 131072, (1, 2, 3)), (16, 32, 4096, (1, 2, 3, 4)),
         (16, 32, 1024, (1, 2, 4)), (64, 8, 16384, (1, 2, 3)), (64, 8, 4096, (1, 2, 3)), (64, 8, 1024, (1, 2)),
         (16, 8, 1024, (1, 2, 4)), (16, 8, 4096, (1, 2, 3, 4)), (4, 32, 1024, (1, 2, 4)), (4, 32, 4096, (2, 3, 4, 6)),
         (1, 8, 1024, (2, 4, 8)), (1, 8, 16384, (16, 24, 32, 48))]


def log(line: str) -> None:
    print(line, flush=True)
    LOG.append(line)


def timer(fn) -> float:
    if DRY:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=25, return_mode="median")


def interleaved(fns: dict) -> dict:
    times, order = {n: [] for n in fns}, list(fns)
    for _ in range(ROUNDS):
        for n in order:
            times[n].append(timer(fns[n]))
        order.reverse()
    return {n: statistics.median(t) for n, t in times.items()}


def cell(B, Hkv, S, choices, bandwidth, D=128, Hq=32):
    if DRY:
        B, Hkv, S, D, Hq = min(B, 2), 2, 64, 16, 4
    gen = torch.Generator(device=DEV).manual_seed(S + B)
    k, v = (torch.randn(B, S, Hkv, D, generator=gen, device=DEV, dtype=torch.float16) for _ in range(2))
    q = torch.randn(B, 1, Hq, D, generator=gen, device=DEV, dtype=torch.float16)
    seqlens = torch.full((B,), S, dtype=torch.int32, device=DEV)
    nbytes = 2 * k.numel() * k.element_size()
    rule = decode.make_plan(B, 1, Hq, Hkv, D, S, torch.float16, 0, q.device).num_splits
    splits = sorted({n for n in (*choices, rule) if 1 <= n <= decode.MAX_SPLITS})
    fns = {("sdpa", 0): lambda: torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=Hkv != Hq)}
    errors = {}
    for tiles in ([(32, 4, 1)] if DRY else TILES):
        for n in splits:
            def fn(tiles=tiles, n=n):
                return decode.decode_attention(q, k, v, seqlens, num_splits=n, tiles=tiles)
            try:
                fn()
                fns[(tiles, n)] = fn
            except Exception as err:  # noqa: BLE001 - a configuration that does not compile is a result
                errors[str(tiles)] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
    ms = interleaved(fns)
    share = {key: nbytes / (m * 1e-3) / 1e9 / bandwidth for key, m in ms.items()}
    ours = [key for key in share if key[0] != "sdpa"]
    best = max(ours, key=share.get)
    default = (tuple(decode.TILES[128][0]) if not DRY else (32, 4, 1), rule)
    log(f"B={B} Hkv={Hkv} S={S}: SDPA {share[('sdpa', 0)]:.0%} {ms[('sdpa', 0)] * 1e3:.1f} us; default "
        f"{default[0]}x{rule} {share.get(default, 0):.0%} ({ms[('sdpa', 0)] / ms.get(default, float('inf')):.3f}x);"
        f" best {best[0]}x{best[1]} {share[best]:.0%} ({ms[('sdpa', 0)] / ms[best]:.3f}x SDPA)")
    log("    tiles \\ splits " + "".join(f"{n:>7}" for n in splits))
    for tiles in ([(32, 4, 1)] if DRY else TILES):
        cells = "".join(f"{ms[('sdpa', 0)] / ms[(tiles, n)]:>7.3f}" if (tiles, n) in ms else f"{'-':>7}"
                        for n in splits)
        log(f"    {str(tiles):<14}{cells}")
    for tiles, err in errors.items():
        log(f"    {tiles}: {err}")
    parts = {}
    if rule > 1:  # the split kernel and the merge alone, default tiles
        decode.decode_attention(q, k, v, seqlens, num_splits=rule)
        key = decode.problem_key(q, k, v, seqlens, None, True, None, rule, None)
        prep = decode._PREPARED[key]
        o_part = torch.empty(prep.part_shapes[0], dtype=torch.float32, device=DEV)
        lse_part = torch.empty(prep.part_shapes[1], dtype=torch.float32, device=DEV)
        out = torch.empty(prep.out_shape, dtype=q.dtype, device=DEV)
        prep.split(q, k, v, o_part, lse_part, seqlens, seqlens, *prep.split_ints)
        parts = interleaved({
            "split": lambda: prep.split(q, k, v, o_part, lse_part, seqlens, seqlens, *prep.split_ints),
            "merge": lambda: prep.merge(o_part, lse_part, out, rule, rule * D, D, D),
            "whole": lambda: decode.decode_attention(q, k, v, seqlens, num_splits=rule)})
        log(f"    alone at {rule} splits: split {parts['split'] * 1e3:.1f} us, merge {parts['merge'] * 1e3:.1f} us, "
            f"whole call {parts['whole'] * 1e3:.1f} us")
    return dict(B=B, Hkv=Hkv, S=S, rule=rule, splits=splits, cache_bytes=nbytes, errors=errors,
                ms={f"{t}|{n}": m for (t, n), m in ms.items()}, share={f"{t}|{n}": s for (t, n), s in share.items()},
                best={"tiles": list(best[0]), "num_splits": best[1], "vs_sdpa": ms[("sdpa", 0)] / ms[best]},
                parts_ms=parts)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    log(runtime.describe())
    if DRY:
        bandwidth = 1.0
    else:
        from flashattn.measure.hardware import copy_bandwidth_gbps

        bandwidth = copy_bandwidth_gbps()
    log(f"copy bandwidth {bandwidth:.0f} GB/s; cells: ratio SDPA / ours per tiles x splits")
    rows = []
    for B, Hkv, S, choices in (CELLS[:2] if DRY else CELLS):
        if time.perf_counter() - T0 > BUDGET_S:
            log("(budget reached: the remaining cells are left out)")
            break
        rows.append(cell(B, Hkv, S, choices, bandwidth))
        if not DRY:
            torch.cuda.empty_cache()
    log(f"{len(rows)} cells in {time.perf_counter() - T0:.0f} s")
    (OUT / "decode_waves.json").write_text(json.dumps(dict(bandwidth=bandwidth, rows=rows, log=LOG), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
