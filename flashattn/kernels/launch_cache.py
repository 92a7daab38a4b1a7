"""Launching a compiled kernel again without Triton's per-call bookkeeping (notebook 12: host time).

``kernel[grid](*args)`` binds the arguments, works out how each one specializes the kernel (pointer
alignment, integers divisible by 16, descriptor tiles), looks the compiled kernel up, and only then
launches it, on every call. A short attention kernel runs for not much longer on the GPU than that takes on
the host (the recorded measurement ``host_time`` has both). When the host takes longer to issue the kernels
than the GPU takes to run them, the GPU waits, and a timing measures the host. :func:`launch` does the
bookkeeping once per distinct call and afterwards launches the compiled kernel directly.

Its key is stricter than Triton's specialization (every integer exactly, every tensor's dtype, device and
16-byte alignment, every descriptor's shape, strides, tiles and layout, the launch options), so a launch
never reuses a kernel compiled for arguments that would specialize it differently. The interpreter takes
the ordinary path.
"""

from __future__ import annotations

import contextlib

import torch

from flashattn import runtime

_MAX_ENTRIES = 4096  # distinct calls remembered (a shape, an alignment, tiles); past that, start again
_runners: dict = {}
_captured: list | None = None  # inside capturing(): the launches, recorded instead of run


@contextlib.contextmanager
def capturing():
    """Record every launch made inside (kernel, grid, args, constexprs, options) instead of running it: what the
    compile checks compile for each GPU target (``measure/compile_targets.py``)."""
    global _captured
    outer, _captured = _captured, []
    try:
        yield _captured
    finally:
        _captured = outer


def _key(arg):
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.get_device(), arg.data_ptr() % 16 == 0
    base = getattr(arg, "base", None)  # a TMA descriptor (Triton's or Gluon's)
    if isinstance(base, torch.Tensor):
        return (type(arg), base.dtype, base.get_device(), base.data_ptr() % 16 == 0, tuple(arg.shape),
                tuple(arg.strides), tuple(arg.block_shape), getattr(arg, "layout", None), arg.padding)
    if isinstance(arg, float):  # floats do not specialize a kernel
        return float
    return arg  # integers, booleans, None: exactly


def launch(kernel, grid: tuple, args: tuple, constexprs: dict, **options) -> None:
    """``kernel[grid](*args, **constexprs, **options)``: ``args`` the kernel's first parameters in order,
    ``constexprs`` its remaining ones by name, ``options`` the launch options (num_warps, num_stages, ...)."""
    if _captured is not None:
        _captured.append((kernel, grid, args, constexprs, options))
        return
    if runtime.MODE != "gpu":
        kernel[grid](*args, **constexprs, **options)
        return
    key = (kernel, grid, tuple(map(_key, args)), tuple(constexprs.items()), tuple(options.items()))
    entry = _runners.get(key)
    if entry is not None:
        runner, order = entry
        runner(*args, *map(constexprs.__getitem__, order))
        return
    order = tuple(kernel.arg_names[len(args):])
    if sorted(order) != sorted(constexprs):
        raise TypeError(f"launch_cache.launch({kernel.__name__}): after {len(args)} positional arguments the kernel "
                        f"takes {', '.join(order)}; got {', '.join(constexprs)}")
    compiled = kernel[grid](*args, **constexprs, **options)
    if len(_runners) >= _MAX_ENTRIES:
        _runners.clear()
    _runners[key] = (compiled[tuple(grid) + (1,) * (3 - len(grid))], order)
