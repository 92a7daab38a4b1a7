"""GPU probe for attention_with_kvcache's split launches over long slices of the cache (issue 31).

    OUT=... python tools/gpu/decode/long_slices.py      # about a minute on an H200

waves.py found that unsplit launches of caches of 4k keys or more read faster in steps of 128 keys than of 64
(ONE_SPLIT_TILES). decode_vs_sdpa (2026-12-03 09:25, CUDA-graph replays) has the split launches whose slices are as
long (8k keys: B = 1 with 32/8 heads at 128k and 16 splits, B = 4 or 32/32 heads at 32k-128k with 4 splits) at
0.97-0.98× SDPA and 88-98 % of the copy bandwidth. Here, at those cells (fp16, D = 128, Lq = 1, a full contiguous
cache), the default tiles against wider ones × numbers of splits around the rule's, and SDPA, in interleaved
rounds (waves.py's sweep): whether the rule should give split launches over slices of ONE_SPLIT_MIN_KEYS keys
or more the wide tiles too (make_plan gave them to unsplit launches only). First run 2026-12-03 11:26 (calls,
default merge): the wide tiles gained most on slices of 32k keys (4 splits of 128k), a little on slices of 8k, and
nothing or less on 4k; since then make_plan gives them to split launches with slices of SPLIT_WIDE_MIN_KEYS (8k)
keys or more.
$OUT/decode_long_slices.json holds every number.
Without a GPU: a dry run of its plumbing at tiny sizes in the interpreter.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import waves  # noqa: E402  (this folder's sweep of tiles × splits)

TILES = [(64, 4, 3), (128, 4, 3), (128, 4, 4), (128, 8, 3), (64, 4, 4)]
# (B, Hkv, S, split choices): keys per split of 2k-32k
CELLS = [(1, 8, 131072, (8, 16, 32)), (4, 8, 131072, (4, 8)), (1, 32, 131072, (4, 8)), (4, 8, 32768, (4, 8)),
         (1, 32, 32768, (4, 8)), (1, 8, 32768, (16, 32)), (4, 8, 16384, (4, 8)), (1, 8, 16384, (16,))]

if __name__ == "__main__":
    sys.exit(waves.run(CELLS, TILES, "decode_long_slices.json", merge=False))
