"""GPU probe for attention_with_kvcache's unsplit launches of 128-512 programs over short caches (issue 31).

    OUT=... python tools/gpu/decode/residency.py      # about a minute on an H200

decode_vs_sdpa (2026-12-03 11:29, CUDA-graph replays) has its unsplit launches of 512 programs over 1k keys (B = 16
with 32/32 heads, B = 64 with 32/8) at 0.92-0.93× SDPA, and of 128 programs over 1k-4k keys (B = 4, 32/32) at
0.97×; merge.py found splitting them slower still. With the default tiles (64, 4, 3) a program takes about 70 KB of
shared memory, so 3 fit on an SM: 396 places for 512 programs, a second, partial wave. Here, at those cells (fp16,
D = 128, Lq = 1, a full contiguous cache, one split), tiles with fewer stages or narrower steps, which let 4-6
programs share an SM, against the default and SDPA, in interleaved rounds (waves.py's sweep). First run 2026-12-03
11:48 (calls): (32, 4, 3) read the 512-program cells at 82 % of the copy bandwidth against the default's 75-76 %
(SDPA 81-82 %); on the 128-program cells the default stayed the fastest (decode_plan.SHORT_TILES since).
$OUT/decode_residency.json holds every number. Without a GPU: a dry run of its plumbing at tiny sizes in the
interpreter.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import waves  # noqa: E402  (this folder's sweep of tiles × splits)

# the last three (added 2026-12-04): deeper pipelines and more warps, more loads in flight per program on the
# 128-program grids where decode_vs_sdpa (after the read flush) still has SDPA 2-5 % ahead. Their run (2026-12-04
# 15:34 UTC): none beat the default at 1k keys; at 4k (128, 4, 3) gained a point or two, still short of SDPA, so
# decode_plan's tiles stay
TILES = [(64, 4, 3), (64, 4, 2), (32, 4, 3), (32, 4, 2), (32, 4, 4), (128, 4, 2), (64, 8, 2), (128, 4, 3),
         (128, 4, 4), (128, 8, 3), (64, 4, 5)]
# (B, Hkv, S, split choices)
CELLS = [(16, 32, 1024, (1,)), (64, 8, 1024, (1,)), (4, 32, 1024, (1,)), (16, 8, 1024, (1,)), (4, 32, 4096, (1,)),
         (16, 8, 4096, (1,)), (64, 8, 4096, (1,))]

if __name__ == "__main__":
    sys.exit(waves.run(CELLS, TILES, "decode_residency.json", merge=False))
