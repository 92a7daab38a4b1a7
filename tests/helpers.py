"""Shared by the tests: tolerances and fresh random inputs."""

import torch

from flashattn import runtime
from flashattn.reference import rel_error as _rel_error

# ||out - ref|| / ||ref|| against the float64 reference, per input dtype:
# float32: computed in float32 throughout (IEEE dot): rounding ~1e-7 per op, N-term sums -> 1e-5 is ample.
# float16: 11-bit mantissa (unit roundoff 4.9e-4); the output and P are rounded to float16, and v1 rounds its
#   partial output to float16 once per K/V block: measured 2e-4..9e-4, so 3e-3.
# bfloat16: 8-bit mantissa (unit roundoff 3.9e-3), same structure: 2e-2.
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if runtime.MODE == "gpu" else [])


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``flashattn.reference.rel_error``, asserting first what it would report as inf (a clearer failure)."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "output has NaN or inf"
    return _rel_error(out, ref)


def qkv(B, H, N, D, dtype, seed, contiguous=True):
    """Fresh random inputs; non-contiguous ones are (B, N, H, D) storage seen as (B, H, N, D)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for _ in range(3):
        if contiguous:
            t = torch.randn(B, H, N, D, generator=gen)
        else:
            t = torch.randn(B, N, H, D, generator=gen).transpose(1, 2)
        tensors.append(t.to(device=runtime.DEVICE, dtype=dtype))
    return tensors


def toy_hardware(clock=1000.0):
    """A made-up GPU for the roofline model and its plots: small round numbers, one unknown peak."""
    return {"name": "Toy GPU", "label": "toy numbers", "multiprocessors": 2, "l2_cache_bytes": 4096,
            "shared_memory_per_sm_bytes": 1024, "registers_per_sm": 100, "register_bytes_per_sm": 400,
            "total_memory_bytes": 3 * 2**30, "max_sm_clock_mhz": clock, "copy_bandwidth_gbps": 2000.0,
            "matmul_tflops": {"float16": 100.0, "float32_ieee": 10.0, "bfloat16": None}}
