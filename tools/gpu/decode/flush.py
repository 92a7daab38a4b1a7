"""GPU probe: how much of a short decoding step's measured time is do_bench's L2 flush (issue 31).

    OUT=... python tools/gpu/decode/flush.py      # about 2 minutes on an H200

``triton.testing.do_bench`` clears the L2 before each timed call by writing zeros over a 256 MB buffer
(``cache.zero_()``). The zeros stay in the L2 as dirty lines; the timed kernel's reads evict them, and every evicted
dirty line is written back to DRAM inside the timed interval. A kernel that reads the cache once then pays, besides
its own bytes, for writing back up to an L2 of someone else's bytes: a fixed cost that weighs on small caches. This
probe times attention_with_kvcache (the rule's splits) and SDPA at cells of decode_vs_sdpa, fp16, D = 128, Lq = 1,
a full contiguous cache, each as a call and as a CUDA-graph replay (``decode.flush_effect``, once for each), with
two flushes in interleaved rounds:

* ``zeros``: do_bench as it is (zeros written: dirty lines left in the L2);
* ``read``: the same do_bench with its flush replaced by a read of the same buffer (its sum, ``bench.l2_flush``):
  the L2 is just as cold, but its lines are clean, and evicting them costs nothing.

Its first run (2026-12-04, the numbers beside ``decode.FLUSH``) timed calls and replays in one set of rounds, with
its own loop; it reads ``flush_effect`` since, as ``decode_vs_sdpa`` does. Printed per cell: ms and the share of
the copy bandwidth of each kernel under each flush, and the ratio to SDPA.
$OUT/decode_flush.json holds every number. Without a GPU: a dry run of the plumbing in the interpreter.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import probe  # noqa: E402  (this folder's probe: its rounds, copy bandwidth and log)
from probe import DEV, DRY, OUT, log  # noqa: E402

from flashattn.measure.measurements.decode import cuda_graph_replay, flush_effect, gpu_timer  # noqa: E402

# (B, Hkv, S)
CELLS = [(1, 8, 1024), (1, 8, 4096), (1, 8, 16384), (1, 8, 32768), (1, 8, 131072), (1, 32, 4096), (4, 8, 1024),
         (4, 32, 1024), (4, 32, 4096), (16, 8, 1024), (16, 8, 4096), (16, 32, 32768)]


def main() -> None:
    t0 = time.perf_counter()
    copy = probe.copy_gbps()
    l2 = None if DRY else torch.cuda.get_device_properties(DEV).L2_cache_size
    log(f"copy bandwidth {copy:.0f} GB/s; L2 {l2} bytes")
    timers = {flush: probe.timer if DRY else functools.partial(gpu_timer, flush=flush) for flush in ("zeros", "read")}
    cells, D, page = ([(1, 2, 64)], 16, 16) if DRY else (CELLS, 128, 256)
    ways = {"call": None} if DRY else {"call": None, "graph": cuda_graph_replay}
    rows = {way: flush_effect(cells, "float16", device=DEV, copy_gbps=copy, timers=timers, rounds=probe.ROUNDS,
                              D=D, page_size=page, capture=capture) for way, capture in ways.items()}
    for i, (B, Hkv, S) in enumerate(cells):
        parts = []
        for flush in timers:
            for way in ways:
                r = rows[way][i]
                ours, sdpa = r["ms"][flush]["flashattn"], r["ms"][flush]["sdpa"]
                parts.append(f"{flush} {way}: {ours * 1e3:.1f}/{sdpa * 1e3:.1f} us {r['share'][flush]['flashattn']:.0%}"
                             f"/{r['share'][flush]['sdpa']:.0%} x{sdpa / ours:.2f}")
        log(f"B{B} 32/{Hkv} S{S}: " + " | ".join(parts))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "decode_flush.json").write_text(json.dumps({"copy_gbps": copy, "l2_bytes": l2, "rows": rows,
                                                       "seconds": time.perf_counter() - t0, "log": probe.LOG},
                                                      indent=1))


if __name__ == "__main__":
    main()
