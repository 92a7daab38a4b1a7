"""Ring attention's steps on one GPU (notebook 16): what the ring adds besides communication, a check of every
rank's steps at full size, and a modelled scaling on W GPUs.

* ``steps``: each kind of step one rank runs (``flashattn.distributed.layouts``: the full pair, the causal diagonal,
  the zigzag halves) timed forward and backward at N_local = 8192 and 32768 with the ring's own kernels
  (``fast``), and the float32 merge (forward) and accumulation (backward) after each step;
* ``one_gpu``: ``fast`` forward and backward on the whole sequence N = W·N_local (measured up to
  :data:`ONE_GPU_MAX_N`; beyond, extrapolated as N² from the largest measured, and marked so);
* ``compute``: per W and layout, the sum over steps of the slowest rank's kernels and merges, against one GPU's
  time divided by W: the ring's compute efficiency without any communication;
* ``model``: ``flashattn.models.ring`` on those step times, for each link in ``models.ring.LINKS`` (a model,
  labelled so: the measured multi-GPU run is issue 33's);
* ``check``: the ring on W simulated ranks in this process (``distributed.simulate_attention``: every rank's steps on
  this GPU, transfers as copies) against float64 attention and against ``fast`` on the whole sequence.

Timing: every function of one N_local in interleaved rounds (as ``bench.time_rounds``), each round timing a
function over enough calls for ~20 ms with CUDA events. Not ``do_bench``: its five estimating runs of a 0.3 s
kernel alone would cost this call a minute.
"""

from __future__ import annotations

import statistics
import time

import torch

from flashattn import runtime
from flashattn.distributed import layouts, ring, steps
from flashattn.models import ring as ring_model
from flashattn.models.roofline import attention_flops
from flashattn.record import measurement
from flashattn.reference import rel_error

PROBLEM = dict(B=1, H=32, Hkv=32, D=128, dtype="float16")
N_LOCALS = (8192, 32768)
WORLD_SIZES = (2, 4, 8)
ONE_GPU_MAX_N = 65536
KINDS = ("full", "diagonal", "first key chunk", "second query chunk", "half square")
CHECK = dict(world_size=4, n_local=4096, cases=(("contiguous", True, 32), ("zigzag", True, 32), ("zigzag", False, 32),
                                                 ("zigzag", True, 8)))  # (layout, causal, Hkv) with H = 32
ROUNDS = 3
TARGET_MS = 20.0
BUDGET_S = 170.0  # past this, the larger N_local is skipped (and recorded as skipped): the call stays under 4 min


def kind_shape(kind: str, n: int) -> tuple[int, int, bool]:
    """(L, S, causal) of one step of ``kind`` on shards of ``n`` positions ("half square": half against half, the
    other way to compute a zigzag half, as two square calls)."""
    half = n // 2
    return {"full": (n, n, False), "diagonal": (n, n, True), "first key chunk": (n, half, False),
            "second query chunk": (half, n, False), "half square": (half, half, False)}[kind]


