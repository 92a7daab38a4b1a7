"""The memory hierarchy, arithmetic intensity and the roofline, on paper.

* :func:`hierarchy_rows` — the memory hierarchy of a GPU from its numbers (``flashattn.measure.hardware``
  gives them, measured live or recorded);
* arithmetic intensity (FLOP per byte of memory traffic) of a matrix multiply and of attention, with the
  course's FLOP convention (:func:`attention_flops`). For attention, :func:`attention_bytes` counts the bytes
  a kernel *requests* (no reuse); a roofline places a kernel by the bytes that reach DRAM, which L2 can make
  far fewer: ``flashattn.measure.dram`` does that (measured where recorded, else the compulsory bytes);
* :func:`roofline` — attainable throughput ``min(peak, intensity · bandwidth)``; :func:`ridge_point`, :func:`bound`;
* naive attention's O(N²) memory (:func:`naive_intermediate_bytes`, :func:`naive_oom_n`).

The figures are ``flashattn.plots.plot_roofline`` and ``flashattn.plots.plot_memory_vs_n``.

Units: bandwidth in GB/s and throughput in TFLOP/s where the names say so (``*_gbps``,
``*_tflops``); :func:`roofline` itself works in any consistent pair (FLOP/s with bytes/s, or
TFLOP/s with TB/s).
"""

from __future__ import annotations

import numpy as np

from flashattn.kernels import launch_tiles
from flashattn.models import traffic
from flashattn.models.traffic import format_bytes

# One register is 32 bits; a shared-memory bank serves 4 bytes per clock, and an SM has 32 banks.
REGISTER_BYTES = 4
SHARED_BYTES_PER_CLOCK_PER_SM = 32 * 4

# The compute roofs: which unit each matrix-multiply rate of hardware_numbers()["matmul_tflops"] measures.
ROOF_LABELS = {
    "float16": "fp16 tensor cores",
    "bfloat16": "bf16 tensor cores",
    "float32_tf32": "fp32 via TF32 tensor cores",
    "float32_ieee": "fp32 on CUDA cores (IEEE)",
}


def hierarchy_rows(hw: dict) -> list[dict]:
    """The memory hierarchy, slowest and largest first, from ``flashattn.measure.hardware.hardware_numbers``.

    Each row: ``level``, ``per_sm`` and ``total`` (bytes, None where it does not apply),
    ``bandwidth_gbps`` (None where not known) and ``note`` (how the bandwidth was obtained).
    Shared-memory bandwidth is derived, not measured: 32 banks × 4 bytes per clock per SM at the
    maximum SM clock.
    """
    sms = hw["multiprocessors"]
    smem = hw["shared_memory_per_sm_bytes"]
    regs = hw["register_bytes_per_sm"]
    clock = hw.get("max_sm_clock_mhz")
    smem_gbps = None if clock is None else SHARED_BYTES_PER_CLOCK_PER_SM * sms * clock * 1e6 / 1e9

    def whole_gpu(per_sm):  # an older torch may not report a property: leave it unknown
        return None if per_sm is None else per_sm * sms

    return [
        {"level": "HBM (global memory)", "per_sm": None, "total": hw["total_memory_bytes"],
         "bandwidth_gbps": hw["copy_bandwidth_gbps"], "note": "measured: device-to-device copy"},
        {"level": "L2 cache", "per_sm": None, "total": hw["l2_cache_bytes"],
         "bandwidth_gbps": None, "note": "shared by all SMs; not measured here"},
        {"level": "shared memory (part of each SM's L1)", "per_sm": smem, "total": whole_gpu(smem),
         "bandwidth_gbps": smem_gbps,
         "note": "derived: 32 banks × 4 B per clock per SM × SMs × max clock" if clock else "no clock known"},
        {"level": "registers", "per_sm": regs, "total": whole_gpu(regs), "bandwidth_gbps": None,
         "note": f"{hw['registers_per_sm']} 32-bit registers per SM; operands of every instruction"},
    ]


def hierarchy_markdown(hw: dict) -> str:
    """:func:`hierarchy_rows` as a Markdown table (for ``IPython.display.Markdown``)."""
    lines = ["| level | per SM | whole GPU | bandwidth | how we know the bandwidth |",
             "| --- | --- | --- | --- | --- |"]
    for r in hierarchy_rows(hw):
        bw = "—" if r["bandwidth_gbps"] is None else f"{r['bandwidth_gbps'] / 1000:.1f} TB/s"
        lines.append(f"| {r['level']} | {format_bytes(r['per_sm'], binary=True)} | "
                     f"{format_bytes(r['total'], binary=True)} | {bw} "
                     f"| {r['note']} |")
    return "\n".join(lines)


# --- arithmetic intensity ---------------------------------------------------------------------


def intensity(flops: float, bytes_moved: float) -> float:
    """Arithmetic intensity: FLOP per byte of memory traffic."""
    if bytes_moved <= 0:
        raise ValueError(f"bytes_moved must be positive, got {bytes_moved}")
    return flops / bytes_moved


