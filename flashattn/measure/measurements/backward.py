"""The backward pass against SDPA's (notebook 12): time, throughput, errors and peak memory.

FLOP convention: a backward pass is counted as 2.5 forward passes (the FlashAttention papers': five
N×N×D matrix products against the forward's two), so 2.5·4·B·H·N²·D, half of that when causal;
forward+backward as 3.5 forward passes.
"""

from __future__ import annotations

import statistics

import torch

from flashattn import bench, runtime
from flashattn.functional import scaled_dot_product_attention
from flashattn.kernels.backward import attention_backward
from flashattn.kernels.fast import attention_fast
from flashattn.kernels.fast_backward import attention_backward_fast, gluon_refusal, picked_tiles
from flashattn.kernels.v2 import attention_v2
from flashattn.measure import backward_kernels
from flashattn.measure.profile import NcuUnavailable
from flashattn.models.roofline import attention_flops
from flashattn.record import measurement
from flashattn.reference import rel_error

BACKWARD_FACTOR, TRAINING_FACTOR = 2.5, 3.5  # FLOP of a backward, of a forward+backward, in forward passes
# backward alone: SDPA's, the fast backward's default (on Hopper the Gluon kernel, fast_backward_gluon.py),
# its Triton kernels (fast_backward.py, gluon=False) and the teaching kernel (backward.py, from v2's forward)
KERNELS = ("sdpa", "fast", "fast_triton", "teaching")


def _grads_float64(q, k, v, do, causal):
    """dq, dk, dv by torch's autograd in float64 (the reference)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal).backward(do.double())
    return q64.grad, k64.grad, v64.grad


def _backward_fns(q, k, v, do, causal) -> tuple[dict, dict]:
    """Functions of no arguments timing each backward alone, and each forward+backward; both return grads."""
    leaves = {name: tuple(t.detach().clone().requires_grad_() for t in (q, k, v)) for name in ("sdpa", "fast")}
    graph = torch.nn.functional.scaled_dot_product_attention(*leaves["sdpa"], is_causal=causal)
    o, lse = attention_fast(q, k, v, causal=causal, return_lse=True)
    o2, lse2 = attention_v2(q, k, v, causal=causal, return_lse=True)
    backward = {
        "sdpa": lambda: torch.autograd.grad(graph, leaves["sdpa"], do, retain_graph=True),
        "fast": lambda: attention_backward_fast(q, k, v, o, lse, do, causal=causal),
        "fast_triton": lambda: attention_backward_fast(q, k, v, o, lse, do, causal=causal, gluon=False),
        "teaching": lambda: attention_backward(q, k, v, o2, lse2, do, causal=causal),
    }
    training = {
        "sdpa": lambda: torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
            *leaves["sdpa"], is_causal=causal), leaves["sdpa"], do),
        "fast": lambda: torch.autograd.grad(scaled_dot_product_attention(*leaves["fast"], is_causal=causal),
                                            leaves["fast"], do),
    }
    return backward, training


def _time_problem(q, k, v, do, causal: bool, rounds: int) -> dict:
    """One problem's backward and forward+backward times, TFLOP/s and ratios to SDPA, and gradient errors."""
    B, H, N, D = q.shape
    backward, training = _backward_fns(q, k, v, do, causal)
    sl = (slice(0, 1), slice(0, 2))
    ref = _grads_float64(q[sl], k[sl], v[sl], do[sl], causal)
    row = {"rel_error": {}}
    for name, fn in backward.items():  # compile and autotune outside the timing (and check the timed call)
        row["rel_error"][name] = [rel_error(g[sl], r) for g, r in zip(fn(), ref, strict=True)]
    for fn in training.values():
        fn()
    fns = {("", name): fn for name, fn in backward.items()}
    fns.update({("training_", name): fn for name, fn in training.items()})
    times = bench.time_rounds(fns, rounds)
    forward_flops = attention_flops(B, H, N, D, causal)
    for prefix, factor in (("", BACKWARD_FACTOR), ("training_", TRAINING_FACTOR)):
        rounds_ms = {name: t for (p, name), t in times.items() if p == prefix}
        ms = {name: statistics.median(t) for name, t in rounds_ms.items()}
        row.update({f"{prefix}ms_rounds": rounds_ms, f"{prefix}ms": ms,
                    f"{prefix}tflops": {name: factor * forward_flops / (t * 1e-3) / 1e12 for name, t in ms.items()},
                    f"{prefix}vs_sdpa": {name: ms["sdpa"] / t for name, t in ms.items() if name != "sdpa"}})
    return row


