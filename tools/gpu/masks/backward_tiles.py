"""GPU probe (issue 30): the masked backward's tiles on the cells where it trails FlexAttention, on the H200.

    python tools/gpu/masks/backward_tiles.py    # about three minutes; summary on stdout, $OUT/backward_tiles.json

The forward+backward cells of ``masks_vs_flex`` below 1.0x FlexAttention that run the window kernels' backward (a
window of 256 keys at N = 16k, D = 64 and 128; packed documents at N = 16k, D = 128), fp16 and bf16: our forward and
backward with each (dK/dV, dQ) tile pair of a wider set than the tables' (``probe.ours``, the kernels called
directly), the drop-in's own step (its default tiles, bound where it binds) and FlexAttention, in interleaved rounds;
then each kernel's GPU time in one step of the default tiles and of the fastest pair (torch.profiler), beside
FlexAttention's.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe  # noqa: E402  (tools/gpu/masks/probe.py, beside this script: make, ours, rounds)

OUT = probe.OUT
T0 = time.time()
DKDV = {64: [(32, 64, 4, 3), (64, 64, 4, 3), (32, 64, 4, 2), (16, 64, 4, 3), (32, 32, 4, 3), (64, 128, 8, 3),
             (32, 128, 4, 3), (64, 64, 8, 3)],
        128: [(32, 64, 4, 3), (64, 64, 4, 3), (32, 64, 4, 2), (16, 64, 4, 3), (64, 128, 8, 2), (32, 128, 8, 2),
              (64, 64, 8, 2)]}
DQ = {64: [(64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (32, 64, 4, 3), (64, 128, 4, 3), (128, 128, 8, 3)],
      128: [(64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3), (32, 64, 4, 3), (64, 64, 8, 2), (128, 32, 8, 2)]}


def log(*args):
    print(f"[{time.time() - T0:6.1f}s]", *args, flush=True)


def kernel_ms(fn, steps: int = 5) -> dict:
    """Each CUDA kernel's GPU time per step (ms), the eight longest, from ``torch_profile`` over ``steps`` calls."""
    from flashattn.measure.profile import torch_profile

    kernels = [r for r in torch_profile({"step": fn}, repeat=steps) if r["kind"] == "kernel"]
    return {r["name"][:90]: r["self_device_ms"] / steps for r in kernels[:8]}


def one_cell(p, D, dtype_name, flex) -> dict:
    from flashattn import runtime
    from flashattn.measure.measurements import masks

    compiled, state, mods = flex
    q, k, v, do = probe.make(p, D, dtype_name)
    fns = masks.kernels(p, runtime.DEVICE, state, mods, compiled)
    calls = {"flex": masks.timed(fns["flex"], q, k, v, do, training=True),
             "drop-in": masks.timed(fns["ours"], q, k, v, do, training=True, packed_args=masks.takes_packed(p, "ours"))}
    dkdv0, dq0 = DKDV[D][0], DQ[D][0]
    pairs = [(t, dq0) for t in DKDV[D]] + [(dkdv0, t) for t in DQ[D][1:]]
    for dkdv, dq in pairs:
        calls[f"dkdv {dkdv} dq {dq}"] = functools.partial(probe.ours, p, q, k, v, do, None, dkdv, dq, training=True)
    calls = probe.first_calls(calls, f"{p.label} D={D} {dtype_name}")
    ms = probe.rounds(calls)
    row = {"cell": p.label, "D": D, "dtype": dtype_name, "ms": ms,
           "vs_flex": {name: ms["flex"] / t for name, t in ms.items() if name != "flex"}}
    ours = {name: t for name, t in ms.items() if name.startswith("dkdv")}
    best = min(ours, key=ours.get)
    row["best"], row["default"] = best, f"dkdv {dkdv0} dq {dq0}"
    row["kernels_ms"] = {name: kernel_ms(calls[name]) for name in ("flex", row["default"], best)}
    log(f"{p.label} D={D} {dtype_name}: flex {ms['flex']:.3f} ms, drop-in {ms['drop-in']:.3f} "
        f"(x flex {row['vs_flex']['drop-in']:.2f}); default {ms[row['default']]:.3f}; best {best} {ms[best]:.3f} "
        f"(x flex {row['vs_flex'][best]:.2f})")
    for name, kms in row["kernels_ms"].items():
        log(f"    {name}: " + "; ".join(f"{k} {t:.3f}" for k, t in kms.items()))
    return row


def main():
    from flashattn.measure.measurements.masks import Problem, document_lengths

    os.makedirs(OUT, exist_ok=True)
    flex = probe.flex_setup()
    cells = [(Problem("window", 16384, window=256), 64), (Problem("window", 16384, window=256), 128),
             (Problem("documents", 16384, lengths=document_lengths(16384)), 128)]
    rows = []
    for p, D in cells:
        for dtype_name in ("float16", "bfloat16"):
            rows.append(one_cell(p, D, dtype_name, flex))
            with open(os.path.join(OUT, "backward_tiles.json"), "w") as f:
                json.dump(rows, f, indent=1)
    gains = [r["ms"][r["default"]] / r["ms"][r["best"]] for r in rows]
    log(f"best over default: geomean {statistics.geometric_mean(gains):.3f}; total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()
