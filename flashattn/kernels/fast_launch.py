"""The host side of ``fast`` (notebook 10): autotuning, the picks it made, and the launches of the Triton
kernel (``fast.py``) and the Gluon kernel (``fast_gluon.py``).

Autotuning times the candidates in interleaved rounds and keeps each one's median, for the same reason as
``flashattn.bench``: under load an H200 runs at its power limit and its clock drifts by a quarter within
seconds, so candidates timed one after another (as ``triton.autotune`` does) meet different clocks and a
fresh process can pick a loser. The pick is recorded here, where it is made (:func:`tuned_config` reads it).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from typing import NamedTuple

import torch
import triton
from triton.compiler.errors import CompileTimeAssertionFailure
from triton.runtime.errors import OutOfResources, PTXASError
from triton.tools.tensor_descriptor import TensorDescriptor

from . import launch_cache
from .constants import LOG2_E
from .fast_options import WS_MAXNREG, FastOptions, gluon_available, padded_head_dim, tuning_configs

try:
    from . import fast_gluon
except ImportError:
    fast_gluon = None

# Each candidate is timed once per round (do_bench's median of its repetitions, with the L2 flushed before
# each); the rounds interleave the candidates, in an order that reverses from round to round (a, b, c, c, b,
# a, ...: over an even number of rounds a steady drift of the clock costs every candidate the same), and each
# keeps its median over the rounds.
TUNE_ROUNDS = 6
TUNE_WARMUP_MS = 5
TUNE_REP_MS = 20


class Problem(NamedTuple):
    """What a pick is remembered for: the problem's shape and the options that narrow the candidates."""

    gluon: bool
    dtype: torch.dtype
    D: int
    B: int
    Hq: int
    Hkv: int
    L: int
    S: int
    causal: bool
    use_tma: bool
    input_precision: str
    overlap: bool
    schedule: str
    consumers: int | None


# problem -> (the options autotuning picked, each candidate's median time in ms)
_picks: dict[Problem, tuple[FastOptions, dict[FastOptions, float]]] = {}


def candidates(opts: FastOptions, D: int, dtype: torch.dtype, causal: bool) -> list[FastOptions]:
    """The configurations autotuning tries for ``opts``: its kernel's space (for Gluon, narrowed to the schedule
    and consumers asked for). Causal problems: the Triton kernel's diagonal stage needs block_n <= block_m;
    the Gluon kernel masks every key block that crosses the diagonal, whatever its width, and gets no
    three-consumer programs (measured on the H200: they lose there, by far)."""
    configs = tuning_configs(D, dtype, gluon=opts.gluon, schedule=opts.schedule, consumers=opts.consumers)
    if causal and opts.gluon:
        configs = [c for c in configs if c.get("consumers") != 3] or configs[:1]
    elif causal:
        configs = [c for c in configs if c["block_n"] <= c["block_m"]] or configs[:1]
    return [dataclasses.replace(opts, autotune=False, **c) for c in configs]


def _tune(options: list[FastOptions], run) -> tuple[FastOptions, dict[FastOptions, float]]:
    """Run each candidate once (compiling it; one that cannot run on this GPU is dropped), then time them in
    TUNE_ROUNDS interleaved rounds of alternating order; the pick has the lowest median."""
    runs, errors = {}, []
    for opts in options:
        try:
            run(opts)
            runs[opts] = functools.partial(run, opts)
        except (OutOfResources, CompileTimeAssertionFailure, PTXASError) as err:  # as triton.autotune does
            errors.append(err)
    if not runs:
        raise errors[0]
    times = {opts: [] for opts in runs}
    order = list(runs)
    for _ in range(TUNE_ROUNDS if len(runs) > 1 else 0):
        for opts in order:
            times[opts].append(triton.testing.do_bench(runs[opts], warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS,
                                                       return_mode="median"))
        order.reverse()
    medians = {opts: statistics.median(t) for opts, t in times.items() if t}
    return min(runs, key=lambda opts: medians.get(opts, 0.0)), medians


def launch(kernel, q, k, v, o, lse, causal: bool, scale: float, return_lse: bool, opts: FastOptions) -> None:
    """Run ``kernel`` (``attn_kernel_fast``) or the Gluon kernel with ``opts``. With ``opts.autotune``, the first
    call for a problem tunes (see the module docstring); later calls launch the pick directly."""
    if opts.use_tma:  # TMA wants 16-byte aligned rows and base addresses: copy inputs that are not
        q, k, v = (x if x.is_contiguous() and x.data_ptr() % 16 == 0 else x.clone(memory_format=torch.contiguous_format)
                   for x in (q, k, v))
    run = functools.partial(_launch_gluon if opts.gluon else functools.partial(_launch_triton, kernel),
                            q, k, v, o, lse, causal, scale, return_lse)
    if opts.autotune:
        (B, Hq, L, D), (Hkv, S) = q.shape, k.shape[1:3]
        problem = Problem(opts.gluon, q.dtype, D, B, Hq, Hkv, L, S, causal, opts.use_tma, opts.input_precision,
                          opts.overlap, opts.schedule, opts.consumers)
        if problem not in _picks:
            _picks[problem] = _tune(candidates(opts, D, q.dtype, causal), run)
        opts = _picks[problem][0]
    run(opts)


