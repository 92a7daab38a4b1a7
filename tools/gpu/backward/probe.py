"""GPU probe for the backward pass (issue 18), for the lead to run on the H200 in one go (about 5 minutes):

    python tools/gpu/backward/probe.py            # details in $OUT/probe.json and $OUT/probe.log

1. compiles every kernel the later phases launch, in parallel worker processes (Triton's disk cache then
   serves the main process);
2. correctness at full size against float64 autograd: the teaching backward (v2's) and the fast backward
   (dq_mode "kernel" and "atomic"), fp16 and bf16, D 64 / 96 / 128, causal and not, L = S, L != S both
   ways, grouped-query heads; and forward+backward end to end through flashattn.scaled_dot_product_attention
   (the fast forward included) on a few of them; SDPA's own error on the same inputs for scale;
3. timing: every candidate configuration of the fast backward against SDPA's backward (cuDNN), in
   interleaved rounds, fp16/bf16 x D 64/128 x causal/not x N 4096/16384 (B·N = 16384, H = 16), TFLOP/s by
   the 2.5x-forward convention; then the best of each dQ mode against SDPA in 3 interleaved rounds;
4. prints a summary table last: per problem the ratio to SDPA, and per head dimension the configurations
   that won (the tuning space to keep).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback

T0 = time.time()
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT") or "/tmp/backward_probe"
BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "300"))  # stop screening past this, keep the summary
# PROBE_DRY=1: the same script on the CPU in Triton's interpreter at toy sizes (checks the script, not the GPU)
DRY = os.environ.get("PROBE_DRY") == "1"
DEVICE = "cpu" if DRY else "cuda"
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
TOKENS, HEADS = (256, 2) if DRY else (16384, 16)
TIMED = [(dt, D, causal, N) for dt in (("float16",) if DRY else ("float16", "bfloat16")) for D in (64, 128)
         for causal in (False, True) for N in ((64, 128) if DRY else (4096, 16384))]
# (name, B, Hq, Hkv, L, S) at full size for the correctness phase
SHAPES = [("L=S", 1, 8, 8, 4096, 4096), ("L<S", 1, 8, 8, 1000, 4096), ("L>S", 1, 8, 8, 4096, 1000),
          ("GQA 16/4", 1, 16, 4, 2048, 2048)]
if DRY:
    SHAPES = [(name, B, max(1, hq // 4), max(1, hkv // 4), L // 32, S // 32) for name, B, hq, hkv, L, S in SHAPES]
CHECK_DIMS = (64, 96, 128)
TOL = {"float16": 5e-3} if DRY else {"float16": 5e-3, "bfloat16": 4e-2}


def bench_ms(fn, warmup, rep):
    """do_bench's median on the GPU; one timed call in a dry run."""
    if DRY:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def log(*args):
    line = " ".join(str(a) for a in args)
    print(f"[{time.time() - T0:6.1f}s] {line}", flush=True)
    with open(os.path.join(OUT, "probe.log"), "a") as f:
        f.write(line + "\n")


# --- the cases ---------------------------------------------------------------------------------------

def candidates(D, dtype):
    """(label, options) of every fast-backward configuration timed: each dK/dV tile with dQ's first tile,
    each other dQ tile with dK/dV's first, each atomic dK/dV tile."""
    from flashattn.kernels import fast_backward as fb

    dkdv, dq, atomic = (fb.tuning_space("dkdv", D, dtype), fb.tuning_space("dq", D, dtype),
                        fb.tuning_space("dkdv", D, dtype, atomic=True))
    out = [(f"dkdv {c}", dict(dkdv_tiles=c, dq_tiles=dq[0])) for c in dkdv]
    out += [(f"dq {c}", dict(dkdv_tiles=dkdv[0], dq_tiles=c)) for c in dq[1:]]
    out += [(f"atomic {c}", dict(dkdv_tiles=c, dq_mode="atomic")) for c in atomic]
    return out


