"""Which GPU the kernels run on, what it has, and which tiles fit it (README: "Where it runs").

The course's kernels were tuned on an H200 (sm_90). Learners also have T4s (sm_75, a free cloud notebook),
A100s (sm_80), RTX 3090/4090s, A10s and L4s (sm_86/89). What differs between them, for Triton:

* shared memory per program (block): 64 KB on sm_75, 163 KB on sm_80, 99 KB on sm_86/89, 227 KB on sm_90;
* tensor cores: Triton's ``tl.dot`` uses them from sm_80 on (``mma.sync``; ``wgmma`` on sm_90); below, it
  multiplies on the CUDA cores;
* bfloat16 arithmetic: sm_80 and newer;
* TMA and ``wgmma`` (the Gluon kernels of notebooks 11 and 12): sm_90 only.

:func:`target` says all of that for the live GPU (or for any target by capability, which is what the
compile checks use), and :func:`fits` is the one test of a tile configuration against it, applied to every
tuning space before anything is compiled (:func:`prune`). :func:`hopper` is the course's one Hopper check.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from flashattn import runtime

OLDEST = (7, 5)  # Triton supports NVIDIA GPUs from sm_75 (Turing) on


@dataclass(frozen=True)
class Target:
    """One GPU generation as the kernels see it."""

    capability: tuple[int, int]
    shared_bytes: int  # shared memory one program may use (the opt-in maximum per block)
    examples: str  # GPUs of this generation
    registers: int = 65536  # 32-bit registers per SM (and at most per program)

    @property
    def name(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def tensor_cores(self) -> bool:
        """Whether Triton's ``tl.dot`` on 16-bit inputs runs on the tensor cores here (sm_80 and newer)."""
        return self.capability >= (8, 0)

    @property
    def bf16(self) -> bool:
        return self.capability >= (8, 0)

    @property
    def hopper(self) -> bool:
        """sm_90: TMA descriptors, ``wgmma``, warp specialization (the Gluon kernels)."""
        return self.capability == (9, 0)


# the targets the course is compiled for (tests/test_compile_targets.py); shared memory as CUDA documents it
TARGETS = {
    (7, 5): Target((7, 5), 65536, "T4, RTX 20xx (the source post's RTX 2070)"),
    (8, 0): Target((8, 0), 166912, "A100, A30"),
    (8, 6): Target((8, 6), 101376, "RTX 30xx, A10, A40"),
    (8, 9): Target((8, 9), 101376, "RTX 40xx, L4, L40"),
    (9, 0): Target((9, 0), 232448, "H100, H200"),
}


def for_capability(capability: tuple[int, int]) -> Target:
    """The :class:`Target` of a compute capability: the table's, or the nearest older one's limits."""
    capability = tuple(capability)
    if capability in TARGETS:
        return TARGETS[capability]
    if capability < OLDEST:
        raise ValueError(f"sm_{capability[0]}{capability[1]} is older than Triton supports (sm_75, Turing, and newer)")
    older = max(c for c in TARGETS if c <= capability)
    return Target(capability, TARGETS[older].shared_bytes, "not in the course's table: limits of " + TARGETS[older].name)


def target() -> Target | None:
    """The live GPU (its own shared-memory limit, read from the driver), or None without one (interpreter mode).
    A GPU older than sm_75 raises ValueError: Triton cannot compile for it. Inside :func:`pretend`, the target
    pretended."""
    return _pretended[-1] if _pretended else _live()


_pretended: list[Target] = []


@contextlib.contextmanager
def pretend(where: Target):
    """Choose tiles as if ``where`` were the live GPU (the compile checks: what would the code pick on a T4?)."""
    _pretended.append(where)
    try:
        yield where
    finally:
        _pretended.pop()