def _descriptor(x: torch.Tensor, block_rows: int):
    """A TMA descriptor over contiguous ``x`` (B, H, N, D) seen as one (B·H·N, D) matrix, in (block_rows, D) tiles."""
    B, H, N, D = x.shape
    return TensorDescriptor(x, shape=[B * H * N, D], strides=[D, 1], block_shape=[block_rows, D])


def _launch_triton(kernel, q, k, v, o, lse, causal, scale, return_lse, opts: FastOptions) -> None:
    (B, Hq, L, D), (Hkv, S) = q.shape, k.shape[1:3]
    if opts.use_tma:  # the descriptors view each input as one (B·H·rows, D) matrix
        if max(B * Hq * L, B * Hkv * S) >= 2**31:
            raise ValueError(f"fast: use_tma addresses rows with 32-bit coordinates; B·H·N = {B * Hq * L} is too large")
        q_arg, k_arg, v_arg = _descriptor(q, opts.block_m), _descriptor(k, opts.block_n), _descriptor(v, opts.block_n)
    else:
        q_arg, k_arg, v_arg = q, k, v
    launch_cache.launch(
        kernel, (triton.cdiv(L, opts.block_m), B * Hq),
        (q_arg, k_arg, v_arg, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), Hq, Hq // Hkv, L, S,
         scale * LOG2_E.value),
        dict(D=D, D_PAD=padded_head_dim(D), BLOCK_M=opts.block_m, BLOCK_N=opts.block_n, CAUSAL=causal,
             MORE_QUERIES=causal and L > S, USE_TMA=opts.use_tma,
             PRECISION=opts.input_precision if q.dtype == torch.float32 else "tf32", STORE_LSE=return_lse),
        num_warps=opts.num_warps, num_stages=opts.num_stages, **({"maxnreg": opts.maxnreg} if opts.maxnreg else {}))


_sm_counts: dict = {}


def _gluon_grid(N: int, BH: int, opts: FastOptions, device) -> tuple:
    """Single warpgroups: a (Q block, batch·head) grid. Specialized: one program per tile of consumers·block_m
    rows (1-D). Persistent: at most one program per SM, each looping over tiles."""
    if opts.schedule == "single":
        return (triton.cdiv(N, opts.block_m), BH)
    tiles = triton.cdiv(N, opts.consumers * opts.block_m) * BH
    if opts.schedule == "specialized":
        return (tiles,)
    if device not in _sm_counts:
        _sm_counts[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return (min(tiles, _sm_counts[device]),)


def _launch_gluon(q, k, v, o, lse, causal, scale, return_lse, opts: FastOptions) -> None:
    B, H, N, D = q.shape
    if B * H * N >= 2**31:
        raise ValueError(f"fast: the Gluon kernel addresses rows with 32-bit coordinates; B·H·N = {B * H * N} is too large")
    ws = opts.schedule != "single"
    descs = (fast_gluon.descriptor(q, opts.block_m), fast_gluon.descriptor(k, opts.block_n),
             fast_gluon.descriptor(v, opts.block_n))
    launch_cache.launch(
        fast_gluon.attn_kernel_gluon, _gluon_grid(N, B * H, opts, q.device), (*descs, o, lse, N, B * H, scale * LOG2_E.value),
        dict(D=D, BLOCK_M=opts.block_m, BLOCK_N=opts.block_n, STAGES=opts.num_stages, CAUSAL=causal,
             STORE_LSE=return_lse, OVERLAP=opts.overlap, WARP_SPECIALIZE=ws, PERSISTENT=opts.schedule == "persistent",
             CONSUMERS=opts.consumers if ws else 2),
        num_warps=opts.num_warps, **({"maxnreg": WS_MAXNREG[opts.consumers]} if ws else {}))


def tuned_config(D: int, dtype: torch.dtype, N: int, H: int, causal: bool, use_tma: bool = True,
                 gluon: bool | None = None, overlap: bool = True, schedule: str = "auto",
                 consumers: int | None = None, B: int | None = None) -> dict | None:
    """The configuration autotuning picked in this process for an (N × N, H heads) problem, or None if not tuned
    yet. ``gluon``: which kernel's (None: the one ``fast`` uses by default here); ``use_tma``: the Triton
    kernel's; ``overlap``, ``schedule``, ``consumers``: the Gluon options that narrowed the candidates; ``B``:
    the batch (None: any)."""
    if gluon is None:
        gluon = gluon_available(dtype, D)
    for p, (picked, _) in _picks.items():
        if ((p.gluon, p.dtype, p.D, p.L, p.S, p.Hq, p.Hkv, p.causal) == (gluon, dtype, D, N, N, H, H, causal)
                and (B is None or p.B == B)
                and ((p.overlap, p.schedule, p.consumers) == (overlap, schedule, consumers) if gluon
                     else p.use_tma == use_tma)):
            return picked.tiles()
    return None


def tuning_times(problem: Problem) -> dict[FastOptions, float] | None:
    """Each candidate's median time (ms) when ``problem`` was tuned in this process, or None."""
    return _picks[problem][1] if problem in _picks else None