def matmul_flops(M: int, N: int, K: int) -> float:
    """C (M×N) = A (M×K) · B (K×N): M·N·K multiply-adds, 2 FLOP each."""
    return 2.0 * M * N * K


def matmul_bytes(M: int, N: int, K: int, dtype_bytes: int) -> float:
    """The least HBM traffic of a matmul: read A and B once, write C once."""
    return float(M * K + K * N + M * N) * dtype_bytes


def matmul_intensity(M: int, N: int, K: int, dtype_bytes: int) -> float:
    return intensity(matmul_flops(M, N, K), matmul_bytes(M, N, K, dtype_bytes))


def attention_flops(B: int, H: int, N: int, D: int, causal: bool = False) -> float:
    """The course's FLOP convention (the FlashAttention papers'): a forward pass does two matrix products
    of 2·N·N·D multiply-adds per (batch, head), so 4·B·H·N²·D FLOP; causal attention does half."""
    flops = 4.0 * B * H * N * N * D
    return flops / 2 if causal else flops


def gpu_default_blocks(variant: str, dtype: str = "float16", D: int = 64) -> tuple[int, int]:
    """(block_m, block_n) that ``variant`` uses on a GPU by default, read from its kernel module.

    The kernels' ``default_options`` choose smaller blocks in interpreter mode; a roofline is about a
    GPU, so this asks for the GPU choice whatever the current mode.
    """
    tiles = launch_tiles(variant, dtype, D)
    return tiles["block_m"], tiles["block_n"]


def attention_bytes(variant: str, *, B: int, H: int, N: int, D: int, dtype_bytes: int,
                    block_m: int | None = None, block_n: int | None = None, causal: bool = False) -> int:
    """Bytes (read + written) one attention forward pass requests from memory.

    ``variant``: ``"minimum"`` (read Q, K, V once and write O once: no kernel can do less) or a
    kernel of the course (``naive``, ``v1``, ``v2``, ...), counted by ``flashattn.traffic.hbm_bytes``
    at ``block_m``/``block_n`` (default: the variant's GPU block sizes), with no reuse: an upper bound on
    the bytes that reach DRAM (the L2 cache serves repeats; ``flashattn.measure.dram`` tells them apart).
    """
    if variant == "minimum":
        return 4 * B * H * N * D * dtype_bytes
    if block_m is None or block_n is None:
        dtype = {2: "float16", 4: "float32"}.get(dtype_bytes, "float16")
        default_m, default_n = gpu_default_blocks(variant, dtype, D)
        block_m, block_n = block_m or default_m, block_n or default_n
    counts = traffic.hbm_bytes(variant, B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes,
                               block_m=block_m, block_n=block_n, causal=causal)
    return counts["read"] + counts["write"]


def attention_intensity(variant: str, *, B: int, H: int, N: int, D: int, dtype_bytes: int,
                        block_m: int | None = None, block_n: int | None = None, causal: bool = False) -> float:
    """FLOP per requested byte of attention: :func:`attention_flops` over :func:`attention_bytes` (for
    ``"minimum"``, per compulsory byte: where a kernel that moves each tensor once sits on a roofline)."""
    flops = attention_flops(B, H, N, D, causal)
    return intensity(flops, attention_bytes(variant, B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes,
                                            block_m=block_m, block_n=block_n, causal=causal))


# --- the roofline -----------------------------------------------------------------------------


def roofline(intensity, peak_flops, bandwidth):
    """Attainable throughput: ``min(peak_flops, intensity · bandwidth)`` (scalar or array).

    Units must agree: TFLOP/s with TB/s gives TFLOP/s; FLOP/s with bytes/s gives FLOP/s.
    """
    attainable = np.minimum(peak_flops, np.asarray(intensity, dtype=float) * bandwidth)
    return float(attainable) if np.ndim(attainable) == 0 else attainable


def ridge_point(peak_flops, bandwidth) -> float:
    """The intensity (FLOP/byte) where the memory roof meets the compute roof."""
    return peak_flops / bandwidth


def bound(intensity, peak_flops, bandwidth) -> str:
    """``"memory"`` left of the ridge point, ``"compute"`` at or right of it."""
    return "memory" if intensity < ridge_point(peak_flops, bandwidth) else "compute"


# --- naive attention's O(N²) memory -----------------------------------------------------------


def naive_intermediate_bytes(B: int, H: int, N: int, dtype_bytes: int) -> dict:
    """Bytes of the naive kernels' N×N buffers: S in float32, P in the input dtype."""
    s = B * H * N * N * 4
    p = B * H * N * N * dtype_bytes
    return {"S": s, "P": p, "total": s + p}


def naive_oom_n(memory_bytes: int, B: int, H: int, D: int, dtype_bytes: int) -> int:
    """The smallest power-of-two N at which q, k, v, o, S and P no longer fit in ``memory_bytes``."""
    n = 1
    while 4 * B * H * n * D * dtype_bytes + naive_intermediate_bytes(B, H, n, dtype_bytes)["total"] <= memory_bytes:
        n *= 2
    return n
