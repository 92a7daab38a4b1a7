"""GPU probe (issue 30): the host's time per call of a short window's forward and training step, on the H200.

    python tools/gpu/masks/window_host.py    # about a minute; summary on stdout, $OUT/window_host.json

A window of 256 keys at N = 16k (B 1, 16 heads; fp16 and bf16, D = 64 and 128), the cells of ``masks_vs_flex``
whose GPU work (``backward_tiles.py`` profiles it) can be shorter than the host's: per call, the host's
time (``thread_probe.per_call_us``: calls back to back, the GPU not waited for) and the timed one (do_bench), of
the forward without autograd, the forward on leaves, and the training step (``masks.timed``), each with the forward
prepared once per problem (``masking._window_forward``) and through the ordinary path, and FlexAttention's.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "gpu", "operator"))
from concurrent_dq import patched  # noqa: E402  (tools/gpu/masks/concurrent_dq.py, beside this script)
from thread_probe import per_call_us  # noqa: E402  (tools/gpu/operator/thread_probe.py)

OUT = os.environ.get("OUT") or "probe_out"


def ordinary(fn):
    from flashattn import masking

    return patched(fn, masking, "_window_forward", lambda *a, **kw: None)


def main():
    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention
    from triton.testing import do_bench

    from flashattn import runtime
    from flashattn.measure.measurements import masks

    os.makedirs(OUT, exist_ok=True)
    torch._dynamo.config.cache_size_limit = 256
    flex = torch.compile(flex_attention, dynamic=False)
    state, mods = masks.flex_mask_mods(runtime.DEVICE)
    p, rows = masks.Problem("window", 16384, window=256), []
    for D in (64, 128):
        for dtype_name in ("float16", "bfloat16"):
            q, k, v, do = masks.inputs(p, D, getattr(torch, dtype_name), runtime.DEVICE, seed=D + p.N)
            fns = masks.kernels(p, runtime.DEVICE, state, mods, flex)
            ours = fns["ours"]
            leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
            step = masks.timed(ours, q, k, v, do, training=True)
            calls = {"forward": masks.timed(ours, q, k, v, do, training=False),
                     "forward on leaves": lambda ours=ours, leaves=leaves: ours(*leaves),
                     "step": step,
                     "flex forward": masks.timed(fns["flex"], q, k, v, do, training=False),
                     "flex step": masks.timed(fns["flex"], q, k, v, do, training=True)}
            for name in ("forward", "forward on leaves", "step"):
                calls[f"{name}, ordinary"] = ordinary(calls[name])
            for fn in calls.values():
                fn()
            torch.cuda.synchronize()
            host = {name: [] for name in calls}
            timed = {name: [] for name in calls}
            for _ in range(3):  # rounds, interleaved (the host's speed drifts)
                for name, fn in calls.items():
                    host[name].append(per_call_us(fn))
                    timed[name].append(do_bench(fn, warmup=10, rep=50, return_mode="median"))
            row = {"cell": p.label, "D": D, "dtype": dtype_name,
                   "host_us": {n: statistics.median(t) for n, t in host.items()},
                   "ms": {n: statistics.median(t) for n, t in timed.items()}, "host_us_rounds": host,
                   "ms_rounds": timed}
            rows.append(row)
            print(f"{p.label} D={D} {dtype_name}:")
            for name in calls:
                print(f"  {name:28} host {row['host_us'][name]:7.1f} us   timed {row['ms'][name]:.3f} ms")
            with open(os.path.join(OUT, "window_host.json"), "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