def compare_backward(dtypes=bench.BENCH_DTYPES, head_dims=bench.BENCH_HEAD_DIMS, seq_lens=bench.BENCH_SEQ_LENS,
                     causals=(False, True), tokens: int = bench.BENCH_TOKENS, H: int = bench.BENCH_HEADS,
                     rounds: int = bench.BENCH_ROUNDS, progress=None) -> list[dict]:
    """Each backward (:data:`KERNELS`) and each forward+backward (fast, SDPA) on the same inputs, timed in
    interleaved rounds, one problem (dtype, D, N, causal; B = tokens // N) after another, on the GPU.

    Per row: ``ms``/``tflops``/``vs_sdpa`` of the backward alone and ``training_ms``/``training_tflops``/
    ``training_vs_sdpa`` of forward+backward (medians over ``rounds`` interleaved rounds of do_bench's median),
    ``rel_error`` of each kernel's dq, dk, dv on the first two heads of the first batch against float64
    autograd, ``fast_kernel`` ("gluon" or "triton": what the default ran) and ``fast_tiles``, the tiles the
    Triton kernels' autotuning picked."""
    if runtime.MODE != "gpu":
        raise RuntimeError("the backward benchmark needs a GPU; notebook 12 shows the recorded table instead")
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for D in head_dims:
            for N in seq_lens:
                B = tokens // N
                q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N + D)
                do = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N + D + 1)[0]
                for causal in causals:
                    row = {"dtype": dtype_name, "B": B, "H": H, "N": N, "D": D, "causal": causal,
                           **_time_problem(q, k, v, do, causal, rounds)}
                    row["fast_kernel"] = "triton" if gluon_refusal(q, k, v, do, causal, {}) else "gluon"
                    row["fast_tiles"] = {kernel: picked_tiles(kernel, D=D, dtype=dtype, L=N, S=N, B=B, HQ=H, HKV=H,
                                                              causal=causal) for kernel in ("dkdv", "dq")}
                    rows.append(row)
                    if progress:
                        progress(format_row(row))
                del q, k, v, do
                torch.cuda.empty_cache()
    return rows


def format_row(row: dict) -> str:
    """One line: the backward's TFLOP/s and ratio to SDPA per kernel, and forward+backward's ratio."""
    bwd = "".join(f"{row['tflops'][n]:>7.0f}" + (f"{row['vs_sdpa'][n]:>6.2f}" if n != "sdpa" else "")
                  for n in KERNELS)
    return (f"{row['dtype']:<9}{row['D']:>4}{row['N']:>7}{row['B']:>4} {str(row['causal']):<7}{bwd}"
            f"{row['training_vs_sdpa']['fast']:>8.2f}")


def format_header() -> str:
    return (f"{'dtype':<9}{'D':>4}{'N':>7}{'B':>4} {'causal':<7}{'SDPA':>7}{'fast':>7}{'×':>6}{'triton':>7}{'×':>6}"
            f"{'teach':>7}{'×':>6}{'fwd+bwd ×':>10}")


@measurement("fast_backward_vs_sdpa",
             description="fast and teaching backward vs SDPA's, and fast fwd+bwd: fp16/bf16, D 64/128, N 1k-16k")
def fast_backward_vs_sdpa() -> dict:
    print("  " + format_header(), flush=True)
    rows = compare_backward(progress=lambda line: print("  " + line, flush=True))
    return {"rows": rows, "kernels": list(KERNELS), "tokens": bench.BENCH_TOKENS, "rounds": bench.BENCH_ROUNDS,
            "flop_convention": "backward = 2.5 × forward, forward+backward = 3.5 × forward; forward = 4·B·H·N²·D, "
                               "half for causal; TFLOP/s from the median over interleaved rounds of do_bench's median",
            "notes": "one run, on the same inputs; per problem every kernel timed in interleaved rounds; SDPA's "
                     "backward is torch.autograd.grad through its forward graph (cuDNN on the H200); fast is the "
                     "fast backward's default (fast_kernel says which kernel it ran), fast_triton its Triton "
                     "kernels (gluon=False), both given the fast forward's O and log-sum-exp, the teaching one "
                     "v2's; rel_error: "
                     "dq, dk, dv on the first two heads of the first batch against float64 autograd"}


# --- the kernels, as Nsight Compute sees them launched ------------------------------------------------

KERNELS_PROBLEM = dict(B=4, H=16, N=4096, dtype="float16", causal=False)


@measurement("backward_kernels_ncu",
             description="Nsight Compute launch statistics of SDPA's backward kernels and the fast backward's, "
                         "Gluon and Triton "
                         "(fp16, B4 H16 N4096, D 64/128)")
