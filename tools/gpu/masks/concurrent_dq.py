"""GPU probe (issue 30): masked attention's dQ kernel on a second stream beside the dK/dV kernel
(``masked_backward.CONCURRENT_DQ``), against the two one after the other, on the H200.

    python tools/gpu/masks/concurrent_dq.py    # summary on stdout; details in $OUT/concurrent_dq.json

For some cells of ``masks_vs_flex`` (documents, windows, padding; fp16 and bf16), forward+backward: ours with the
kernels in turn, ours with dQ beside dK/dV, and FlexAttention (torch.compile'd, BlockMask built once), timed in
interleaved rounds as the measurement times them; the gradients of both of ours compared (the same kernels: they
must be equal).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT") or "probe_out"
T0 = time.time()


def log(*args):
    print(f"[{time.time() - T0:6.1f}s]", *args, flush=True)


def cells():
    from flashattn.measure.measurements.masks import Problem, document_lengths, padding_lengths

    return [(Problem("documents", 16384, lengths=document_lengths(16384)), 128),
            (Problem("documents", 65536, lengths=document_lengths(65536)), 128),
            (Problem("documents", 16384, lengths=document_lengths(16384)), 64),
            (Problem("window", 16384, window=256), 128),
            (Problem("window", 16384, window=1024), 64),
            (Problem("padding", 16384, B=4, lengths=padding_lengths(4, 16384)), 128)]


def with_flag(fn, on: bool):
    from flashattn.kernels import masked_backward

    def call():
        before, masked_backward.CONCURRENT_DQ = masked_backward.CONCURRENT_DQ, on
        try:
            return fn()
        finally:
            masked_backward.CONCURRENT_DQ = before
    return call


def main():
    os.makedirs(OUT, exist_ok=True)
    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    from flashattn import runtime
    from flashattn.measure.measurements import masks
    from flashattn.reference import rel_error

    torch._dynamo.config.cache_size_limit = 256
    flex = torch.compile(flex_attention, dynamic=False)
    state, mods = masks.flex_mask_mods(runtime.DEVICE)
    rows = []
    for p, D in cells():
        for dtype_name in ("float16", "bfloat16"):
            q, k, v, do = masks.inputs(p, D, getattr(torch, dtype_name), runtime.DEVICE, seed=D + p.N)
            fns = masks.kernels(p, runtime.DEVICE, state, mods, flex)
            step = masks.timed(fns["ours"], q, k, v, do, training=True)
            calls = {"in turn": with_flag(step, False), "beside": with_flag(step, True),
                     "flex": masks.timed(fns["flex"], q, k, v, do, training=True)}
            grads = {name: calls[name]() for name in calls}
            same = max(rel_error(a, b) for a, b in zip(grads["in turn"], grads["beside"], strict=True))
            times = masks.interleaved(calls)
            ms = {name: statistics.median(t) for name, t in times.items()}
            row = {"cell": p.label, "D": D, "dtype": dtype_name, "ms": ms, "ms_rounds": times,
                   "grads_beside_vs_in_turn": same,
                   "vs_flex": {name: ms["flex"] / ms[name] for name in ("in turn", "beside")}}
            rows.append(row)
            log(f"{p.label} D={D} {dtype_name}: in turn {ms['in turn']:.3f} ms, beside {ms['beside']:.3f} ms, "
                f"flex {ms['flex']:.3f} ms; ×flex {row['vs_flex']['in turn']:.2f} -> {row['vs_flex']['beside']:.2f}; "
                f"grads differ by {same:.1e}")
            with open(os.path.join(OUT, "concurrent_dq.json"), "w") as f:
                json.dump(rows, f, indent=1)
    gains = [r["ms"]["in turn"] / r["ms"]["beside"] for r in rows]
    log(f"beside / in turn: geomean speed-up {statistics.geometric_mean(gains):.3f}, "
        f"min {min(gains):.3f}, max {max(gains):.3f}; total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()
