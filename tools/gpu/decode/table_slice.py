"""GPU probe for each split's part of the block table in registers (issue 31): ``decode_plan.TABLE_SLICE_MAX_PAGES``,
off until this has run. Rows longer than ``TABLE_ROW_MAX_PAGES`` pages (16k keys and more in pages of 256) load a
table entry per key block inside the loop, and the paged path trailed the contiguous one by 5-6 % at B = 4 with 32/8
heads and 16k keys (4 splits of 16 pages) in the 12-05 04:00 recording of decode_vs_sdpa. With TABLE_SLICE a split
program loads its own pages' entries once its bounds are known, and picks each block's page from registers.

    OUT=... PROBE_BUDGET_S=100 python tools/gpu/decode/table_slice.py      # about 2 minutes on an H200

1. correctness at full size with the slice on: fp16 and bf16, 32/8 and 32/32 heads, a cache of 16k keys in
   shuffled pages of 256, ragged lengths (their slices rounded out to whole pages), Lq = 1 and 4, causal and not,
   4 and 16 splits, against float64 (probe.check) and against the same call without it (within the dtype's
   tolerance: a shorter sequence's slices differ, so the sums are not the same).
2. timing at decode_vs_sdpa's split cells of 16k and 32k keys (fp16, D = 128, Lq = 1, full caches, the rule's splits):
   SDPA, contiguous, paged as today and paged with the slice, each as a CUDA-graph replay, in interleaved rounds.
$OUT/decode_table_slice.json holds every number. Without a GPU: a dry run at tiny sizes in the interpreter.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import probe  # noqa: E402  (this folder's probe: its timer, interleaved rounds, check and log)
from probe import DEV, DRY, OUT, log  # noqa: E402

from flashattn import runtime  # noqa: E402
from flashattn.kernels import decode, decode_plan  # noqa: E402
from flashattn.measure.measurements.decode import cuda_graph_replay  # noqa: E402
from flashattn.reference import rel_error  # noqa: E402

PAGE = 256
ON = 32  # TABLE_SLICE_MAX_PAGES for "on": slices of up to 32 pages (8k keys in pages of 256)
ROW = decode_plan.TABLE_ROW_MAX_PAGES  # today's whole-row limit, left as it is
CELLS = [(B, Hkv, S) for S in (16384, 32768) for B in (1, 4) for Hkv in (8, 32)]


def correctness() -> list[dict]:
    rows = []
    S, page = (128, 32) if DRY else (16384, PAGE)
    for q, _, _, kp, vp, table, seqlens, causal in probe.ragged_problems(S, page):
        B, Lq, Hq, D = q.shape
        for splits in ((2, 4) if DRY else (4, 16)):
            with decode.table_rows(0 if DRY else ROW, 0):
                off = decode.decode_attention(q, kp, vp, seqlens, block_table=table, causal=causal, num_splits=splits)
            with decode.table_rows(0 if DRY else ROW, ON):
                plan = decode.make_plan(B, Lq, Hq, kp.shape[2], D, S, q.dtype, splits, q.device, None, True, None, page)
                row = probe.check(q, kp, vp, seqlens, block_table=table, causal=causal, num_splits=splits,
                                  label=f"table slice {plan.table_row}, stages {plan.num_stages}")
                on = decode.decode_attention(q, kp, vp, seqlens, block_table=table, causal=causal, num_splits=splits)
            row["vs_off"] = rel_error(on, off)
            row["table_row"], row["table_slice"] = plan.table_row, plan.table_slice
            # (not the same sums where a shorter sequence's slices are rounded out to whole pages: within rounding)
            row["ok"] = row["ok"] and plan.table_slice and row["vs_off"] < probe.TOL[row["dtype"]]
            rows.append(row)
    return rows


def time_cell(B: int, Hkv: int, S: int, D: int, bandwidth: float) -> dict:
    k, v = probe.cache(B, S, Hkv, D, torch.float16, seed=S + B)
    page = 32 if DRY else PAGE
    kp, vp, table = probe.paged(k, v, page, seed=B)
    Hq = 4 if DRY else 32
    q = torch.randn(B, 1, Hq, D, device=DEV, dtype=torch.float16)
    seqlens = torch.full((B,), S, dtype=torch.int32, device=DEV)
    nbytes = 2 * k.numel() * k.element_size()
    fns = {"sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
               q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=Hkv != Hq),
           "contiguous": lambda: decode.decode_attention(q, k, v, seqlens),
           "paged": lambda: decode.decode_attention(q, kp, vp, seqlens, block_table=table),
           "paged, table slice": lambda: decode.decode_attention(q, kp, vp, seqlens, block_table=table)}
    timed, plans = {}, {}
    for name, fn in fns.items():
        with decode.table_rows(0 if DRY else ROW, ON if name == "paged, table slice" else 0):
            fn()
            if name != "sdpa":
                paged = name != "contiguous"
                plans[name] = decode.make_plan(B, 1, Hq, Hkv, D, S, torch.float16, 0, q.device, None, paged, None,
                                               page if paged else 0)._asdict()
            timed[name] = fn if DRY else cuda_graph_replay(fn)  # the launch is fixed when captured
    ms = probe.interleaved(timed)
    sdpa = ms["sdpa"]
    sliced = plans["paged, table slice"]
    log(f"  B={B} Hkv={Hkv} S={S} splits={sliced['num_splits']} slice={sliced['table_row']}: " + "  ".join(
        f"{n} {t * 1e3:.1f} us ({nbytes / (t * 1e-3) / 1e9 / bandwidth:.0%}, ×SDPA {sdpa / t:.3f})"
        for n, t in ms.items()) + f"; paged ÷ contiguous {ms['contiguous'] / ms['paged']:.3f} → "
        f"{ms['contiguous'] / ms['paged, table slice']:.3f}")
    return dict(B=B, Hkv=Hkv, S=S, D=D, cache_bytes=nbytes, ms=ms, plans=plans)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    log(runtime.describe())
    log("1. each split's part of the table row in registers against float64 and against a table load per key block")
    rows = correctness()
    bandwidth = probe.copy_gbps()
    log(f"2. timing, CUDA-graph replays (copy bandwidth {bandwidth:.0f} GB/s)")
    times = []
    for B, Hkv, S in CELLS[:1] if DRY else CELLS:
        if probe.over_budget():
            log("(budget reached: the remaining cells are left out)")
            break
        times.append(time_cell(*((1, 2, 128) if DRY else (B, Hkv, S)), 16 if DRY else 128, bandwidth))
        if not DRY:
            torch.cuda.empty_cache()
    bad = [r for r in rows if not r["ok"]]
    log(f"{len(rows)} checks, {len(bad)} bad; {len(times)} cells timed in {time.perf_counter() - probe.T0:.0f} s")
    (OUT / "decode_table_slice.json").write_text(json.dumps(dict(bandwidth=bandwidth, correctness=rows, timing=times,
                                                                 log=probe.LOG), indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