def _elapsed_ms(fn, calls: int, device) -> float:
    """ms per call over ``calls`` calls: CUDA events on a GPU, the wall clock elsewhere (the host logic's tests)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) * 1e3 / calls
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def time_rounds(fns: dict, device, rounds: int = ROUNDS) -> dict:
    """Median ms per call of each ``fns[name]()``, timed in interleaved rounds."""
    calls = {}
    for name, fn in fns.items():  # the first call warms up (compiles, tunes); the second sets how many make ~20 ms
        fn()
        calls[name] = max(1, min(50, round(TARGET_MS / max(_elapsed_ms(fn, 1, device), 1e-3))))
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(_elapsed_ms(fn, calls[name], device))
    return {name: statistics.median(t) for name, t in times.items()}


def _random(shape, dtype, seed, device):
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def step_functions(n: int, kernels: steps.StepKernels, B, H, Hkv, D, dtype, device) -> dict:
    """Functions of no arguments: each kind's forward and backward, the merge and the accumulation after a step."""
    scale, fns = D ** -0.5, {}
    for i, kind in enumerate(KINDS):
        L, S, causal = kind_shape(kind, n)
        q, do = _random((B, H, L, D), dtype, 10 * i, device), _random((B, H, L, D), dtype, 10 * i + 1, device)
        k, v = _random((B, Hkv, S, D), dtype, 10 * i + 2, device), _random((B, Hkv, S, D), dtype, 10 * i + 3, device)
        o, lse = kernels.forward(q, k, v, causal=causal, scale=scale)
        fns[("forward", kind)] = lambda q=q, k=k, v=v, c=causal: kernels.forward(q, k, v, causal=c, scale=scale)
        fns[("backward", kind)] = (lambda q=q, k=k, v=v, o=o, lse=lse, do=do, c=causal:
                                   kernels.backward(q, k, v, o, lse, do, causal=c, scale=scale))
    o_run = torch.randn(B, H, n, D, device=device)
    lse_run = torch.randn(B, H, n, device=device)
    o_s, lse_s = _random((B, H, n, D), dtype, 90, device), torch.randn(B, H, n, device=device)
    dq, dk, dv = (torch.zeros(B, h, n, D, device=device) for h in (H, Hkv, Hkv))
    part_q, part_kv = _random((B, H, n, D), dtype, 91, device), _random((B, Hkv, n, D), dtype, 92, device)
    for name, rows in (("all rows", slice(0, n)), ("half rows", slice(n // 2, n))):
        def merge(rows=rows):
            o_run[:, :, rows], lse_run[:, :, rows] = steps.merge_partial(o_run[:, :, rows], lse_run[:, :, rows],
                                                                         o_s[:, :, rows], lse_s[:, :, rows])

        def accumulate(rows=rows):
            dq[:, :, rows] += part_q[:, :, rows]
            dk.add_(part_kv)
            dv.add_(part_kv)

        fns[("merge", name)], fns[("accumulate", name)] = merge, accumulate
    return fns


def one_gpu_functions(N: int, kernels: steps.StepKernels, B, H, Hkv, D, dtype, device) -> dict:
    scale, fns = D ** -0.5, {}
    q, do = _random((B, H, N, D), dtype, 1, device), _random((B, H, N, D), dtype, 2, device)
    k, v = _random((B, Hkv, N, D), dtype, 3, device), _random((B, Hkv, N, D), dtype, 4, device)
    for causal in (False, True):
        o, lse = kernels.forward(q, k, v, causal=causal, scale=scale)
        fns[("forward", causal)] = lambda c=causal: kernels.forward(q, k, v, causal=c, scale=scale)
        fns[("backward", causal)] = lambda o=o, lse=lse, c=causal: kernels.backward(q, k, v, o, lse, do, causal=c,
                                                                                    scale=scale)
    return fns


def check_at_full_size(kernels, world_size: int, n_local: int, cases, H: int, D: int, dtype, device) -> list[dict]:
    """The ring simulated on ``world_size`` ranks against float64 attention (the first K/V head and its query heads)
    and against ``kernels`` on the whole sequence in one call (every head)."""
    rows, N, scale = [], world_size * n_local, D ** -0.5
    for layout, causal, Hkv in cases:
        q, do = _random((1, H, N, D), dtype, 5, device), _random((1, H, N, D), dtype, 6, device)
        k, v = _random((1, Hkv, N, D), dtype, 7, device), _random((1, Hkv, N, D), dtype, 8, device)
        o, grads = ring.simulate_attention(q, k, v, world_size, causal=causal, layout=layout, kernels=kernels, do=do)
        o1, lse1 = kernels.forward(q, k, v, causal=causal, scale=scale)
        grads1 = kernels.backward(q, k, v, o1, lse1, do, causal=causal, scale=scale)
        group = H // Hkv
        heads = (slice(None), slice(0, group))
        q64, k64, v64 = (t[:, :1].double().requires_grad_() if t.shape[1] == Hkv else t[heads].double().requires_grad_()
                         for t in (q, k, v))
        o64 = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, enable_gqa=group > 1)
        o64.backward(do[heads].double())
        ref = (o64, q64.grad, k64.grad, v64.grad)
        pick = (heads, heads, (slice(None), slice(0, 1)), (slice(None), slice(0, 1)))
        ring_err = {name: rel_error(x[p], r) for name, x, r, p in zip(("o", "dq", "dk", "dv"), (o, *grads), ref, pick,
                                                                       strict=True)}
        single_err = {name: rel_error(x[p], r) for name, x, r, p in zip(("o", "dq", "dk", "dv"), (o1, *grads1), ref,
                                                                         pick, strict=True)}
        vs_single = {name: rel_error(x, y) for name, x, y in zip(("o", "dq", "dk", "dv"), (o, *grads), (o1, *grads1),
                                                                  strict=True)}
        rows.append({"world_size": world_size, "n_local": n_local, "layout": layout, "causal": causal, "H": H,
                     "Hkv": Hkv, "ring_vs_float64": ring_err, "single_vs_float64": single_err,
                     "ring_vs_single": vs_single,
                     "ok": all(ring_err[x] <= 3 * single_err[x] + 1e-4 for x in ring_err)})
        del q, k, v, do, o, grads, o1, grads1
        _empty_cache(device)
    return rows


def modelled(step_ms: dict, one_gpu_ms: dict, B, Hkv, D, dtype_bytes) -> tuple[list, list]:
    """The compute-only table (sum of the slowest rank's steps against one GPU / W) and the link model's table."""
    compute, model = [], []
    for n in sorted(step_ms):
        fwd_k = {kind: step_ms[n][("forward", kind)] for kind in KINDS}
        bwd_k = {kind: step_ms[n][("backward", kind)] for kind in KINDS}
        merge = {r: step_ms[n][("merge", r)] for r in ("all rows", "half rows")}
        acc = {r: step_ms[n][("accumulate", r)] for r in ("all rows", "half rows")}
        for W in WORLD_SIZES:
            N = W * n
            if N not in one_gpu_ms:
                continue
            for layout in layouts.LAYOUTS:
                for causal in (False, True):
                    one = one_gpu_ms[N]
                    f_c = ring_model.step_compute(W, layout, causal, fwd_k, merge, n)
                    b_c = ring_model.step_compute(W, layout, causal, bwd_k, acc, n)
                    one_f, one_fb = one[("forward", causal)], one[("forward", causal)] + one[("backward", causal)]
                    base = {"n_local": n, "world_size": W, "N": N, "layout": layout, "causal": causal,
                            "one_gpu_source": one["source"]}
                    compute.append({**base, "forward_ms": sum(f_c), "forward_backward_ms": sum(f_c) + sum(b_c),
                                    "one_gpu_forward_ms": one_f, "one_gpu_forward_backward_ms": one_fb,
                                    "efficiency_forward": ring_model.efficiency(one_f, W, sum(f_c)),
                                    "efficiency_forward_backward": ring_model.efficiency(one_fb, W,
                                                                                         sum(f_c) + sum(b_c))})
                    for link, (bandwidth, _) in ring_model.LINKS.items():
                        m = ring_model.ring_model(W, layout, causal, forward_kernel_ms=fwd_k, backward_kernel_ms=bwd_k,
                                                  B=B, Hkv=Hkv, n_local=n, D=D, dtype_bytes=dtype_bytes,
                                                  link_bytes_per_s=bandwidth, merge_ms=merge, accumulate_ms=acc)
                        model.append({**base, "link": link, "forward_ms": m["forward_ms"],
                                      "forward_backward_ms": m["forward_backward_ms"],
                                      "kv_transfer_ms": m["kv_transfer_ms"], "dkv_transfer_ms": m["dkv_transfer_ms"],
                                      "efficiency_forward": ring_model.efficiency(one_f, W, m["forward_ms"]),
                                      "efficiency_forward_backward": ring_model.efficiency(
                                          one_fb, W, m["forward_backward_ms"])})
    return compute, model


def _empty_cache(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(problem: dict = PROBLEM, n_locals=N_LOCALS, world_sizes=WORLD_SIZES, one_gpu_max_n=ONE_GPU_MAX_N,
            check: dict = CHECK, budget_s: float = BUDGET_S, progress=print) -> dict:
    """Everything the module docstring lists, with the ring's default kernels, on ``runtime.DEVICE`` (the
    registered measurement runs it on a GPU; the tests run its host logic in the interpreter at tiny sizes)."""
    t0, device = time.perf_counter(), runtime.DEVICE
    kernels = steps.get(None)
    B, H, Hkv, D = (problem[k] for k in ("B", "H", "Hkv", "D"))
    dtype = getattr(torch, problem["dtype"])
    out = {"problem": dict(problem), "kernels": kernels.name, "kinds": list(KINDS), "skipped": []}
    out["check"] = check_at_full_size(kernels, check["world_size"], check["n_local"], check["cases"], H, D, dtype,
                                      device)
    progress(f"  check ({time.perf_counter() - t0:.0f} s): " + ", ".join(
        f"{r['layout']} {'causal' if r['causal'] else 'full'} Hkv={r['Hkv']}: "
        f"{'ok' if r['ok'] else 'NOT OK'} (o {r['ring_vs_float64']['o']:.1e} vs one call "
        f"{r['single_vs_float64']['o']:.1e}, dk {r['ring_vs_float64']['dk']:.1e} vs "
        f"{r['single_vs_float64']['dk']:.1e})" for r in out["check"]))
    step_ms, one_gpu_ms, steps_rows = {}, {}, []
    for n in n_locals:
        if time.perf_counter() - t0 > budget_s:
            out["skipped"].append(f"N_local={n}: the call had run {time.perf_counter() - t0:.0f} s "
                                  f"(budget {budget_s} s)")
            continue
        step_ms[n] = time_rounds(step_functions(n, kernels, B, H, Hkv, D, dtype, device), device)
        for kind in KINDS:
            L, S, causal = kind_shape(kind, n)
            flops = attention_flops(B, H, 1, D, False) * L * S / (2 if causal else 1)
            steps_rows.append({"n_local": n, "kind": kind, "L": L, "S": S, "causal": causal,
                               "forward_ms": step_ms[n][("forward", kind)],
                               "backward_ms": step_ms[n][("backward", kind)],
                               "forward_tflops": flops / (step_ms[n][("forward", kind)] * 1e-3) / 1e12})
        for W in world_sizes:
            N = W * n
            if N <= one_gpu_max_n and N not in one_gpu_ms:
                fns = one_gpu_functions(N, kernels, B, H, Hkv, D, dtype, device)
                one_gpu_ms[N] = {**time_rounds(fns, device), "source": "measured"}
                del fns
                _empty_cache(device)
        progress(f"  N_local={n} ({time.perf_counter() - t0:.0f} s): " + ", ".join(
            f"{kind} {step_ms[n][('forward', kind)]:.2f}/{step_ms[n][('backward', kind)]:.2f} ms" for kind in KINDS))
    if one_gpu_ms:
        largest = max(one_gpu_ms)
        for n in step_ms:
            for W in world_sizes:
                N = W * n
                if N not in one_gpu_ms:
                    factor = (N / largest) ** 2
                    one_gpu_ms[N] = {**{key: ms * factor for key, ms in one_gpu_ms[largest].items() if key != "source"},
                                     "source": f"extrapolated as N² from N={largest}"}
    compute, model = modelled(step_ms, one_gpu_ms, B, Hkv, D, torch.finfo(dtype).bits // 8)
    out.update(
        steps=steps_rows,
        merge_ms=[{"n_local": n, "rows": r, "merge_ms": step_ms[n][("merge", r)],
                   "accumulate_ms": step_ms[n][("accumulate", r)]} for n in step_ms for r in ("all rows", "half rows")],
        one_gpu=[{"N": N, "causal": c, "forward_ms": ms[("forward", c)], "backward_ms": ms[("backward", c)],
                  "source": ms["source"]} for N, ms in sorted(one_gpu_ms.items()) for c in (False, True)],
        compute=compute, model=model,
        links={name: {"bytes_per_s": bw, "source": src} for name, (bw, src) in ring_model.LINKS.items()},
        latency_s=ring_model.LATENCY_S, seconds=time.perf_counter() - t0,
        notes="steps: one rank's kernels per kind of step (flashattn.distributed.layouts), timed in interleaved rounds "
              "with CUDA events; compute: the sum over steps of the slowest rank's kernels and merges (no "
              "communication) against one GPU's time for the whole sequence / W; model: flashattn.models.ring (a "
              "MODEL from these times and a link bandwidth, not a multi-GPU measurement); check: the ring simulated "
              "on this GPU (every rank's steps, transfers as copies) against float64 attention on the first K/V head "
              "and its query heads, and against one call of the same kernels on the whole sequence")
    return out


@measurement("ring_steps", description="ring attention's steps on one GPU (fp16, H 32, D 128, N_local 8k/32k): "
                                       "per-step times, a full-size check of every rank, a modelled scaling on W GPUs")
def ring_steps() -> dict:
    if runtime.MODE != "gpu":
        raise RuntimeError("ring_steps measures a GPU; notebook 16 shows the recorded result instead")
    result = measure()
    for row in result["compute"]:
        if row["causal"] and row["layout"] == "zigzag" or not row["causal"] and row["layout"] == "contiguous":
            print(f"  W={row['world_size']} N_local={row['n_local']} {row['layout']} "
                  f"{'causal' if row['causal'] else 'full'}: compute efficiency fwd {row['efficiency_forward']:.2f}, "
                  f"fwd+bwd {row['efficiency_forward_backward']:.2f} ({row['one_gpu_source']})", flush=True)
    return result

