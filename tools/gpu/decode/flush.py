"""GPU probe: how much of a short decoding step's measured time is do_bench's L2 flush (issue 31).

    OUT=... python tools/gpu/decode/flush.py      # about 2 minutes on an H200

``triton.testing.do_bench`` clears the L2 before each timed call by writing zeros over a 256 MB buffer
(``cache.zero_()``). The zeros stay in the L2 as dirty lines; the timed kernel's reads evict them, and every evicted
dirty line is written back to DRAM inside the timed interval. A kernel that reads the cache once then pays, besides
its own bytes, for writing back up to an L2 of someone else's bytes: a fixed cost that weighs on small caches. This
probe times attention_with_kvcache (the rule's splits) and SDPA at cells of decode_vs_sdpa, fp16, D = 128, Lq = 1,
a full contiguous cache, each as a call and as a CUDA-graph replay, in interleaved rounds, with two flushes:

* ``zeros``: do_bench as it is (zeros written: dirty lines left in the L2);
* ``read``: the same do_bench with its flush replaced by a read of the same buffer (its sum, ``bench.l2_flush``):
  the L2 is just as cold, but its lines are clean, and evicting them costs nothing.

Printed per cell: ms and the share of the copy bandwidth of each kernel under each flush, and the ratio to SDPA.
$OUT/decode_flush.json holds every number. Without a GPU: a dry run of the plumbing in the interpreter.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import probe  # noqa: E402  (this folder's probe: its interleaved rounds and log)
from probe import DEV, DRY, OUT, log  # noqa: E402

from flashattn.measure.measurements.decode import (  # noqa: E402
    cache_bytes,
    cuda_graph_replay,
    kernels,
    make_problem,
)

# (B, Hkv, S)
CELLS = [(1, 8, 1024), (1, 8, 4096), (1, 8, 16384), (1, 8, 32768), (1, 8, 131072), (1, 32, 4096), (4, 8, 1024),
         (4, 32, 1024), (4, 32, 4096), (16, 8, 1024), (16, 8, 4096), (16, 32, 32768)]
NAMES = ("flashattn", "sdpa")


def timed(fns: dict, flush: str) -> dict:
    """Median ms of each function, do_bench emptying the L2 by ``flush`` (bench.l2_flush: "zeros" or "read")."""
    probe.FLUSH = flush
    return probe.interleaved(fns)


def main() -> None:
    t0 = time.perf_counter()
    copy = probe.copy_gbps()
    l2 = None if DRY else torch.cuda.get_device_properties(DEV).L2_cache_size
    log(f"copy bandwidth {copy:.0f} GB/s; L2 {l2} bytes")
    rows = []
    for B, Hkv, S in ([(1, 2, 64)] if DRY else CELLS):
        D = 16 if DRY else 128
        cell = dict(dtype="float16", B=B, S=S, Hq=4 * Hkv if DRY else 32, Hkv=Hkv, D=D, Lq=1,
                    cache_bytes=cache_bytes(B, S, Hkv, D, 2))
        p = make_problem(cell, DEV, page_size=16 if DRY else 256)
        fns = {n: f for n, f in kernels(p).items() if n in NAMES}
        for f in fns.values():
            f()
        if not DRY:
            fns.update({(n, "graph"): cuda_graph_replay(f) for n, f in list(fns.items())})
        row = {**cell}
        for flush in ("zeros", "read"):
            ms = timed(fns, flush)
            row[flush] = {" ".join(n) if isinstance(n, tuple) else n: t for n, t in ms.items()}
        rows.append(row)
        parts = []

        def share(t, cell=cell):
            return cell["cache_bytes"] / (t * 1e-3) / 1e9 / copy

        for flush in ("zeros", "read"):
            for how in ("",) if DRY else ("", " graph"):
                ours, sdpa = row[flush]["flashattn" + how], row[flush]["sdpa" + how]
                parts.append(f"{flush}{how or ' call'}: {ours * 1e3:.1f}/{sdpa * 1e3:.1f} us "
                             f"{share(ours):.0%}/{share(sdpa):.0%} x{sdpa / ours:.2f}")
        log(f"B{B} {32 if not DRY else cell['Hq']}/{Hkv} S{S}: " + " | ".join(parts))
        del p, fns
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "decode_flush.json").write_text(json.dumps({"copy_gbps": copy, "l2_bytes": l2, "rows": rows,
                                                       "seconds": time.perf_counter() - t0, "log": probe.LOG},
                                                      indent=1))


if __name__ == "__main__":
    main()