def make_inputs(B, HQ, HKV, L, S, D, dtype, seed=0):
    import torch

    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, do = (torch.randn(B, HQ, L, D, device=DEVICE, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, HKV, S, D, device=DEVICE, generator=g).to(dtype) for _ in range(2))
    return q, k, v, do


def reference(q, k, v, do, causal):
    """float64 (o, lse, dq, dk, dv) by autograd, GQA by repeat_interleave, causal top-left."""
    import torch

    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    G = q.shape[1] // k.shape[1]
    s = (q64 @ k64.repeat_interleave(G, 1).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=DEVICE).tril(), float("-inf"))
    o = torch.softmax(s, -1) @ v64.repeat_interleave(G, 1)
    o.backward(do.double())
    return o.detach(), torch.logsumexp(s, -1).detach(), (q64.grad, k64.grad, v64.grad)


def rel(a, b):
    """flashattn.reference.rel_error (imported late: the dry run sets the interpreter up first)."""
    from flashattn.reference import rel_error

    return rel_error(a, b)


def check_case(dtype_name, D, causal, shape, compile_only=False):
    """Correctness of every backward on one full-size problem; returns a row."""
    import torch

    from flashattn.kernels.backward import attention_backward
    from flashattn.kernels.fast_backward import attention_backward_fast, tuning_space

    name, B, HQ, HKV, L, S = shape
    dtype = getattr(torch, dtype_name)
    q, k, v, do = make_inputs(B, HQ, HKV, L, S, D, dtype, seed=D + L)
    o64, lse64, ref = reference(q, k, v, do, causal)
    o, lse = o64.to(dtype), lse64.float()
    row = {"dtype": dtype_name, "D": D, "causal": causal, "shape": name, "B": B, "Hq": HQ, "Hkv": HKV, "L": L, "S": S,
           "errors": {}}
    tiles = dict(dkdv_tiles=tuning_space("dkdv", D, dtype)[0], dq_tiles=tuning_space("dq", D, dtype)[0])
    atomic = dict(dkdv_tiles=tuning_space("dkdv", D, dtype, atomic=True)[0], dq_mode="atomic")
    runs = {"fast": lambda: attention_backward_fast(q, k, v, o, lse, do, causal=causal, **tiles),
            "fast atomic": lambda: attention_backward_fast(q, k, v, o, lse, do, causal=causal, **atomic)}
    if HQ == HKV and L == S and D in (64, 128):
        runs["teaching"] = lambda: attention_backward(q, k, v, o, lse, do, causal=causal)
    for label, fn in runs.items():
        try:
            grads = fn()
            row["errors"][label] = [rel(g, r) for g, r in zip(grads, ref, strict=True)]
        except Exception as err:  # noqa: BLE001 - one failure must not stop the probe
            row["errors"][label] = f"{type(err).__name__}: {str(err)[:300]}"
    if not compile_only:  # SDPA's own gradients on the same inputs, for scale
        qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=HQ != HKV)
        out.backward(do)
        row["errors"]["sdpa (torch)"] = [rel(t.grad, r) for t, r in zip((qs, ks, vs), ref, strict=True)]
    return row


def end_to_end_case(dtype_name, D, causal, shape):
    """Forward and backward through flashattn.scaled_dot_product_attention (fast forward included)."""
    import torch

    import flashattn

    name, B, HQ, HKV, L, S = shape
    dtype = getattr(torch, dtype_name)
    q, k, v, do = make_inputs(B, HQ, HKV, L, S, D, dtype, seed=D + L + 1)
    o64, _, ref = reference(q, k, v, do, causal)
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = flashattn.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=HQ != HKV)
    out.backward(do)
    grads = [rel(t.grad, r) for t, r in zip((qs, ks, vs), ref, strict=True)]
    return {"dtype": dtype_name, "D": D, "causal": causal, "shape": name,
            "errors": {"forward": rel(out.detach(), o64), "grads": grads}}


