"""GPU probe for the paged cache's table row in registers (issue 31): ``decode_plan.TABLE_ROW_MAX_PAGES`` (0 until
this ran; 16 since, from its result and decode_vs_sdpa's recording with it). A paged split program reads its
sequence's length, then a block's page from the table, then the block: two loads in a row before its first key block,
where a contiguous one waits for one. With TABLE_ROW the program reads the sequence's whole row of the table beside
its length and picks each page from registers.

    OUT=... python tools/gpu/decode/table_row.py      # about 3 minutes on an H200

1. correctness at full size with the table row on: fp16 and bf16, 32/8 and 32/32 heads, a cache of 16k keys in
   shuffled pages of 256 (64 pages a row, the most it takes here), ragged lengths, Lq = 1 and 4, causal and not,
   the rule's splits and 4 and 16, against float64 (probe.check) and against the same call without it (the same
   sums: rel_error 0 expected).
2. timing at decode_vs_sdpa's cells of 1k-16k keys (fp16, D = 128, Lq = 1, full caches), where the paged path trails
   the contiguous one by more than 5 % in the 12-04 13:42 recording: SDPA, contiguous, paged (a table load per key
   block, paged_stages' pipeline) and paged with the table row (the contiguous pipeline), each as a CUDA-graph replay
   (the GPU's time, as decode_vs_sdpa's replayed columns), in interleaved rounds.
$OUT/decode_table_row.json holds every number. Without a GPU: a dry run of its plumbing at tiny sizes in the
interpreter (no graphs).
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
from flashattn.kernels import decode  # noqa: E402
from flashattn.measure.measurements.decode import cuda_graph_replay  # noqa: E402
from flashattn.reference import rel_error  # noqa: E402

PAGE = 256
ON = 64  # TABLE_ROW_MAX_PAGES for "on": rows of up to 64 pages (16k keys in pages of 256)
CELLS = [(B, Hkv, S) for S in (1024, 4096, 16384) for B in (1, 4, 16, 64) for Hkv in (8, 32)]


def correctness() -> list[dict]:
    rows = []
    S, page = (128, 32) if DRY else (16384, PAGE)
    for q, _, _, kp, vp, table, seqlens, causal in probe.ragged_problems(S, page):
        B, Lq, Hq, D = q.shape
        for splits in ((0, 3) if DRY else (0, 4, 16)):
            with decode.table_rows(0):
                off = decode.decode_attention(q, kp, vp, seqlens, block_table=table, causal=causal, num_splits=splits)
            with decode.table_rows(ON):
                plan = decode.make_plan(B, Lq, Hq, kp.shape[2], D, S, q.dtype, splits, q.device, None, True, None, page)
                row = probe.check(q, kp, vp, seqlens, block_table=table, causal=causal, num_splits=splits,
                                  label=f"table row {plan.table_row}, stages {plan.num_stages}")
                on = decode.decode_attention(q, kp, vp, seqlens, block_table=table, causal=causal, num_splits=splits)
            row["vs_off"] = rel_error(on, off)
            row["table_row"] = plan.table_row
            row["ok"] = row["ok"] and plan.table_row > 0 and row["vs_off"] < 1e-3
            rows.append(row)
    return rows


def time_cell(B: int, Hkv: int, S: int, D: int, bandwidth: float) -> dict:
    k, v = probe.cache(B, S, Hkv, D, torch.float16, seed=S + B)
    kp, vp, table = probe.paged(k, v, 32 if DRY else PAGE, seed=B)
    Hq = 4 if DRY else 32
    q = torch.randn(B, 1, Hq, D, device=DEV, dtype=torch.float16)
    seqlens = torch.full((B,), S, dtype=torch.int32, device=DEV)
    nbytes = 2 * k.numel() * k.element_size()
    fns = {"sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
               q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=Hkv != Hq),
           "contiguous": lambda: decode.decode_attention(q, k, v, seqlens),
           "paged": lambda: decode.decode_attention(q, kp, vp, seqlens, block_table=table),
           "paged, table row": lambda: decode.decode_attention(q, kp, vp, seqlens, block_table=table)}
    timed, plans = {}, {}
    for name, fn in fns.items():
        with decode.table_rows(ON if name == "paged, table row" else 0):
            fn()
            if name != "sdpa":
                paged = name != "contiguous"
                plans[name] = decode.make_plan(B, 1, Hq, Hkv, D, S, torch.float16, 0, q.device, None, paged, None,
                                               PAGE if paged else 0)._asdict()
            timed[name] = fn if DRY else cuda_graph_replay(fn)  # the launch is fixed when captured
    ms = probe.interleaved(timed)
    sdpa = ms["sdpa"]
    log(f"  B={B} Hkv={Hkv} S={S}: " + "  ".join(
        f"{n} {t * 1e3:.1f} us ({nbytes / (t * 1e-3) / 1e9 / bandwidth:.0%}, ×SDPA {sdpa / t:.3f})"
        for n, t in ms.items()) + f"; paged ÷ contiguous {ms['contiguous'] / ms['paged']:.3f} → "
        f"{ms['contiguous'] / ms['paged, table row']:.3f}")
    return dict(B=B, Hkv=Hkv, S=S, D=D, cache_bytes=nbytes, ms=ms, plans=plans)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    log(runtime.describe())
    log("1. the table row in registers against float64 and against a table load per key block")
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
    (OUT / "decode_table_row.json").write_text(json.dumps(dict(bandwidth=bandwidth, correctness=rows, timing=times,
                                                               log=probe.LOG), indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