def backward_kernels_ncu() -> dict:
    rows = []
    for D in (64, 128):
        problem = dict(KERNELS_PROBLEM, D=D)
        dtype = getattr(torch, problem["dtype"])
        q, k, v = runtime.random_qkv(problem["B"], problem["H"], problem["N"], D, dtype=dtype, seed_value=D)
        o, lse = attention_fast(q, k, v, causal=problem["causal"], return_lse=True)
        # the Triton kernels autotune on their first call
        attention_backward_fast(q, k, v, o, lse, torch.randn_like(q), causal=problem["causal"], gluon=False)
        pick = dict(D=D, dtype=dtype, L=problem["N"], causal=problem["causal"])
        tiles = {name: picked_tiles(kernel, **pick) for name, kernel in (("dkdv_tiles", "dkdv"), ("dq_tiles", "dq"))}
        tiles = {name: t for name, t in tiles.items() if t is not None}  # None: not autotuned (the defaults)
        for backward in backward_kernels.BACKWARDS:
            cfg = backward_kernels.target_config(backward, **problem,
                                                 tiles=tiles if backward == "fast_triton" else None)
            try:
                launches = backward_kernels.profile_backward(cfg)
            except NcuUnavailable as err:
                return {"rows": [], "error": str(err)}
            rows.append({**cfg, "kernels": [{"kernel": x["kernel"], "grid": x["grid"], "block": x["block"],
                                             "metrics": x["metrics"]} for x in launches]})
            total = sum(backward_kernels.kernel_summary(x)["ms"] for x in launches)
            print(f"  D={D} {backward}: {len(launches)} kernels, {total:.3f} ms", flush=True)
    return {"rows": rows, "metrics": backward_kernels.METRICS,
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
            "notes": "ncu --clock-control none, kernels matching " + backward_kernels.KERNEL_REGEX + "; the second "
                     "of two calls; SDPA's backward through torch.autograd.grad; fast: the fast backward's default "
                     "(on Hopper the Gluon kernel), fast_triton: its Triton kernels (gluon=False) with the tiles "
                     "autotuning picked in the recording process; both given the fast forward's O and log-sum-exp"}

# --- memory -----------------------------------------------------------------------------------------


MEMORY_N = (1024, 2048, 4096, 8192, 16384)
MEMORY = dict(B=1, H=16, D=64, dtype="float16")


def pytorch_attention(q, k, v, causal=False):
    """The four-line attention of notebook 02, whose autograd stores S and P (N×N each)."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        N = q.shape[-2]
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def saved_for_backward_bytes(fn, *inputs) -> int:
    """Bytes of the tensors autograd keeps for the backward pass while ``fn(*inputs)`` runs forward (each
    storage counted once): runs anywhere, no GPU needed. The inputs should require gradients."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(storages.values())


def training_step_memory(fn, q, k, v, do) -> int:
    """Peak bytes above the inputs (and dO) while ``fn`` runs forward and backward on fresh leaves."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def step():
        torch.autograd.grad(fn(*leaves), leaves, do)

    step()  # compile and autotune first: the autotuner's own buffers are not the step's memory
    return bench.peak_memory(step)


@measurement("backward_memory_vs_n", description="peak memory of forward+backward against N: fast, SDPA and "
                                                 "PyTorch's four lines (fp16, B1 H16 D64)")
def backward_memory_vs_n() -> dict:
    dtype = getattr(torch, MEMORY["dtype"])
    fns = {"fast": lambda q, k, v: scaled_dot_product_attention(q, k, v),
           "sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v),
           "pytorch": pytorch_attention}
    rows, stopped = [], set()
    for N in MEMORY_N:
        q, k, v = runtime.random_qkv(MEMORY["B"], MEMORY["H"], N, MEMORY["D"], dtype=dtype, seed_value=N)
        do = runtime.random_qkv(MEMORY["B"], MEMORY["H"], N, MEMORY["D"], dtype=dtype, seed_value=N + 1)[0]
        for name, fn in fns.items():
            if name in stopped:
                continue
            row = {"variant": name, "N": N, "input_bytes": 4 * q.numel() * q.element_size()}
            try:
                row["peak_bytes_above_inputs"] = training_step_memory(fn, q, k, v, do)
            except torch.cuda.OutOfMemoryError as err:
                row["oom"] = str(err).splitlines()[0]
                stopped.add(name)
            torch.cuda.empty_cache()
            rows.append(row)
            print(f"  N={N} {name}: {row.get('peak_bytes_above_inputs', row.get('oom'))}", flush=True)
    return {**MEMORY, "causal": False, "rows": rows,
            "notes": "peak torch.cuda memory above q, k, v and dO while a fresh forward and backward run (the "
                     "gradients dq, dk, dv included: 3 tensors of the inputs' size)"}
