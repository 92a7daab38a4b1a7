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


def _check_names(kernel, args: tuple, constexprs: dict) -> tuple:
    """The names of the kernel's parameters after ``args``, which ``constexprs`` must give, every one (a default is
    no excuse: the compiled kernel is called with all of them, in this order). Checked in every mode, so that a
    launch the GPU would refuse fails in the interpreter too."""
    order = tuple(kernel.arg_names[len(args):])
    if sorted(order) != sorted(constexprs):
        raise TypeError(f"launch_cache.launch({kernel.__name__}): after {len(args)} positional arguments the kernel "
                        f"takes {', '.join(order)}; got {', '.join(constexprs)}")
    return order


def _compiled(kernel, grid: tuple, args: tuple, constexprs: dict, options: dict) -> tuple:
    """(runner, the constexprs' names in the kernel's order, whether this call already launched the kernel): the
    compiled kernel for this call, compiled (and launched) by ``kernel[grid](...)`` on the first call of its key."""
    key = (kernel, grid, tuple(map(_key, args)), tuple(constexprs.items()), tuple(options.items()))
    entry = _runners.get(key)
    if entry is not None:
        return (*entry, False)
    order = _check_names(kernel, args, constexprs)
    compiled = kernel[grid](*args, **constexprs, **options)
    if len(_runners) >= _MAX_ENTRIES:
        _runners.clear()
    _runners[key] = (compiled[tuple(grid) + (1,) * (3 - len(grid))], order)
    return (*_runners[key], True)


def launch(kernel, grid: tuple, args: tuple, constexprs: dict, **options) -> None:
    """``kernel[grid](*args, **constexprs, **options)``: ``args`` the kernel's first parameters in order,
    ``constexprs`` its remaining ones by name, ``options`` the launch options (num_warps, num_stages, ...)."""
    if _captured is not None or runtime.MODE != "gpu":  # (on the GPU, _compiled checks the names once per key)
        _check_names(kernel, args, constexprs)
        if _captured is not None:
            _captured.append((kernel, grid, args, constexprs, options))
        else:
            kernel[grid](*args, **constexprs, **options)
        return
    runner, order, launched = _compiled(kernel, grid, args, constexprs, options)
    if not launched:
        runner(*args, *map(constexprs.__getitem__, order))


def problem_key(tensors: tuple, values: tuple = (), options: dict | None = None) -> tuple | None:
    """A key for a caller's prepared problem (its checks, plan and :func:`bind` launches, reused while the key is the
    same): per tensor (or None) its shape, strides, dtype, device and 16-byte alignment, then each value and each
    option with its type (so that ``1`` is not taken for ``True``). None, for the ordinary path, when a tensor is not
    a plain ``torch.Tensor`` (fake tensors, subclasses) or a value cannot be hashed."""
    meta = []
    for t in tensors:
        if t is None:
            meta.append(None)
        elif type(t) is not torch.Tensor:
            return None
        else:
            meta.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
    typed = tuple((type(value), value) for value in values)
    if options:
        typed += tuple((key, type(value), value) for key, value in sorted(options.items()))
    try:
        hash(typed)
    except TypeError:
        return None
    return (*meta, *typed)


MAX_PROBLEMS = 256  # prepared problems a caller's cache keeps (:func:`kept`); past that, it starts again


def kept(cache: dict, key, make):
    """``cache[key]``, made by ``make()`` the first time, for a caller's prepared problems keyed by
    :func:`problem_key` (a None key, the ordinary path: made every time, not kept); a cache of MAX_PROBLEMS
    problems starts again."""
    value = None if key is None else cache.get(key)
    if value is None:
        value = make()
        if key is not None:
            if len(cache) >= MAX_PROBLEMS:
                cache.clear()
            cache[key] = value
    return value


def bind(kernel, grid: tuple, constexprs: dict, **options):
    """A function ``run(*args)`` that does ``launch(kernel, grid, args, constexprs, **options)``, for a caller that
    keys it by everything :func:`_key` reads of the arguments (shapes, strides, dtypes, devices, 16-byte alignment,
    integers; decode.py keys a prepared problem so): after its first GPU launch it calls the compiled kernel
    without computing the key again (a key of 30-odd arguments takes microseconds a short decoding step lacks)."""
    bound = None

    def run(*args):
        nonlocal bound
        if bound is not None:
            bound(*args)
            return
        if _captured is not None or runtime.MODE != "gpu":
            launch(kernel, grid, args, constexprs, **options)
            return
        runner, order, launched = _compiled(kernel, grid, args, constexprs, options)
        tail = tuple(constexprs[name] for name in order)
        bound = lambda *args: runner(*args, *tail)  # noqa: E731
        if not launched:
            bound(*args)

    return run
