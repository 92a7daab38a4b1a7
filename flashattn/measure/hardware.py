"""The GPU's numbers: its properties and measured ceilings (copy bandwidth, matrix-multiply rates), live or
as recorded.

:func:`hardware_numbers` gives one dict either way: measured now on a GPU (:func:`measure_device`, the
function the recorded ``device`` measurement ran) or read from ``figures/data/``. The models
(``flashattn.roofline``, ``flashattn.occupancy``) take that dict; they never measure.
"""

from __future__ import annotations

import torch

from flashattn import runtime
from flashattn.bench import time_ms
from flashattn.measure import recorded
from flashattn.models.roofline import REGISTER_BYTES
from flashattn.record import nvidia_smi


def _copy_ms(n: int) -> float:
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    return time_ms(lambda: dst.copy_(src))


def copy_bandwidth_gbps(n: int = 1 << 30) -> float:
    """Bytes read + written per second by a device-to-device copy of ``n`` float32 (4 GiB by default), in GB/s,
    measured now (the ``device`` measurement's ``copy_bandwidth_gbps``)."""
    return 2 * n * 4 / (_copy_ms(n) * 1e-3) / 1e9


def _matmul_ms(M: int, dtype: torch.dtype, tf32: bool) -> float:
    a = torch.randn(M, M, device="cuda", dtype=dtype)
    b = torch.randn(M, M, device="cuda", dtype=dtype)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        return time_ms(lambda: a @ b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def device_properties() -> dict:
    """The GPU's properties that the course uses (SM count, caches, shared memory, registers, clocks)."""
    p = torch.cuda.get_device_properties(0)
    return {
        "name": p.name,
        "multiprocessors": p.multi_processor_count,
        "total_memory_bytes": p.total_memory,
        "l2_cache_bytes": getattr(p, "L2_cache_size", None),
        "shared_memory_per_block_optin_bytes": getattr(p, "shared_memory_per_block_optin", None),
        "shared_memory_per_sm_bytes": getattr(p, "shared_memory_per_multiprocessor", None),
        "registers_per_sm": getattr(p, "regs_per_multiprocessor", None),
        "max_threads_per_sm": getattr(p, "max_threads_per_multi_processor", None),
        "warp_size": getattr(p, "warp_size", 32),
        "max_sm_clock_mhz": nvidia_smi("clocks.max.sm"),
        "max_memory_clock_mhz": nvidia_smi("clocks.max.memory"),
    }


def measure_device() -> dict:
    """The GPU's properties, its copy bandwidth and its matrix-multiply rates, measured now (the 'device'
    measurement): ``{"properties", "copy_bandwidth_gbps", "copy_bytes", "matmul", "notes"}``."""
    props = device_properties()
    n = 1 << 30  # a 4 GiB device-to-device copy moves 8 GiB (read + write)
    copy_gbps = copy_bandwidth_gbps(n)

    matmul = {}
    M = 8192
    for label, dtype, tf32 in (("float16", torch.float16, False), ("bfloat16", torch.bfloat16, False),
                               ("float32_tf32", torch.float32, True), ("float32_ieee", torch.float32, False)):
        ms = _matmul_ms(M, dtype, tf32)
        matmul[label] = {"tflops": 2 * M**3 / (ms * 1e-3) / 1e12, "ms": ms, "shape": [M, M, M]}
    torch.cuda.empty_cache()
    return {"properties": props, "copy_bandwidth_gbps": copy_gbps,
            "copy_bytes": 2 * n * 4, "matmul": matmul,
            "notes": "copy: bytes read + written over do_bench median time; matmul: torch @ on random data"}


def hardware_numbers(source: str | None = None, *, gpu: str | None = None) -> dict:
    """The memory hierarchy and the measured ceilings of the GPU in use, or of the recorded one.

    ``source``: ``"live"`` (measure now; needs GPU mode), ``"recorded"`` (read
    ``flashattn.recorded.get("device")``), or None: live in GPU mode, recorded otherwise.
    ``gpu`` picks a recorded file. The live numbers come from :func:`measure_device`, the function the
    recorded ``device`` measurement ran.

    Returns a dict with ``name``, ``source``, ``label`` (where the numbers come from),
    ``multiprocessors``, ``l2_cache_bytes``, ``shared_memory_per_sm_bytes``,
    ``shared_memory_per_block_optin_bytes``, ``registers_per_sm``, ``register_bytes_per_sm``,
    ``max_threads_per_sm``, ``total_memory_bytes``, ``max_sm_clock_mhz`` (or None),
    ``copy_bandwidth_gbps`` (bytes read + written per second by a device-to-device copy, in GB/s),
    ``matmul_tflops`` (``{"float16", "bfloat16", "float32_tf32", "float32_ieee"}`` → TFLOP/s, None
    where the GPU could not run it) and ``matmul_shape``.
    """
    if source is None:
        source = "live" if runtime.MODE == "gpu" else "recorded"
    if source == "recorded":
        return _recorded_numbers(gpu)
    if source == "live":
        if runtime.MODE != "gpu":
            raise RuntimeError("hardware_numbers('live') needs GPU mode; in interpreter mode use "
                               "source='recorded' (the recorded GPU results)")
        entry = measure_device()
        return _hardware_dict(entry["properties"], entry["copy_bandwidth_gbps"], entry["matmul"], source="live",
                              label=f"measured live on {entry['properties']['name']} (torch {torch.__version__})")
    raise ValueError(f"source must be 'live', 'recorded' or None, got {source!r}")


def _hardware_dict(props: dict, copy_gbps: float, matmul: dict, *, source: str, label: str) -> dict:
    regs = props.get("registers_per_sm")
    return {
        "name": props.get("name"),
        "source": source,
        "label": label,
        "multiprocessors": props.get("multiprocessors"),
        "l2_cache_bytes": props.get("l2_cache_bytes"),
        "shared_memory_per_sm_bytes": props.get("shared_memory_per_sm_bytes"),
        "shared_memory_per_block_optin_bytes": props.get("shared_memory_per_block_optin_bytes"),
        "registers_per_sm": regs,
        "register_bytes_per_sm": None if regs is None else regs * REGISTER_BYTES,
        "max_threads_per_sm": props.get("max_threads_per_sm"),
        "total_memory_bytes": props.get("total_memory_bytes"),
        "max_sm_clock_mhz": recorded.number(props.get("max_sm_clock_mhz")),  # nvidia-smi's string
        "copy_bandwidth_gbps": copy_gbps,
        "matmul_tflops": {name: (m or {}).get("tflops") for name, m in matmul.items()},
        "matmul_shape": next((m["shape"] for m in matmul.values() if m and "shape" in m), None),
    }


def _recorded_numbers(gpu: str | None) -> dict:
    entry = recorded.get("device", gpu)
    return _hardware_dict(entry["properties"], entry["copy_bandwidth_gbps"], entry["matmul"],
                          source="recorded", label=recorded.label(entry))
