"""The core measurements ``python -m flashattn.record`` runs on a GPU: the device, memory against N, and
every variant side by side (notebooks 00, 02, 04 to 06)."""

from __future__ import annotations

import torch

from flashattn import runtime
from flashattn.bench import call, memory_vs_n, tflops, time_ms
from flashattn.kernels import registry
from flashattn.measure.hardware import measure_device
from flashattn.record import measurement
from flashattn.reference import reference, rel_error

# memory against N: one kernel per loop order (v2_kt and the others allocate what v2 allocates), and SDPA
MEMORY_VARIANTS = ("naive", "v1", "v2", "sdpa")


@measurement("device", description="device properties, copy bandwidth and matrix-multiply rates")
def device() -> dict:
    return measure_device()


@measurement("memory_vs_n", description="time and peak memory of naive, v1, v2 and SDPA against N")
def memory_vs_n_entry() -> dict:
    result = memory_vs_n((1024, 2048, 4096, 8192, 16384, 32768, 65536), MEMORY_VARIANTS, B=1, H=16, D=64,
                         dtype=torch.float16, max_n={"v1": 16384}, rep=50)
    return {**result, "notes": "peak = torch.cuda.max_memory_allocated during one call, minus what was allocated "
                               "before it (the inputs); time = do_bench median; v1 (one program per head) "
                               "only up to N = 16384"}


def _variant_table(dtypes, Ds, Ns, BN_total, variants, options=None, causal_modes=(False, True)):
    rows = []
    for dtype in dtypes:
        for D in Ds:
            for N in Ns:
                B, H = max(1, BN_total // N), 16
                q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N + D, device="cuda")
                for causal in causal_modes:
                    ref = reference(q, k, v, causal=causal)
                    for name in variants:
                        opts = dict(options or {}) if name != "sdpa" else {}
                        row = {"variant": name, "dtype": str(dtype).replace("torch.", ""), "B": B, "H": H,
                               "N": N, "D": D, "causal": causal, **opts}
                        try:
                            fn = call(name, q, k, v, causal=causal, **opts)
                            row["rel_error"] = rel_error(fn(), ref)
                            row["ms"] = time_ms(fn, rep=50)
                            row["tflops"] = tflops(B, H, N, D, row["ms"], causal)
                        except Exception as err:  # noqa: BLE001 - a failure is itself a result
                            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                        rows.append(row)
                    del ref
                del q, k, v
                torch.cuda.empty_cache()
    return rows


@measurement("variants_16bit", description="every modelled variant against SDPA, fp16 and bf16, D 64/128, N 1k-16k")
def variants_16bit() -> dict:
    rows = _variant_table((torch.float16, torch.bfloat16), (64, 128), (1024, 4096, 16384), 16384,
                          (*registry.names(traffic=True), "sdpa"))
    return {"rows": rows, "flop_convention": "4*B*H*N^2*D (half when causal)",
            "notes": "B*N = 16384, H = 16; default options of each variant; do_bench median; "
                     "rel_error = ||out - ref|| / ||ref|| against the float64 reference"}


@measurement("variants_fp32", description="the CUDA-core path: float32 with input_precision ieee (and tf32)")
def variants_fp32() -> dict:
    rows = _variant_table((torch.float32,), (32, 64), (2048,), 4 * 2048, registry.names(traffic=True),
                          options={"input_precision": "ieee"}, causal_modes=(False,))
    rows += _variant_table((torch.float32,), (32, 64), (2048,), 4 * 2048, ("v2", "v2_kt"),
                           options={"input_precision": "tf32"}, causal_modes=(False,))
    rows += _variant_table((torch.float32,), (32, 64), (2048,), 4 * 2048, ("sdpa",), causal_modes=(False,))
    return {"rows": rows, "flop_convention": "4*B*H*N^2*D",
            "notes": "B=4, H=16, N=2048; BLOCK 64x64 (the default for float32 on a GPU); "
                     "sdpa in float32 is PyTorch's own choice of kernel"}
