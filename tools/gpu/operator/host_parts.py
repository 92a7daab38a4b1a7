"""The pieces of the fast backward's host time, each timed alone (issue 28, point 4), on the GPU.

    python tools/gpu/operator/host_parts.py     # seconds on an H200; prints, writes $OUT/host_parts.json

B 16, H 16, N 1024, D 64, causal, fp16 and bf16: median µs per call (``thread_probe.per_call_us``) of one
allocation, one descriptor rebased and encoded (what Triton's launcher does with each of the Gluon backward's
seven), the backward's problem key, its three bound launches, and the whole backward called directly; on the main
thread and on a thread of its own (the autograd engine runs a CUDA backward on one). Stop 48 also tried a launch
through Triton's C launcher alone, without its Python steps, and found no measurable saving (its closing note has
the run), so the course keeps Triton's launcher.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import triton  # noqa: E402
from thread_probe import on_thread, per_call_us  # noqa: E402  (tools/gpu/operator/thread_probe.py, beside this)

from flashattn import runtime  # noqa: E402
from flashattn.kernels import descriptors, fast, fast_backward, fast_backward_gluon  # noqa: E402


def pieces(q, k, v, do) -> dict:
    o, lse = fast.attention_fast(q, k, v, causal=True, return_lse=True)
    delta = fast_backward.delta_rows(o, do)
    sums = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    desc = descriptors.gluon_heads(q, 64, False)
    utils, driver = triton.runtime.driver.active.utils, triton.runtime.driver.active
    encode = (3, 2, 6, [64, 64], list(desc.shape), list(desc.strides), 0)  # swizzle, bytes, dtype, tile, ...
    delta_run = fast_backward.bind_delta(o, do, sums)
    finish = fast_backward.bind_finish(q.numel(), q.dtype, 0.125)
    bwd = fast_backward_gluon.bind(q, k, v, lse, do, delta, causal=True, scale=q.shape[-1] ** -0.5)
    for run in (lambda: delta_run(o, do, sums), lambda: finish(sums), lambda: bwd(q, k, v, lse, do, delta, sums)):
        run()
    fns = {
        "torch.empty (B,H,N,D)": lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device),
        "descriptor rebase": lambda: descriptors.rebase(desc, q),
        "descriptor encode (fill_tma_descriptor)": lambda: utils.fill_tma_descriptor(q.data_ptr(), *encode),
        "current device and stream": lambda: driver.get_current_stream(driver.get_current_device()),
        "problem_key (6 tensors)": lambda: fast_backward.problem_key(q, k, v, o, lse, do, True, None, {}),
        "delta launch (bound, with its allocation)": lambda: delta_run(o, do, sums),
        "Gluon backward launch (bound: 2 allocations, 7 descriptors)": lambda: bwd(q, k, v, lse, do, delta, sums),
        "dQ finish launch (bound, with its allocation)": lambda: finish(sums),
        "backward called directly": lambda: fast_backward.attention_backward_fast(q, k, v, o, lse, do, causal=True),
    }
    return {"main": {name: per_call_us(fn) for name, fn in fns.items()},
            "thread": {name: on_thread(lambda fn=fn: per_call_us(fn)) for name, fn in fns.items()}}


def main() -> None:
    result = {"triton": triton.__version__, "torch": torch.__version__}
    B, H, N, D = 16, 16, 1024, 64
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=1)
        do = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=2)[0]
        result[str(dtype)] = row = pieces(q, k, v, do)
        for name in row["main"]:
            print(f"{str(dtype):15} {name:62} main {row['main'][name]:7.2f} µs  thread {row['thread'][name]:7.2f} µs")
    with open(os.path.join(os.environ.get("OUT", "."), "host_parts.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
