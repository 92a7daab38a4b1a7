"""Why the drop-in's backward costs the host more inside autograd than called directly (issue 28, point 4).

    python tools/gpu/operator/thread_probe.py     # seconds on an H200; prints, and writes $OUT/thread_probe.json

The autograd engine runs a CUDA node's backward on its own device thread. This times, per call (median of 200):
the fast backward called on the main thread, on a Python thread of its own, and inside ``torch.autograd.grad``
(with the stages of the call stamped: before ``grad``, entering the backward, leaving it, after ``grad``), and a
few torch and Triton calls alone on each thread, to find which of them is slower there.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch.autograd.function import once_differentiable  # noqa: E402

from flashattn import ops, runtime  # noqa: E402
from flashattn.kernels import fast_backward  # noqa: E402
from flashattn.kernels.fast import attention_fast  # noqa: E402

CALLS = 200


def per_call_us(fn, calls=CALLS) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def on_thread(fn):
    box = {}

    def target():
        torch.cuda.set_device(0)  # a new thread has no current CUDA context (the engine's threads set theirs)
        box.update(us=fn())

    t = threading.Thread(target=target)
    t.start()
    t.join()
    return box["us"]


class SavesFive(torch.autograd.Function):
    """The drop-in's autograd shape (3 inputs, 5 saved tensors, o and a non-differentiable lse), its backward
    returning gradients made beforehand: the autograd engine and a Python backward node alone."""

    @staticmethod
    def forward(ctx, q, k, v, o, lse, grads):
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.grads = grads
        ctx.mark_non_differentiable(lse)
        return o.view_as(o), lse.view_as(lse)

    @staticmethod
    def backward(ctx, do, _dlse):
        return (*ctx.grads, None, None, None)


class OneOut(torch.autograd.Function):
    """As SavesFive, with one output (o) and lse kept on ctx (not an input or output)."""

    @staticmethod
    def forward(ctx, q, k, v, o, lse, grads):
        out = o.view_as(o)
        ctx.save_for_backward(q, k, v, out)
        ctx.lse, ctx.grads = lse, grads
        return out

    @staticmethod
    def backward(ctx, do):
        return (*ctx.grads, None, None, None)


class OneOutOnce(OneOut):
    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        return (*ctx.grads, None, None, None)


def variants(leaves, do, o, lse) -> dict:
    from flashattn.functional import scaled_dot_product_attention
    from flashattn.measure.measurements.host import host_us

    grads = tuple(torch.empty_like(t) for t in leaves)
    fns = {
        "drop-in step": lambda: torch.autograd.grad(scaled_dot_product_attention(*leaves, is_causal=True), leaves, do),
        "SDPA step": lambda: torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
            *leaves, is_causal=True), leaves, do),
        "engine only (5 saved, no kernels)": lambda: torch.autograd.grad(
            SavesFive.apply(*leaves, o, lse, grads)[0], leaves, do),
        "engine only, one output": lambda: torch.autograd.grad(OneOut.apply(*leaves, o, lse, grads), leaves, do),
        "engine only, one output, once_differentiable": lambda: torch.autograd.grad(
            OneOutOnce.apply(*leaves, o, lse, grads), leaves, do),
        "forward only, 5 saved": lambda: SavesFive.apply(*leaves, o, lse, grads),
        "forward only, one output": lambda: OneOut.apply(*leaves, o, lse, grads),
    }
    out = {name: host_us(fn) for name, fn in fns.items()}
    with torch.autograd.set_multithreading_enabled(False):
        out |= {f"{name}, multithreading off": host_us(fn) for name, fn in fns.items()}
    return out


def main() -> None:
    B, H, N, D = 16, 16, 1024, 64
    dtype = torch.bfloat16
    q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=1)
    do = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=2)[0]
    o, lse = attention_fast(q, k, v, causal=True, return_lse=True)
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    small = {
        "torch.empty": lambda: torch.empty((B, H, N, D), dtype=dtype, device="cuda"),
        "torch.zeros": lambda: torch.zeros((B, H, N, D), dtype=torch.float32, device="cuda"),
        "current_stream": lambda: torch.cuda.current_stream(),
        "backward direct": lambda: fast_backward.attention_backward_fast(q, k, v, o, lse, do, causal=True),
        "problem_key": lambda: fast_backward.problem_key(q, k, v, o, lse, do, True, None, {}),
    }
    for fn in small.values():
        fn()
    result = {"main": {name: per_call_us(fn) for name, fn in small.items()},
              "thread": {name: on_thread(lambda fn=fn: per_call_us(fn)) for name, fn in small.items()}}

    stamps = []
    original = ops._FastForward.backward

    def stamped(ctx, *grads):
        stamps.append(("enter", time.perf_counter()))
        t_parts = {}
        tq = time.perf_counter()
        saved = ctx.saved_tensors
        t_parts["saved_tensors"] = time.perf_counter() - tq
        tq = time.perf_counter()
        for _ in range(3):
            torch.empty((4,), device="cuda")
        t_parts["3 empty"] = time.perf_counter() - tq
        tq = time.perf_counter()
        key = fast_backward.problem_key(*saved, grads[0], ctx.causal, ctx.scale, {})
        t_parts["problem_key"] = time.perf_counter() - tq
        tq = time.perf_counter()
        run = fast_backward._PREPARED.get(key)
        t_parts["lookup"] = time.perf_counter() - tq
        tq = time.perf_counter()
        out = run(*saved, grads[0]) if run is not None else original(ctx, *grads)[:3]
        t_parts["run"] = time.perf_counter() - tq
        stamps.append(("parts", t_parts))
        stamps.append(("exit", time.perf_counter()))
        return (*out, None, None, None)

    def step():
        stamps.append(("call", time.perf_counter()))
        (o2,) = (ops._FastForward.apply(*leaves, True, None, "")[0],)
        stamps.append(("forward done", time.perf_counter()))
        torch.autograd.grad(o2, leaves, do)
        stamps.append(("return", time.perf_counter()))

    step()
    ops._FastForward.backward = staticmethod(stamped)
    try:
        step()
        stamps.clear()
        for _ in range(CALLS):
            step()
        torch.cuda.synchronize()
    finally:
        ops._FastForward.backward = staticmethod(original)
    gaps = {"forward": [], "grad until backward": [], "backward body": [], "after backward": []}
    parts = {}
    i = 0
    while i + 5 < len(stamps):
        (a, t_call), (_, t_fwd), (_, t_enter), (_, p), (_, t_exit), (_, t_ret) = stamps[i:i + 6]
        assert a == "call", stamps[i]
        gaps["forward"].append(t_fwd - t_call)
        gaps["grad until backward"].append(t_enter - t_fwd)
        gaps["backward body"].append(t_exit - t_enter)
        gaps["after backward"].append(t_ret - t_exit)
        for name, value in p.items():
            parts.setdefault(name, []).append(value)
        i += 6
    result["variants_host_us"] = variants(leaves, do, o, lse)
    result["step_stages_us"] = {name: statistics.median(v) * 1e6 for name, v in gaps.items()}
    result["backward_parts_us"] = {name: statistics.median(v) * 1e6 for name, v in parts.items()}
    print(json.dumps(result, indent=1))
    with open(os.path.join(os.environ.get("OUT", "."), "thread_probe.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
