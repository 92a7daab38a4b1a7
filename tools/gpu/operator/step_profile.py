"""Where a model's step on the drop-in spends the time that SDPA's does not (issue 28): ``model_step_vs_sdpa``'s
cells with heads of 128 sit 0.1-0.9 % below SDPA's step (12-05 05:43), while the attention kernels alone, forward and
backward, differ by about 0.15 % of that step (fast_backward_vs_sdpa, 12-01). This probe traces both models' steps
with ``torch.profiler`` and sums each GPU kernel's time per step, so that the difference is found kernel by kernel.

    OUT=... python tools/gpu/operator/step_profile.py      # about 2 minutes on an H200; $OUT/step_profile.json

For each cell (``model_step``'s GPT: 4 layers, d_model 2048 with 16 heads of 128, causal, B·N = 16384, eager, bf16
and fp16 autocast, N = 2048 and 4096): the flashattn model and the torch model (the same weights), each warmed up,
then ``STEPS`` steps traced in turn (a, b, a, b, ...). Per model: the GPU time per step (the sum of every kernel's),
the attention's share (the kernels the other model does not launch), and the kernels both launch, side by side. The
largest differences are printed. Without a GPU: a dry run at a toy size in the interpreter (CPU time, no kernels).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from flashattn import runtime  # noqa: E402
from flashattn.measure.measurements.model_step import make_step  # noqa: E402
from flashattn.measure.measurements.training import ATTENTIONS, make_model  # noqa: E402
from flashattn.models.gpt import GPTConfig  # noqa: E402

GPU = runtime.MODE == "gpu"
STEPS = 3 if GPU else 1
TOKENS = 16384 if GPU else 64
CELLS = [(2048, 16, N, dtype) for N in (2048, 4096) for dtype in ("bfloat16", "float16")] if GPU else \
    [(32, 2, 32, "float32")]


def kernel_times(prof) -> dict[str, float]:
    """Each GPU kernel's (on the CPU: each operator's own) total time in the trace, in µs."""
    times = defaultdict(float)
    for event in prof.key_averages():
        if GPU:
            us = getattr(event, "self_device_time_total", None)
            if us is None:
                us = event.self_cuda_time_total
            if us > 0 and event.device_type == torch.autograd.DeviceType.CUDA:
                times[event.key] += us
        elif event.self_cpu_time_total > 0:
            times[event.key] += event.self_cpu_time_total
    return dict(times)


def profile_cell(d_model: int, n_heads: int, N: int, dtype_name: str) -> dict:
    device = runtime.DEVICE
    config = GPTConfig(256, N, n_layers=4 if GPU else 1, n_heads=n_heads, d_model=d_model)
    B = TOKENS // N
    data = torch.randint(0, 256, (B, N + 1), generator=torch.Generator().manual_seed(N)).to(device)
    dtype = getattr(torch, dtype_name)
    steps = {name: make_step(make_model(config, fn, 0, device), data, dtype, device) for name, fn in ATTENTIONS.items()}
    for step in steps.values():  # tune, compile and warm the allocator outside the trace
        for _ in range(3):
            step()
    if GPU:
        torch.cuda.synchronize()
    totals = {name: defaultdict(float) for name in steps}
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if GPU else [])
    for _ in range(STEPS):
        for name, step in steps.items():  # in turn, so that both meet the same clock
            with torch.profiler.profile(activities=activities) as prof:
                step()
                if GPU:
                    torch.cuda.synchronize()
            for key, us in kernel_times(prof).items():
                totals[name][key] += us / STEPS
    ours, theirs = totals["flashattn"], totals["torch"]
    shared = sorted(set(ours) & set(theirs), key=lambda k: -abs(ours[k] - theirs[k]))
    only = {name: {k: us for k, us in sorted(t.items(), key=lambda kv: -kv[1]) if k not in shared}
            for name, t in totals.items()}
    row = {"d_model": d_model, "n_heads": n_heads, "N": N, "B": B, "dtype": dtype_name,
           "us_per_step": {name: sum(t.values()) for name, t in totals.items()},
           "only_us": {name: sum(o.values()) for name, o in only.items()}, "only": only,
           "shared": {k: {"flashattn": ours[k], "torch": theirs[k]} for k in shared}}
    total = row["us_per_step"]
    print(f"d_model={d_model} {n_heads} heads N={N} B={B} {dtype_name}: GPU µs per step flashattn "
          f"{total['flashattn']:.0f}, torch {total['torch']:.0f} "
          f"(torch / flashattn {total['torch'] / total['flashattn']:.4f}); "
          f"kernels only one model launches: flashattn {row['only_us']['flashattn']:.0f}, "
          f"torch {row['only_us']['torch']:.0f}", flush=True)
    for name, kernels in only.items():
        for key, us in list(kernels.items())[:6]:
            print(f"    only {name}: {us:9.1f} µs  {key[:110]}", flush=True)
    for key in shared[:10]:
        print(f"    both: flashattn {ours[key]:9.1f} µs, torch {theirs[key]:9.1f} µs  {key[:100]}", flush=True)
    return row


def main() -> None:
    out_dir = os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    print(runtime.describe(), flush=True)
    t0 = time.perf_counter()
    rows = []
    for cell in CELLS:
        rows.append(profile_cell(*cell))
        if GPU:
            torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "step_profile.json"), "w") as f:
        json.dump({"steps": STEPS, "tokens": TOKENS, "rows": rows, "seconds": time.perf_counter() - t0}, f, indent=1)
    print(f"{len(rows)} cells in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
