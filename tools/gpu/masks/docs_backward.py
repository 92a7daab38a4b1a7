"""GPU probe (issue 30): the packed documents' backward at D = 128 on the H200, where forward+backward stays below
FlexAttention (the Triton window backward's tiles).

    python tools/gpu/masks/docs_backward.py    # summary on stdout; details in $OUT/masks_probe.json, docs_split.json

1. the masks probe's sweep (``probe.py``, phase "sweep") on the documents at N = 16k, D = 128, fp16 and bf16, with
   more dK/dV and dQ tiles than ``masked_backward``'s tables hold (each kernel's tiles varied with the other's
   default), against FlexAttention;
2. where the time goes: a ``torch.profiler`` trace of five forward+backward steps of ours (default tiles) and of
   FlexAttention's, each kernel's GPU time per step.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("PROBE_SHAPES", "1")  # probe.problems()[1]: documents, N = 16k, D = 128
os.environ.setdefault("PROBE_DTYPES", "float16,bfloat16")
os.environ.setdefault("PROBE_PHASES", "sweep")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import probe  # noqa: E402

# (BLOCK_M, BLOCK_N, num_warps, num_stages) beyond the tables (dK/dV: BLOCK_N keys per program, BLOCK_M queries
# per step; dQ: BLOCK_M queries per program)
MORE_DKDV = [(32, 64, 4, 2), (32, 64, 4, 4), (16, 64, 4, 3), (32, 128, 8, 2), (64, 64, 8, 3), (32, 64, 8, 3),
             (16, 128, 8, 2)]
MORE_DQ = [(64, 64, 4, 3), (64, 32, 4, 3), (128, 32, 8, 2), (128, 64, 8, 3), (64, 128, 8, 2)]


def widen():
    from flashattn.kernels import masked_backward

    for table, more in ((masked_backward.DKDV_TILES, MORE_DKDV), (masked_backward.DQ_TILES, MORE_DQ)):
        table[128] = table[128] + [t for t in more if t not in table[128]]


def split(dtype_name: str) -> dict:
    """Each kernel's GPU time per forward+backward step (ms), ours (default tiles) and FlexAttention's."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from flashattn import runtime
    from flashattn.measure.measurements.masks import flex_block_mask

    name, p, D = probe.problems()[1]
    q, k, v, do = probe.make(p, D, dtype_name)
    compiled, state, mods = probe.flex_setup()
    block_mask = flex_block_mask(p, state, mods, runtime.DEVICE)
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    steps = {"ours": lambda: probe.ours(p, q, k, v, do, training=True),
             "flex": lambda: torch.autograd.grad(compiled(*leaves, block_mask=block_mask), leaves, do)}
    result = {}
    for label, step in steps.items():
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        per = {e.key: e.device_time_total / 5e3 for e in prof.key_averages() if e.device_time_total > 0}
        result[label] = dict(sorted(per.items(), key=lambda kv: -kv[1])[:8])
        probe.log(f"  {name} {dtype_name} {label}: " + ", ".join(f"{k[:48]} {t:.3f} ms" for k, t in
                                                             result[label].items()))
    return result


def main():
    widen()
    probe.main()
    if probe.DRY:
        return
    splits = {dt: split(dt) for dt in ("float16", "bfloat16")}
    with open(os.path.join(probe.OUT, "docs_split.json"), "w") as f:
        json.dump(splits, f, indent=1)


if __name__ == "__main__":
    main()
