"""A model of the shared-memory loads Triton emits for the CUDA-core (FMA) ``tl.dot`` of the v2 kernels.

On the float32 path with ``input_precision="ieee"``, both operands of each ``tl.dot`` go through
shared memory and every thread loads 16-byte vectors of the rows and columns its part of the output
needs. This module counts those loads per warp and per K/V block, and their wavefronts under the bank
model of ``flashattn.banks``, for v2 (K row-major, ``tl.trans``) against v2_kt (K transposed): the
prediction notebook 06b §1 compares with Nsight Compute's counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashattn.kernels import launch_tiles
from flashattn.models.banks import K_TILES, WARP_SIZE, ideal_wavefronts, k_tile_wavefronts, k_tile_width, wavefronts
from flashattn.models.layouts import check_int

FMA_SIZE_PER_THREAD = (4, 4)
"""Elements per thread of the output tile of an FMA ``tl.dot``, as Triton chose them (see fma_threads_per_warp)."""


def fma_threads_per_warp(n: int) -> tuple[int, int]:
    """Lanes along (M, N) of the output tile of an FMA ``tl.dot`` with N columns.

    The rule Triton 3.9 followed for sm_90 when this module was written (read from the TTGIR of the
    v2 kernels: ``sizePerThread = [4, 4]``, ``threadsPerWarp = [2, 16]`` for 64 columns, ``[4, 8]``
    for 32, ``[1, 32]`` for 128; ``warpsPerCTA = [num_warps, 1]``). Other Triton versions may choose
    differently: notebook 06b §1 shows the recorded compiled layouts next to the model.
    """
    along_n = max(1, min(WARP_SIZE, n // FMA_SIZE_PER_THREAD[1]))
    return WARP_SIZE // along_n, along_n


@dataclass(frozen=True)
class OperandLoads:
    """The shared-memory loads of one ``tl.dot`` operand, per warp and per loop iteration."""

    dot: str  # "Q·Kᵀ" or "P·V"
    operand: str  # "Q", "K", "P", "V"
    tile: str  # how the tile is stored
    instructions: int  # warp-wide load instructions
    access_bytes: int
    wavefronts: int  # summed over the instructions

    @property
    def ideal(self) -> int:
        return self.instructions * ideal_wavefronts(self.access_bytes)

    @property
    def conflict_ways(self) -> float:
        return self.wavefronts / self.ideal


def _fma_a_loads(M: int, K: int, num_warps: int, n: int) -> tuple[int, int]:
    """A (M×K, row-major, K contiguous): per row of the thread and 4-wide k chunk, one 16-byte load."""
    tpw_m, tpw_n = fma_threads_per_warp(n)
    rows_per_warp_rep = FMA_SIZE_PER_THREAD[0] * tpw_m
    reps = max(1, M // (rows_per_warp_rep * num_warps))
    total_wf = count = 0
    for rep in range(reps):
        base = rep * rows_per_warp_rep * num_warps  # warp 0; other warps are shifted copies
        for i in range(FMA_SIZE_PER_THREAD[0]):
            for kq in range(0, K, 4):
                rows = [base + FMA_SIZE_PER_THREAD[0] * (lane // tpw_n) + i for lane in range(WARP_SIZE)]
                total_wf += wavefronts([(r * K + kq) * 4 for r in rows], 16)
                count += 1
    return count, total_wf


def _fma_b_loads(K: int, N: int, k_contiguous: bool) -> tuple[int, int]:
    """B (K×N). k_contiguous: stored as (N, K) rows (Kᵀ of a row-major tile); else (K, N) row-major."""
    _, tpw_n = fma_threads_per_warp(N)
    groups = [lane % tpw_n for lane in range(WARP_SIZE)]
    total_wf = count = 0
    if k_contiguous:  # each lane: its 4 columns n, 4 consecutive k each
        for j in range(FMA_SIZE_PER_THREAD[1]):
            for kq in range(0, K, 4):
                total_wf += wavefronts([((FMA_SIZE_PER_THREAD[1] * g + j) * K + kq) * 4 for g in groups], 16)
                count += 1
    else:  # each lane: its 4 consecutive columns n at one k
        for k in range(K):
            total_wf += wavefronts([(k * N + FMA_SIZE_PER_THREAD[1] * g) * 4 for g in groups], 16)
            count += 1
    return count, total_wf


def fma_loop_loads(variant: str, D: int, *, block_m: int = 64, block_n: int = 64,
                   num_warps: int = 4) -> list[OperandLoads]:
    """Model of the shared-memory loads one warp issues per K/V block on the float32 FMA path.

    What it assumes (taken from Triton's compiled v2 kernels for sm_90, float32 with
    ``input_precision="ieee"``): both ``tl.dot`` operands go through shared memory; the tiles are
    stored without swizzle in the order of their global-memory rows (so ``v2_kt_view``, whose global
    K is still D-contiguous, gets v2's tile); the output of each dot is spread as
    :data:`FMA_SIZE_PER_THREAD` elements per thread over :func:`fma_threads_per_warp` lanes, warps
    stacked along M; every load is a 16-byte vector along the stored rows. Lanes that hold the same
    rows or columns load the same addresses (broadcast within a phase, counted again in another
    phase, as in :func:`wavefronts`). Not modelled: the few loads of layout conversions and
    reductions, and the stores.
    """
    for name, value in (("D", D), ("block_m", block_m), ("block_n", block_n), ("num_warps", num_warps)):
        check_int(value, name, minimum=1)
    d = k_tile_width(variant, D)
    if d % 4 or block_n % 4 or block_m % 4:
        raise ValueError(f"the model needs D, block_m and block_n to be multiples of 4, got {d}, {block_m}, {block_n}")
    k_contiguous = K_TILES[variant] != "transposed"
    k_tile = f"({block_n}, {d}) row-major" if k_contiguous else f"({d}, {block_n}) row-major (Kᵀ)"
    parts = [
        ("Q·Kᵀ", "Q", f"({block_m}, {d}) row-major", 16, *_fma_a_loads(block_m, d, num_warps, block_n)),
        ("Q·Kᵀ", "K", k_tile, 16, *_fma_b_loads(d, block_n, k_contiguous)),
        ("P·V", "P", f"({block_m}, {block_n}) row-major", 16, *_fma_a_loads(block_m, block_n, num_warps, d)),
        ("P·V", "V", f"({block_n}, {d}) row-major", 16, *_fma_b_loads(block_n, d, False)),
    ]
    return [OperandLoads(dot, op, tile, count, access, wf) for dot, op, tile, access, count, wf in parts]


def fma_loop_summary(D: int, *, block_m: int = 64, block_n: int = 64, num_warps: int = 4,
                     variants=("v2", "v2_kt")) -> dict:
    """Per-warp, per-iteration instructions and wavefronts of :func:`fma_loop_loads` for each variant."""
    out = {}
    for v in variants:
        loads = fma_loop_loads(v, D, block_m=block_m, block_n=block_n, num_warps=num_warps)
        out[v] = {
            "instructions": sum(x.instructions for x in loads),
            "wavefronts": sum(x.wavefronts for x in loads),
            "k_wavefronts": sum(x.wavefronts for x in loads if x.operand == "K"),
            "loads": loads,
        }
    return out


def predicted_ratios(D: int, *, block_m: int = 64, block_n: int = 64, num_warps: int = 4) -> dict:
    """Wavefronts of v2 divided by those of v2_kt, three ways (all float32).

    * ``simple``: the K tile only, one lane per key row, 4-byte loads (:func:`k_tile_wavefronts`);
    * ``k_tile_triton``: the K tile only, with Triton's vector loads and lane layout (:func:`fma_loop_loads`);
    * ``loop_triton``: all four operand tiles of one iteration (Q, K, P, V), which is closest to
      what Nsight Compute counts over the whole kernel.
    """
    s = fma_loop_summary(D, block_m=block_m, block_n=block_n, num_warps=num_warps)
    return {
        "simple": k_tile_wavefronts(D, "v2", block_n=block_n) / k_tile_wavefronts(D, "v2_kt", block_n=block_n),
        "k_tile_triton": s["v2"]["k_wavefronts"] / s["v2_kt"]["k_wavefronts"],
        "loop_triton": s["v2"]["wavefronts"] / s["v2_kt"]["wavefronts"],
    }


def fma_num_warps(D: int) -> int:
    """Warps of the float32 v2 kernels on a GPU: what ``launch_tiles("v2", "float32", D)`` gives."""
    return launch_tiles("v2", "float32", D)["num_warps"]
