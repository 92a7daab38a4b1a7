"""The measurements ``python -m flashattn.record`` runs on a GPU (each registered by name)."""

from __future__ import annotations

import torch

from flashattn import runtime
from flashattn.bench import peak_memory, sdpa, tflops, time_ms
from flashattn.kernels import VARIANTS
from flashattn.record import measurement, nvidia_smi
from flashattn.reference import reference


def _run_variant(name, q, k, v, causal, **options):
    if name == "sdpa":
        return lambda: sdpa(q, k, v, causal=causal)
    fn = VARIANTS[name]
    return lambda: fn(q, k, v, causal=causal, **options)


def _copy_ms(n: int) -> float:
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    return time_ms(lambda: dst.copy_(src))


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


@measurement("device", description="device properties, copy bandwidth and matrix-multiply rates")
def device() -> dict:
    props = device_properties()
    n = 1 << 30  # a 4 GiB device-to-device copy moves 8 GiB (read + write)
    ms = _copy_ms(n)
    copy_gbps = 2 * n * 4 / (ms * 1e-3) / 1e9

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


@measurement("memory_vs_n", description="time and peak memory of naive, v1, v2 and SDPA against N")
def memory_vs_n() -> dict:
    B, H, D, dtype = 1, 16, 64, torch.float16
    rows = []
    stopped = set()
    for N in (1024, 2048, 4096, 8192, 16384, 32768, 65536):
        q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N, device="cuda")
        for name in ("naive", "v1", "v2", "sdpa"):
            row = {"variant": name, "N": N}
            if name in stopped or (name == "v1" and N > 16384):
                continue
            fn = _run_variant(name, q, k, v, False)
            try:
                row["peak_bytes_above_inputs"] = peak_memory(fn)
                row["ms"] = time_ms(fn, rep=50)
            except torch.cuda.OutOfMemoryError as err:
                row["oom"] = str(err).splitlines()[0]
                stopped.add(name)
            torch.cuda.empty_cache()
            row["input_bytes"] = 3 * q.numel() * q.element_size()
            row["output_bytes"] = q.numel() * q.element_size()
            rows.append(row)
        del q, k, v
        torch.cuda.empty_cache()
    return {"B": B, "H": H, "D": D, "dtype": "float16", "causal": False, "rows": rows,
            "notes": "peak = torch.cuda.max_memory_allocated during one call, minus what was allocated "
                     "before it (the inputs); time = do_bench median"}


def _variant_table(dtypes, Ds, Ns, BN_total, variants, options=None, causal_modes=(False, True)):
    rows = []
    for dtype in dtypes:
        for D in Ds:
            for N in Ns:
                B, H = max(1, BN_total // N), 16
                q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N + D, device="cuda")
                for causal in causal_modes:
                    ref = reference(q, k, v, causal=causal).double()
                    for name in variants:
                        opts = dict(options or {}) if name != "sdpa" else {}
                        row = {"variant": name, "dtype": str(dtype).replace("torch.", ""), "B": B, "H": H,
                               "N": N, "D": D, "causal": causal, **opts}
                        try:
                            fn = _run_variant(name, q, k, v, causal, **opts)
                            out = fn().double()
                            row["rel_error"] = ((out - ref).norm() / ref.norm()).item()
                            row["ms"] = time_ms(fn, rep=50)
                            row["tflops"] = tflops(B, H, N, D, row["ms"], causal)
                        except Exception as err:  # noqa: BLE001 - a failure is itself a result
                            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                        rows.append(row)
                    del ref
                del q, k, v
                torch.cuda.empty_cache()
    return rows


@measurement("variants_16bit", description="every variant against SDPA, fp16 and bf16, D 64/128, N 1k-16k")
def variants_16bit() -> dict:
    rows = _variant_table((torch.float16, torch.bfloat16), (64, 128), (1024, 4096, 16384), 16384,
                          ("naive", "v1", "v2", "v2_kt", "v2_kt_view", "v2_padded", "sdpa"))
    return {"rows": rows, "flop_convention": "4*B*H*N^2*D (half when causal)",
            "notes": "B*N = 16384, H = 16; default options of each variant; do_bench median; "
                     "rel_error = ||out - ref|| / ||ref|| against the float64 reference"}


@measurement("variants_fp32", description="the CUDA-core path: float32 with input_precision ieee (and tf32)")
def variants_fp32() -> dict:
    names = ("naive", "v1", "v2", "v2_kt", "v2_kt_view", "v2_padded")
    rows = _variant_table((torch.float32,), (32, 64), (2048,), 4 * 2048, names,
                          options={"input_precision": "ieee"}, causal_modes=(False,))
    rows += _variant_table((torch.float32,), (32, 64), (2048,), 4 * 2048, ("v2", "v2_kt"),
                           options={"input_precision": "tf32"}, causal_modes=(False,))
    rows += _variant_table((torch.float32,), (32, 64), (2048,), 4 * 2048, ("sdpa",), causal_modes=(False,))
    return {"rows": rows, "flop_convention": "4*B*H*N^2*D",
            "notes": "B=4, H=16, N=2048; BLOCK 64x64 (the default for float32 on a GPU); "
                     "sdpa in float32 is PyTorch's own choice of kernel"}
