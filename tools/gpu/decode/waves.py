"""GPU probe for attention_with_kvcache's slow cells (issue 31): the tiles and splits where the recorded
decode_vs_sdpa is below SDPA.

    OUT=... python tools/gpu/decode/waves.py      # about 3-4 minutes on an H200 (timing as probe.py's sweep)

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
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import probe  # noqa: E402  (this folder's probe: its timer, interleaved rounds, sweep_shape and log)
from probe import DEV, DRY, OUT, interleaved, log  # noqa: E402

from flashattn import runtime  # noqa: E402
from flashattn.kernels import decode  # noqa: E402

# (BLOCK_N, num_warps, num_stages): decode.TILES[128] and deeper or narrower ones
TILES = [(64, 4, 3), (128, 4, 3), (64, 4, 4), (64, 4, 5), (128, 4, 4), (128, 8, 3), (32, 4, 4), (32, 4, 6),
         (64, 2, 3), (64, 2, 4), (64, 8, 3), (128, 8, 2)]
# (B, Hkv, S, split choices)
CELLS = [(16, 32, 16384, (1, 2, 3, 4)), (16, 32, 131072, (1, 2, 3)), (16, 32, 4096, (1, 2, 3, 4)),
         (16, 32, 1024, (1, 2, 4)), (64, 8, 16384, (1, 2, 3)), (64, 8, 4096, (1, 2, 3)), (64, 8, 1024, (1, 2)),
         (16, 8, 1024, (1, 2, 4)), (16, 8, 4096, (1, 2, 3, 4)), (4, 32, 1024, (1, 2, 4)), (4, 32, 4096, (2, 3, 4, 6)),
         (1, 8, 1024, (2, 4, 8)), (1, 8, 16384, (16, 24, 32, 48))]


def merge_alone(B, Hkv, S, D, rule) -> dict:
    """At ``rule`` splits (the default tiles): the split kernel and the merge kernel each launched alone, and the
    whole call, in interleaved rounds (ms)."""
    k, v = probe.cache(B, S, Hkv, D, torch.float16, seed=S + B)
    q = torch.randn(B, 1, 32, D, device=DEV, dtype=torch.float16)  # Hq = 32, as sweep_shape
    seqlens = torch.full((B,), S, dtype=torch.int32, device=DEV)
    decode.decode_attention(q, k, v, seqlens, num_splits=rule, merge="kernel")
    prep = decode._PREPARED[decode.problem_key(q, k, v, seqlens, None, True, None, rule, None, "kernel")]
    o_part = torch.empty(prep.part_shapes[0], dtype=torch.float32, device=DEV)
    lse_part = torch.empty(prep.part_shapes[1], dtype=torch.float32, device=DEV)
    out = torch.empty(prep.out_shape, dtype=q.dtype, device=DEV)
    parts = interleaved({
        "split": lambda: prep.split(q, k, v, o_part, lse_part, seqlens, seqlens, out, seqlens, *prep.split_ints),
        "merge": lambda: prep.merge(o_part, lse_part, out, rule, rule * D, D, D),
        "whole": lambda: decode.decode_attention(q, k, v, seqlens, num_splits=rule, merge="kernel")})
    log(f"    alone at {rule} splits: split {parts['split'] * 1e3:.1f} us, merge {parts['merge'] * 1e3:.1f} us, "
        f"whole call {parts['whole'] * 1e3:.1f} us")
    return parts


def run(cells: list, tiles: list, name: str, *, merge: bool = True) -> int:
    """Sweep ``cells`` (B, Hkv, S, split choices) over ``tiles`` (probe.sweep_shape), with, where ``merge`` and the
    rule splits, the split and merge kernels timed alone; $OUT/``name`` holds every number."""
    OUT.mkdir(parents=True, exist_ok=True)
    log(runtime.describe())
    bandwidth = probe.copy_gbps()
    log(f"copy bandwidth {bandwidth:.0f} GB/s; per cell and tiles, the share of it at each number of splits")
    rows = []
    for B, Hkv, S, choices in (cells[:2] if DRY else cells):
        if probe.over_budget():  # PROBE_BUDGET_S
            log("(budget reached: the remaining cells are left out)")
            break
        B, Hkv, S, D, cell_tiles = (min(B, 2), 2, 64, 16, [(32, 4, 1)]) if DRY else (B, Hkv, S, 128, tiles)
        row = probe.sweep_shape(B, Hkv, S, D, "float16", bandwidth, cell_tiles, choices)
        if merge and row["rule"] > 1:
            row["parts_ms"] = merge_alone(B, Hkv, S, D, row["rule"])
        rows.append(row)
        if not DRY:
            torch.cuda.empty_cache()
    log(f"{len(rows)} cells in {time.perf_counter() - probe.T0:.0f} s")
    (OUT / name).write_text(json.dumps(dict(bandwidth=bandwidth, rows=rows, log=probe.LOG), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run(CELLS, TILES, "decode_waves.json"))
