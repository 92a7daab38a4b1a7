"""What one call of the drop-in costs the host, layer by layer (notebook 13), measured live on any machine.

Inside ``launch_cache.capturing()`` the kernels' launches are recorded instead of run, so what is timed is the
host's Python alone: the checks, the options, the allocation of the outputs, the operator's dispatch and the
autograd bookkeeping, everything but the launch itself (and the GPU's work). Each layer is one function of no
arguments, timed back to back in interleaved rounds (median microseconds per call):

* ``kernel function``: ``attention_fast(..., return_lse=True)``, the launcher called directly;
* ``operator``: ``torch.ops.flashattn.fast_forward`` (``flashattn.ops``: ``torch.library.Library``), which adds
  the dispatcher and the autograd kernel that saves what the backward needs;
* ``custom_op``: the same operator made with the ``@torch.library.custom_op`` decorator (a twin registered
  here, under the namespace ``flashattn_host_cost``, only to compare the two ways of registering);
* ``autograd.Function``: the same forward through ``functional._Attention``, a plain ``torch.autograd.Function``
  (what the drop-in used before it was an operator, and what ``v2`` still uses: invisible to ``torch.compile``);
* ``eager autograd (the drop-in)``: ``ops._Eager``, what the drop-in calls in eager mode: the kernel function in
  an autograd node of its own with one output (the log-sum-exp saved, not returned);
* ``forward + backward (operator)``: a training step's attention through the operator and ``backward``.

On the GPU the launch adds Triton's launcher (``launch_cache`` keeps it to the compiled kernel's own call);
the recorded measurement ``host_time`` times the whole call there.
"""

from __future__ import annotations

import statistics
import time

import torch

from flashattn import functional, ops
from flashattn.kernels import fast, launch_cache

_TWIN = None


def _custom_op_twin():
    """``fast_forward`` and ``fast_backward`` registered again with ``@torch.library.custom_op``."""
    global _TWIN
    if _TWIN is not None:
        return _TWIN

    @torch.library.custom_op("flashattn_host_cost::fast_forward", mutates_args=())
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
                options: str) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.fast_forward(q, k, v, causal, scale, options)

    forward.register_fake(ops._fast_forward_fake)

    @torch.library.custom_op("flashattn_host_cost::fast_backward", mutates_args=())
    def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 do: torch.Tensor, causal: bool, scale: float | None,
                 options: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return ops.fast_backward_kernel(q, k, v, o, lse, do, causal, scale, options)

    backward.register_fake(ops._fast_backward_fake)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3], *output)
        ctx.causal, ctx.scale = inputs[3], inputs[4]
        ctx.mark_non_differentiable(output[1])

    def grad(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        return (*backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, ""), None, None, None)

    forward.register_autograd(grad, setup_context=setup_context)
    _TWIN = forward
    return _TWIN


def layers(q, k, v, causal: bool = True) -> dict:
    """The functions :func:`host_us` times, by name (see the module docstring); q, k, v require gradients."""
    twin = _custom_op_twin()
    return {
        "kernel function": lambda: fast.attention_fast(q, k, v, causal=causal, return_lse=True),
        "operator": lambda: ops.FORWARD(q, k, v, causal, None, ""),
        "custom_op": lambda: twin(q, k, v, causal, None, ""),
        "autograd.Function": lambda: functional._Attention.apply(q, k, v, "fast", causal, None, {}),
        "eager autograd (the drop-in)": lambda: ops._Eager.apply(q, k, v, causal, None, {}),
        "forward + backward (operator)": lambda: ops.FORWARD(q, k, v, causal, None, "")[0].backward(q),
    }


def host_us(fns: dict, calls: int = 100, rounds: int = 5) -> dict:
    """Median host microseconds per call of each function, launches captured (not run), in interleaved rounds."""
    times = {name: [] for name in fns}
    with launch_cache.capturing() as captured:
        for fn in fns.values():  # warm up: first calls resolve options, fill caches
            for _ in range(5):
                fn()
        for _ in range(rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[name].append((time.perf_counter() - t0) / calls * 1e6)
                captured.clear()
    return {name: statistics.median(t) for name, t in times.items()}