def timing_inputs(dtype_name, D, causal, N):
    import torch

    from flashattn.kernels.v2 import attention_v2

    dtype = getattr(torch, dtype_name)
    q, k, v, do = make_inputs(TOKENS // N, HEADS, HEADS, N, N, D, dtype, seed=N + D)
    o, lse = attention_v2(q, k, v, causal=causal, return_lse=True)
    return q, k, v, do, o, lse


def compile_task(task):
    """Worker: run one thing once, so that its kernels are compiled into Triton's disk cache."""
    kind, args = task
    t0 = time.time()
    try:
        import torch

        from flashattn.kernels.backward import attention_backward
        from flashattn.kernels.fast_backward import attention_backward_fast

        if kind == "check":
            check_case(*args, compile_only=True)
        elif kind == "timing":
            dtype_name, D, causal, label, options = args
            q, k, v, do, o, lse = timing_inputs(dtype_name, D, causal, 4096)  # same specialization as N = 16384
            if label == "teaching":
                attention_backward(q, k, v, o, lse, do, causal=causal)
            else:
                attention_backward_fast(q, k, v, o, lse, do, causal=causal, **options)
        if not DRY:
            torch.cuda.synchronize()
        return kind, str(args)[:80], time.time() - t0, None
    except Exception as err:  # noqa: BLE001
        return kind, str(args)[:80], time.time() - t0, f"{type(err).__name__}: {str(err)[:200]}"


# --- phases -----------------------------------------------------------------------------------------

def precompile():
    import torch

    tasks = [("check", (dt, D, c, shape)) for dt in TOL for D in CHECK_DIMS for c in (False, True) for shape in SHAPES]
    for dt, D, causal, N in TIMED:
        if N != TIMED[0][3]:
            continue
        for label, options in [*candidates(D, getattr(torch, dt)), ("teaching", {})]:
            tasks.append(("timing", (dt, D, causal, label, options)))
    workers = 2 if DRY else max(1, min(14, (os.cpu_count() or 4) - 2))
    if DRY:
        tasks = tasks[:4]
    log(f"precompiling {len(tasks)} tasks in {workers} processes")
    with mp.get_context("spawn").Pool(workers) as pool:
        for kind, what, _secs, err in pool.imap_unordered(compile_task, tasks):
            if err:
                log(f"  compile {kind} {what}: {err}")
    log("precompiled")


def correctness(results):
    rows = []
    for dt in TOL:
        for D in CHECK_DIMS:
            for causal in (False, True):
                for shape in SHAPES:
                    try:
                        row = check_case(dt, D, causal, shape)
                    except Exception as err:  # noqa: BLE001
                        row = {"dtype": dt, "D": D, "causal": causal, "shape": shape[0], "errors": {"case": repr(err)}}
                    rows.append(row)
                    bad = {k: v for k, v in row["errors"].items() if k != "sdpa (torch)"
                           and (isinstance(v, str) or max(v) > TOL[dt])}
                    if bad:
                        log(f"  CHECK FAILED {dt} D={D} causal={causal} {shape[0]}: {bad}")
    results["correctness"] = rows
    e2e = []
    for dt in TOL:
        for D, shape in ((64, SHAPES[0]), (96, SHAPES[3]), (128, SHAPES[1])):
            try:
                e2e.append(end_to_end_case(dt, D, True, shape))
            except Exception as err:  # noqa: BLE001
                e2e.append({"dtype": dt, "D": D, "shape": shape[0], "errors": repr(err)[:300]})
            log(f"  end to end {e2e[-1]}")
    results["end_to_end"] = e2e


def time_problem(dt, D, causal, N, screen_rounds=2):
    import torch

    from flashattn import bench
    from flashattn.kernels.backward import attention_backward
    from flashattn.kernels.fast_backward import attention_backward_fast, tuning_space
    from flashattn.measure.measurements.backward import BACKWARD_FACTOR

    q, k, v, do, o, lse = timing_inputs(dt, D, causal, N)
    B = TOKENS // N
    flops = BACKWARD_FACTOR * bench.attention_flops(B, HEADS, N, D, causal)
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
    ref = torch.autograd.grad(out, (qs, ks, vs), do, retain_graph=True)
    fns = {"sdpa": lambda: torch.autograd.grad(out, (qs, ks, vs), do, retain_graph=True),
           "teaching": lambda: attention_backward(q, k, v, o, lse, do, causal=causal)}
    errors, options = {}, dict(candidates(D, q.dtype))
    for label, opts in options.items():
        fns[label] = (lambda opts=opts: attention_backward_fast(q, k, v, o, lse, do, causal=causal, **opts))
    for label in list(fns):
        if label == "sdpa":
            continue
        try:  # first call (loads the compiled kernel) and a sanity check against SDPA's gradients
            grads = fns[label]()
            errors[label] = max(rel(g, r) for g, r in zip(grads, ref, strict=True))
            if errors[label] > 3 * TOL[dt]:
                log(f"  {dt} D={D} causal={causal} N={N} {label}: error {errors[label]:.2e} against SDPA")
        except Exception as err:  # noqa: BLE001
            errors[label] = f"{type(err).__name__}: {str(err)[:200]}"
            log(f"  {dt} D={D} causal={causal} N={N} {label}: {errors[label]}")
            del fns[label]
    times = {label: [] for label in fns}
    for _ in range(screen_rounds):  # interleaved: every candidate meets the same clock drift
        for label, fn in fns.items():
            times[label].append(bench_ms(fn, warmup=10, rep=40))
    ms = {label: statistics.median(t) for label, t in times.items()}
    # each kind's configurations and their times (dQ's first tile was timed as part of "dkdv <first tile>")
    first_dkdv = f"dkdv {tuning_space('dkdv', D, q.dtype)[0]}"
    by_kind = {"dkdv": {}, "dq": {}, "atomic": {}}
    for label, t in ms.items():
        kind = label.split()[0]
        if kind == "dkdv":
            by_kind["dkdv"][options[label]["dkdv_tiles"]] = t
            if label == first_dkdv:
                by_kind["dq"][options[label]["dq_tiles"]] = t
        elif kind == "dq":
            by_kind["dq"][options[label]["dq_tiles"]] = t
        elif kind == "atomic":
            by_kind["atomic"][options[label]["dkdv_tiles"]] = t
    best = {}
    if by_kind["dkdv"] and by_kind["dq"]:
        best["kernel"] = dict(dkdv_tiles=min(by_kind["dkdv"], key=by_kind["dkdv"].get),
                              dq_tiles=min(by_kind["dq"], key=by_kind["dq"].get))
    if by_kind["atomic"]:
        best["atomic"] = dict(dkdv_tiles=min(by_kind["atomic"], key=by_kind["atomic"].get), dq_mode="atomic")
    final = {"sdpa": fns["sdpa"]}
    for mode, opts in best.items():
        final[f"best {mode}"] = (lambda opts=opts: attention_backward_fast(q, k, v, o, lse, do, causal=causal, **opts))
    final_times = {label: [] for label in final}
    for _ in range(3):
        for label, fn in final.items():
            final_times[label].append(bench_ms(fn, warmup=25, rep=100))
    final_ms = {label: statistics.median(t) for label, t in final_times.items()}
    row = {"dtype": dt, "D": D, "causal": causal, "N": N, "B": B, "H": HEADS, "flops": flops,
           "screen_ms": ms, "screen_tflops": {lb: flops / (t * 1e-3) / 1e12 for lb, t in ms.items()},
           "screen_vs_sdpa": {lb: ms["sdpa"] / t for lb, t in ms.items()}, "errors_vs_sdpa": errors,
           "by_kind_ms": {kind: {str(c): t for c, t in d.items()} for kind, d in by_kind.items()},
           "best": {m: {k: list(v) if isinstance(v, tuple) else v for k, v in o_.items()} for m, o_ in best.items()},
           "final_ms": final_ms, "final_rounds": final_times,
           "final_tflops": {lb: flops / (t * 1e-3) / 1e12 for lb, t in final_ms.items()},
           "final_vs_sdpa": {lb: final_ms["sdpa"] / t for lb, t in final_ms.items()}}
    return row


def smoke(results):
    """The registered measurements' code paths, once each at one size (so that `record` will not fail)."""
    import torch

    from flashattn.measure.measurements import backward as mb
    from flashattn.measure.measurements import training as mt
    from flashattn.models.gpt import GPTConfig
    from flashattn.models.tasks import AssociativeRecall

    out = {}
    steps = [
        ("compare_backward", lambda: mb.compare_backward(dtypes=("float16",), head_dims=(64,), seq_lens=(4096,),
                                                         causals=(True,), rounds=1)),
        ("training_step_memory", lambda: {name: mb.training_step_memory(
            fn, *mb.runtime.random_qkv(1, 16, 4096, 64, dtype=torch.float16), mb.runtime.random_qkv(
                1, 16, 4096, 64, dtype=torch.float16)[0]) for name, fn in (
            ("fast", lambda q, k, v: mb.scaled_dot_product_attention(q, k, v)), ("pytorch", mb.pytorch_attention))}),
        ("train_side_by_side", lambda: {k: v for k, v in mt.train_side_by_side(
            GPTConfig(64, 63, n_layers=2, n_heads=4, d_model=128), AssociativeRecall(16, 32, 32),
            steps=4 if DRY else 30, batch=4 if DRY else 64, dtype=torch.float32 if DRY else torch.bfloat16,
            device=DEVICE).items()
            if k in ("accuracy", "eval_loss", "seconds")}),
        ("step_cost", lambda: {name: mt.step_cost(GPTConfig(256, 4096, n_layers=4, n_heads=8, d_model=512), fn,
                                                  batch=8) for name, fn in mt.ATTENTIONS.items()}),
    ]
    if DRY:
        steps = steps[2:3]
    for name, fn in steps:
        t0 = time.time()
        try:
            value = fn()
            out[name] = value if name != "compare_backward" else {k: value[0][k] for k in (
                "vs_sdpa", "training_vs_sdpa", "rel_error", "fast_tiles")}
            log(f"  smoke {name}: ok in {time.time() - t0:.1f} s: {str(out[name])[:300]}")
        except Exception as err:  # noqa: BLE001
            out[name] = f"{type(err).__name__}: {err}"
            log(f"  smoke {name}: FAILED {traceback.format_exc()[-1500:]}")
    results["smoke"] = out


def summary(results):
    print("\n=== correctness: max relative error of dq, dk, dv against float64 autograd (tolerance fp16 5e-3, "
          "bf16 4e-2) ===")
    worst = {}
    for row in results.get("correctness", []):
        for label, errs in row["errors"].items():
            key = (row["dtype"], label)
            val = float("inf") if isinstance(errs, str) else max(errs)
            worst[key] = max(worst.get(key, 0.0), val)
    for (dt, label), val in sorted(worst.items()):
        flag = "" if label == "sdpa (torch)" or val <= TOL[dt] else "   <-- FAILED"
        print(f"  {dt:<9} {label:<14} worst {val:.2e}{flag}")
    for row in results.get("end_to_end", []):
        print(f"  end to end (fast forward + backward) {row['dtype']} D={row['D']} {row['shape']}: {row['errors']}")
    for name, value in results.get("smoke", {}).items():
        print(f"  measurement code path {name}: {'FAILED ' + value[:200] if isinstance(value, str) else 'ok'}")
    print("\n=== timing: backward TFLOP/s (2.5 x forward FLOP), H=16, B·N=16384; ratio = SDPA time / ours ===")
    print(f"{'dtype':<9}{'D':>4}{'N':>7} {'causal':<7}{'SDPA':>7}{'kernel':>8}{'x':>6}{'atomic':>8}{'x':>6}"
          f"{'teach x':>9}  best configs")
    wins = {}
    for r in results.get("timing", []):
        ft, fv = r["final_tflops"], r["final_vs_sdpa"]
        sv = r["screen_vs_sdpa"]
        cells = ""
        for mode in ("best kernel", "best atomic"):
            cells += f"{ft.get(mode, float('nan')):>8.0f}{fv.get(mode, float('nan')):>6.2f}"
        print(f"{r['dtype']:<9}{r['D']:>4}{r['N']:>7} {str(r['causal']):<7}{ft['sdpa']:>7.0f}{cells}"
              f"{sv.get('teaching', float('nan')):>9.2f}  {r['best']}")
        for kind, d in r["by_kind_ms"].items():
            for config, t in d.items():
                if t <= 1.03 * min(d.values()):
                    wins[(r["D"], kind, config)] = wins.get((r["D"], kind, config), 0) + 1
    print("\n=== configurations within 3 % of their kind's best (count of problems), per D: the space to keep ===")
    for (D, kind, config), n in sorted(wins.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[1])):
        print(f"  D={D:<4} {kind:<7} {config:<20} {n}")
    print("\n=== to paste into flashattn/kernels/fast_backward.py (the configurations that won somewhere) ===")
    for kind, space in (("dkdv", "DKDV_SPACE"), ("atomic", "ATOMIC_DKDV_SPACE"), ("dq", "DQ_SPACE")):
        per_d = {}
        for (D, k, config), _count in sorted(wins.items(), key=lambda kv: -kv[1]):
            if k == kind:
                per_d.setdefault(D, []).append(config)
        print(f"{space}: " + "; ".join(f"{D}: [{', '.join(configs)}]" for D, configs in sorted(per_d.items())))
    modes = {"kernel": [], "atomic": []}
    for r in results.get("timing", []):
        for mode in modes:
            if f"best {mode}" in r["final_vs_sdpa"]:
                modes[mode].append(r["final_vs_sdpa"][f"best {mode}"])
    for mode, ratios in modes.items():
        if ratios:
            print(f"dq_mode={mode!r}: ratio to SDPA min {min(ratios):.2f}, geometric mean "
                  f"{statistics.geometric_mean(ratios):.2f} over {len(ratios)} problems")
    print(f"\ntotal {time.time() - T0:.0f} s; details in {OUT}/probe.json")


