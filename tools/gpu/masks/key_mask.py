"""GPU probe (issue 30): a key-padding mask on fast's Gluon kernel (``fast_gluon.py``'s KEY_MASK) against the dense
mask's Triton kernel it replaces and FlexAttention, at ``masks_vs_flex``'s padding cells, on the H200.

    python tools/gpu/masks/key_mask.py    # about two minutes; summary on stdout, $OUT/key_mask.json

Each call runs with ``masked.GLUON_KEY_MASK_DIMS`` (the head dimensions that take the Gluon kernel) set to both
(64, 128) ("gluon") and none ("dense"), so one run tells both paths apart (first run 2026-12-04 15:28 UTC; which
head dimensions take it by default, and why, ``masked.py`` says):

1. correctness at full size: the padding problem of ``masks_vs_flex`` (B = 4, 16 heads, N = 16k, lengths from N/4 to
   N, one of them N), fp16 and bf16, D = 64 and 128: the Gluon forward's output and log-sum-exp against the dense
   kernel's, and ours' rows against float64 (``masks.reference_rows``);
2. time: forward, and forward + backward (the backward is the dense mask's Triton kernels either way), of the
   Gluon path, the dense path and FlexAttention (its block mask), in interleaved rounds of do_bench.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from concurrent_dq import patched  # noqa: E402  (tools/gpu/masks/concurrent_dq.py, beside this script)

OUT = os.environ.get("OUT") or "probe_out"


def main():
    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    from flashattn import bench, masking, runtime
    from flashattn.kernels import masked
    from flashattn.measure.measurements import masks
    from flashattn.reference import rel_error

    if runtime.MODE != "gpu":
        print("key_mask.py needs a GPU (the Gluon kernel is Hopper's)")
        return
    os.makedirs(OUT, exist_ok=True)
    torch._dynamo.config.cache_size_limit = 256
    flex = torch.compile(flex_attention, dynamic=False)
    state, mods = masks.flex_mask_mods(runtime.DEVICE)
    p = masks.problems()[-1]
    assert p.kind == "padding", p
    mask = masks.dense_mask(p, runtime.DEVICE)
    rows = []
    for D in (64, 128):
        for dtype_name in ("float16", "bfloat16"):
            dtype = getattr(torch, dtype_name)
            q, k, v, do = masks.inputs(p, D, dtype, runtime.DEVICE, seed=D + p.N)
            fns = masks.kernels(p, runtime.DEVICE, state, mods, flex)
            row = {"cell": p.label, "lengths": list(p.lengths), "D": D, "dtype": dtype_name}
            # 1. correctness
            def forward(q=q, k=k, v=v):
                return masking.masked_forward(q, k, v, attn_mask=mask.expand(*q.shape[:3], p.N))

            o_g, lse_g = patched(forward, masked, "GLUON_KEY_MASK_DIMS", (64, 128))()
            o_d, lse_d = patched(forward, masked, "GLUON_KEY_MASK_DIMS", ())()
            b, sl, ref = masks.reference_rows(p, q, k, v)
            row["rel_error"] = {"gluon vs float64": rel_error(o_g[b, 0, sl], ref),
                                "dense vs float64": rel_error(o_d[b, 0, sl], ref),
                                "gluon vs dense": rel_error(o_g, o_d),
                                "lse gluon vs dense": (lse_g - lse_d).abs().max().item()}
            row["ok"] = row["rel_error"]["gluon vs float64"] < masks.TOLERANCE[dtype_name]
            # 2. time
            calls = {}
            for training in (False, True):
                step = "fwd+bwd" if training else "fwd"
                ours = masks.timed(fns["ours"], q, k, v, do, training)
                calls[f"gluon {step}"] = patched(ours, masked, "GLUON_KEY_MASK_DIMS", (64, 128))
                calls[f"dense {step}"] = patched(ours, masked, "GLUON_KEY_MASK_DIMS", ())
                calls[f"flex {step}"] = masks.timed(fns["flex"], q, k, v, do, training)
            for fn in calls.values():
                fn()
            times = {name: [] for name in calls}
            for _ in range(3):  # interleaved rounds
                for name, fn in calls.items():
                    times[name].append(bench.time_ms(fn, warmup=10, rep=50))
            row["ms"] = {name: statistics.median(t) for name, t in times.items()}
            row["ms_rounds"] = times
            rows.append(row)
            ms = row["ms"]
            print(f"{p.label} D={D} {dtype_name}: ok={row['ok']} {row['rel_error']}")
            for step in ("fwd", "fwd+bwd"):
                print(f"  {step:8} gluon {ms[f'gluon {step}']:.3f} ms  dense {ms[f'dense {step}']:.3f} ms  "
                      f"flex {ms[f'flex {step}']:.3f} ms  | flex/gluon {ms[f'flex {step}'] / ms[f'gluon {step}']:.3f}"
                      f"  flex/dense {ms[f'flex {step}'] / ms[f'dense {step}']:.3f}")
            with open(os.path.join(OUT, "key_mask.json"), "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
