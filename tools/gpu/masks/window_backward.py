"""GPU probe (issue 30): a sliding window's forward+backward with its backward bound once per problem
(``masking._window_backward``) against the ordinary backward path and FlexAttention, on the H200.

    python tools/gpu/masks/window_backward.py    # about two minutes; summary on stdout, $OUT/window_backward.json

The short windows' forward+backward cells of ``masks_vs_flex`` (a window of 256 keys at N = 16k, D = 64 and 128;
1k keys at D = 64), fp16 and bf16: ours bound, ours through ``_backward`` (the binding switched off), and
FlexAttention, timed in interleaved rounds as the measurement times them; the two of ours' gradients compared (the
same kernels: they must be equal).
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


def unbound(fn):
    from flashattn import masking

    def call():
        before, masking._window_backward = masking._window_backward, lambda *a, **kw: None
        try:
            return fn()
        finally:
            masking._window_backward = before
    return call


def main():
    os.makedirs(OUT, exist_ok=True)
    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    from flashattn import runtime
    from flashattn.measure.measurements import masks

    torch._dynamo.config.cache_size_limit = 256
    flex = torch.compile(flex_attention, dynamic=False)
    state, mods = masks.flex_mask_mods(runtime.DEVICE)
    rows = []
    for window, D in ((256, 64), (256, 128), (1024, 64)):
        p = masks.Problem("window", 16384, window=window)
        for dtype_name in ("float16", "bfloat16"):
            q, k, v, do = masks.inputs(p, D, getattr(torch, dtype_name), runtime.DEVICE, seed=D + p.N)
            fns = masks.kernels(p, runtime.DEVICE, state, mods, flex)
            step = masks.timed(fns["ours"], q, k, v, do, training=True)
            calls = {"bound": step, "ordinary": unbound(step), "flex": masks.timed(fns["flex"], q, k, v, do,
                                                                                    training=True)}
            grads = {name: calls[name]() for name in ("bound", "ordinary")}
            same = all(torch.equal(a, b) for a, b in zip(grads["bound"], grads["ordinary"], strict=True))
            times = masks.interleaved(calls)
            ms = {name: statistics.median(t) for name, t in times.items()}
            row = {"cell": p.label, "D": D, "dtype": dtype_name, "ms": ms, "ms_rounds": times, "same_grads": same,
                   "vs_flex": {name: ms["flex"] / ms[name] for name in ("bound", "ordinary")}}
            rows.append(row)
            log(f"{p.label} D={D} {dtype_name}: bound {ms['bound']:.3f} ms, ordinary {ms['ordinary']:.3f} ms, "
                f"flex {ms['flex']:.3f} ms; ×flex {row['vs_flex']['ordinary']:.2f} -> {row['vs_flex']['bound']:.2f}; "
                f"same gradients: {same}")
            with open(os.path.join(OUT, "window_backward.json"), "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