def main():
    os.makedirs(OUT, exist_ok=True)
    import flashattn  # noqa: I001  (first: it chooses the mode before Triton is imported)
    import torch
    import triton

    results = {"device": "cpu (dry run)" if DRY else torch.cuda.get_device_name(0), "torch": torch.__version__,
               "triton": triton.__version__, "describe": flashattn.describe()}
    log(results)
    for phase, fn in (("precompile", precompile), ("correctness", lambda: correctness(results)),
                      ("smoke", lambda: smoke(results))):
        try:
            fn()
        except Exception:  # noqa: BLE001
            log(f"{phase} failed:\n{traceback.format_exc()}")
        log(f"{phase} done")
        json.dump(results, open(os.path.join(OUT, "probe.json"), "w"), indent=1, default=str)
    results["timing"] = []
    for dt, D, causal, N in TIMED:
        if time.time() - T0 > BUDGET_S:
            log(f"time budget reached: skipping {dt} D={D} causal={causal} N={N}")
            continue
        try:
            row = time_problem(dt, D, causal, N)
            results["timing"].append(row)
            log(f"  {dt} D={D} causal={causal} N={N}: SDPA {row['final_tflops']['sdpa']:.0f} TFLOP/s; "
                + ", ".join(f"{k} {v:.2f}x" for k, v in row["final_vs_sdpa"].items() if k != "sdpa"))
        except Exception:  # noqa: BLE001
            log(f"timing {dt} D={D} causal={causal} N={N} failed:\n{traceback.format_exc()}")
        json.dump(results, open(os.path.join(OUT, "probe.json"), "w"), indent=1, default=str)
    summary(results)


if __name__ == "__main__":
    main()