@functools.cache
def _live() -> Target | None:
    if runtime.MODE != "gpu" or not runtime.HAS_GPU:
        return None
    props = torch.cuda.get_device_properties(runtime.DEVICE)
    base = for_capability(runtime.CAPABILITY)
    return Target(base.capability, getattr(props, "shared_memory_per_block_optin", base.shared_bytes) or base.shared_bytes,
                  props.name, getattr(props, "regs_per_multiprocessor", base.registers) or base.registers)


def hopper() -> bool:
    """The course's one Hopper check: a live sm_90 GPU (TMA, ``wgmma``, the Gluon kernels)."""
    live = target()
    return live is not None and live.hopper


@functools.cache
def sm_count() -> int:
    """The live GPU's number of SMs (1 without one)."""
    return torch.cuda.get_device_properties(runtime.DEVICE).multi_processor_count if _live() else 1


def fits(shared_bytes: int, where: Target | None = None) -> bool:
    """Whether a program that needs ``shared_bytes`` of shared memory can launch on ``where`` (default: the live
    GPU; without one, everything fits: the interpreter has no limits)."""
    where = where or target()
    return where is None or shared_bytes <= where.shared_bytes


def prune(configs: list, shared_bytes, where: Target | None = None, *, what: str) -> list:
    """The ``configs`` whose estimated shared memory (``shared_bytes(config)``) fits ``where`` (default: the live
    GPU), in their order. None fitting is a clear error, before anything is compiled."""
    kept = [c for c in configs if fits(shared_bytes(c), where)]
    if configs and not kept:
        where = where or target()
        need = min(shared_bytes(c) for c in configs)
        raise ValueError(f"{what}: no tile configuration fits {where.name} ({where.examples}): the smallest needs "
                         f"about {need} bytes of shared memory, the GPU gives a program {where.shared_bytes}")
    return kept


def tile_shared_bytes(*, element: int, d: int, kept_rows: int, streamed_rows: int, stages: int, dots: list,
                      p_elements: int = 0, extra: int = 0, mma: bool, where: Target | None = None) -> int:
    """An estimate of the shared memory Triton gives a FlashAttention-style program on ``where`` (default: the live
    GPU; the H200's rules without one), before anything is compiled: ``kept_rows`` rows of D-wide tiles loaded once
    (Q in the forward), ``streamed_rows`` rows loaded per loop step (K and V), ``stages`` of software pipelining,
    ``dots`` the (m, n, k) of each ``tl.dot``, ``p_elements`` the elements of 16-bit products' operands made in
    registers (P in P·V), ``extra`` what else it stages for the tensor cores (dQ's float32 tile with atomic dQ), as
    ``element``-byte values. ``mma``: the products run on the tensor cores (16-bit inputs, or TF32); otherwise
    on the CUDA cores (float32 "ieee", and everything below sm_80).

    How Triton lays it out, read off the compiled kernels of every target (tests/test_compile_targets.py compiles
    every configuration the code keeps and checks that it fits): with the tensor cores, the streamed tiles sit
    in the pipeline's buffers (``stages`` of them on sm_90, one fewer on sm_80 to sm_89, two without a
    pipeline) and, below sm_90, an operand made in registers passes through shared memory on its way to the
    tensor cores; on the CUDA cores a product's two operands go through shared memory as float32, about the two largest
    products' worth at a time."""
    where = where or target() or TARGETS[(9, 0)]
    if mma and where.tensor_cores:
        copies = 2 if stages <= 1 else (stages if where.hopper else stages - 1)
        total = element * d * (kept_rows + copies * streamed_rows) + (0 if where.hopper else element * p_elements)
        return total + extra + 1024  # and a little for the pipeline's barriers and reductions
    return sum(sorted((4 * (m * k + k * n) for m, n, k in dots), reverse=True)[:2])


def first_fitting(configs: list, shared_bytes, *, what: str) -> tuple:
    """The first of ``configs`` (tiles in order of preference) that fits the live GPU: the teaching kernels' fixed
    tiles, chosen per device (a clear error if none fits)."""
    return prune(configs, shared_bytes, what=what)[0]
