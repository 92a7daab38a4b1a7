"""GPU probe for masked attention (issue 30), for the lead to run on the H200 in one go (under 5 minutes):

    python tools/gpu/masks/probe.py               # summary on stdout; details in $OUT/masks_probe.json and .log
    PROBE_DRY=1 python tools/gpu/masks/probe.py   # the same script on the CPU, interpreter, toy sizes (checks it)
    PROBE_SHAPES=2,3 python tools/gpu/masks/probe.py   # the sweep on some shapes only (the rest of a budget cut)
    PROBE_PHASES=sweep PROBE_DTYPES=float16,bfloat16 ...     # some phases only; the sweep in these dtypes

1. compiles our masked kernels for every tile candidate of the timed shapes in parallel worker processes
   (Triton's disk cache then serves this process);
2. correctness at full size against float64: forward rows (windows, documents with lengths 1 and up to 4k,
   padding) and gradients on two heads; the drop-in with a random boolean and a float attn_mask (L ≠ S, GQA,
   is_causal or not), forward and gradients; fp16 and bf16, D 64 / 96 / 128;
3. the tile sweep: on a few shapes, every forward tile of ``masked.FORWARD_TILES`` and every dK/dV and dQ tile of
   ``masked_backward.DKDV_TILES`` / ``DQ_TILES``, against FlexAttention (torch.compile'd, BlockMask built once)
   in interleaved rounds, forward and forward+backward; FlexAttention's compile times are logged (they decide
   how large ``masks_vs_flex``'s grid can be);
4. proportionality: a 1k window at N = 64k against ``fast`` causal on the full length, time per computed tile;
5. a summary: per shape the best tiles and their ratio to FlexAttention (the target: >= 1.0 everywhere).
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

T0 = time.time()
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT") or "probe_out"
BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "270"))  # stop sweeping past this, keep the summary
DRY = os.environ.get("PROBE_DRY") == "1"
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
HEADS = 2 if DRY else 16
DTYPES = ("float16",) if DRY else ("float16", "bfloat16")
TOL = {"float16": 5e-3, "bfloat16": 4e-2}
# the correctness phase's (dtype, D): gradients too but at D = 96 (forward only)
CHECKED = (("float16", 32),) if DRY else (("float16", 64), ("float16", 128), ("bfloat16", 64), ("bfloat16", 128),
                                          ("float16", 96))
# PROBE_SHAPES=0,2: sweep only these of problems() (by index; default: all, in order, while the budget lasts)
SHAPES = [int(i) for i in os.environ.get("PROBE_SHAPES", "").split(",") if i.strip()]
# PROBE_PHASES=sweep,triton_paths: only these phases (default: all, in order: correctness, dense_masks, sweep,
# proportionality, triton_paths)
PHASES = [name for name in os.environ.get("PROBE_PHASES", "").split(",") if name.strip()]
# PROBE_DTYPES=float16,bfloat16: sweep every chosen shape in each (default: float16 on all, bfloat16 on the first)
SWEEP_DTYPES = [name for name in os.environ.get("PROBE_DTYPES", "").split(",") if name.strip()]


def log(*args):
    line = " ".join(str(a) for a in args)
    print(f"[{time.time() - T0:6.1f}s] {line}", flush=True)
    with open(os.path.join(OUT, "masks_probe.log"), "a") as f:
        f.write(line + "\n")


def problems():
    """The swept shapes: (name, Problem, D)."""
    from flashattn.measure.measurements.masks import Problem, document_lengths, padding_lengths

    if DRY:
        return [("window 32, N=128, D=32", Problem("window", 128, window=32), 32),
                ("documents, N=128, D=32", Problem("documents", 128, lengths=document_lengths(128, bounds=(1, 50))),
                 32)]
    return [("window 1k, N=16k, D=128", Problem("window", 16384, window=1024), 128),
            ("documents, N=16k, D=128", Problem("documents", 16384, lengths=document_lengths(16384)), 128),
            ("window 256, N=16k, D=64", Problem("window", 16384, window=256), 64),
            ("padding, B=4 N=16k, D=128", Problem("padding", 16384, B=4, lengths=padding_lengths(4, 16384)), 128),
            ("padding, B=4 N=16k, D=64", Problem("padding", 16384, B=4, lengths=padding_lengths(4, 16384)), 64),
            ("window 256, N=64k, D=64", Problem("window", 65536, window=256), 64),
            ("window 4k, N=64k, D=64", Problem("window", 65536, window=4096), 64),
            ("window 1k, N=16k, D=64", Problem("window", 16384, window=1024), 64)]


def make(p, D, dtype_name, heads=HEADS):
    import torch

    from flashattn import runtime

    gen = torch.Generator(device=runtime.DEVICE).manual_seed(D + p.N)
    dtype = getattr(torch, dtype_name)
    return tuple(torch.randn(p.B, heads, p.N, D, device=runtime.DEVICE, generator=gen, dtype=dtype) for _ in range(4))


@functools.lru_cache(maxsize=64)
def _cu_seqlens(lengths, device):
    """The documents' offsets, made once per problem as masks_vs_flex makes them: a pageable host-to-device copy on
    every call would make the host wait for the GPU and time both."""
    from flashattn.kernels import mask_blocks

    return mask_blocks.cu_seqlens(lengths, device)


def ours(p, q, k, v, do, tiles=None, dkdv=None, dq=None, training=False):
    """Our kernels on the problem with these tiles: the forward, or the forward and the backward (no autograd)."""
    from flashattn import masking
    from flashattn.measure.measurements.masks import dense_mask, packed

    if p.kind == "window":
        args, kw = (q, k, v), dict(causal=True, window=(p.window - 1, 0))
    elif p.kind == "documents":
        cu = _cu_seqlens(p.lengths, q.device)
        args = (packed(q), packed(k), packed(v))
        kw = dict(causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(p.lengths),
                  max_seqlen_k=max(p.lengths))
        do = packed(do)
    else:
        args, kw = (q, k, v), dict(attn_mask=dense_mask(p, q.device).expand(p.B, q.shape[1], p.N, p.N))
    o, lse = masking.masked_forward(*args, tiles=tiles, **kw)
    if not training:
        return o
    return masking.masked_backward(*args, o, lse, do, dkdv_tiles=dkdv, dq_tiles=dq, **kw)


def bench(fn):
    if DRY:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def rounds(fns, n=3):
    times = {name: [] for name in fns}
    for _ in range(1 if DRY else n):
        for name, fn in fns.items():
            times[name].append(bench(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def candidates(D, dtype_name, p):
    """The (forward, dK/dV, dQ) tiles the sweep times: the dense mask's kernels' for padding, the window kernels'
    for the rest."""
    import torch

    from flashattn.kernels import masked, masked_backward
    from flashattn.measure.measurements.masks import mask_dtype

    dtype = getattr(torch, dtype_name)
    mask = mask_dtype(p)
    return (masked.tiles_for(dtype, D, mask=mask), masked_backward.tiles_for("dkdv", dtype, D, mask=mask),
            masked_backward.tiles_for("dq", dtype, D, mask=mask))


# --- phases ------------------------------------------------------------------------------------------------

def compile_task(task):
    """Worker: run our kernels once with these tiles (Triton's disk cache keeps what it compiled)."""
    name, dtype_name, tiles, dkdv, dq = task
    t0 = time.time()
    try:
        import torch

        from flashattn.measure.measurements.masks import Problem

        shapes = {n: (p, D) for n, p, D in problems()}
        if name in shapes:
            p, D = shapes[name]
        else:  # "check <kind> <D>": a small problem of the correctness phase's kind (the same specializations)
            _, kind, D = name.split()
            p, D = {"window": Problem("window", 256, window=64), "documents": Problem("documents", 256,
                    lengths=(1, 100, 154, 1)), "padding": Problem("padding", 256, B=2, lengths=(256, 77))}[kind], int(D)
        q, k, v, do = make(p, D, dtype_name, heads=2)
        ours(p, q, k, v, do, tiles, dkdv, dq, training=dkdv is not None or name.startswith("check"))
        if not DRY:
            torch.cuda.synchronize()
        return name, str(tiles), time.time() - t0, None
    except Exception as err:  # noqa: BLE001
        return name, str(tiles), time.time() - t0, f"{type(err).__name__}: {str(err)[:200]}"


def swept():
    """The shapes the sweep times: PROBE_SHAPES's, or all."""
    return [shape for i, shape in enumerate(problems()) if not SHAPES or i in SHAPES]


def precompile():
    tasks = []
    for name, p, D in swept():
        fwd, dkdv, dq = candidates(D, "float16", p)
        tasks += [(name, "float16", t, None, None) for t in fwd]
        tasks += [(name, "float16", fwd[0], t, dq[0]) for t in dkdv] + [(name, "float16", fwd[0], dkdv[0], t)
                                                                        for t in dq[1:]]
    for dt, D in CHECKED if not PHASES or "correctness" in PHASES else ():  # the correctness phase's kernels
        for kind in ("window", "documents", "padding"):
            tasks.append((f"check {kind} {D}", dt, None, None, None))
    workers = max(1, min(14, (os.cpu_count() or 4) - 2))
    log(f"precompiling {len(tasks)} tasks in {workers} processes")
    with mp.get_context("spawn").Pool(workers) as pool:
        for name, what, _secs, err in pool.imap_unordered(compile_task, tasks):
            if err:
                log(f"  compile {name} {what}: {err}")
    log("precompiled")


def correctness(results):
    """Forward rows at full size against float64 (every mask kind), gradients on two heads."""
    import torch

    from flashattn.measure.measurements.masks import Problem, document_lengths, padding_lengths, reference_rows
    from flashattn.reference import rel_error

    N = 256 if DRY else 16384
    cases = [Problem("window", N, window=N // 16), Problem("window", N, window=N // 4),
             Problem("documents", N, lengths=(1, *document_lengths(N - 2, bounds=(N // 128, N // 4)), 1)),
             Problem("padding", N, B=2, lengths=padding_lengths(2, N))]
    rows = []
    for dt, D in CHECKED:
        for p in cases:
            q, k, v, do = make(p, D, dt)
            b, sl, ref = reference_rows(p, q, k, v)
            row = {"dtype": dt, "D": D, "problem": p.label}
            try:
                row["forward"] = rel_error(ours(p, q, k, v, do)[b, 0, sl] if p.kind != "documents" else
                                           ours(p, q, k, v, do).transpose(0, 1)[0, sl], ref)
                if D != 96:  # gradients on two heads, against float64 autograd with the dense mask (D 96: forward)
                    two = tuple(t[:, :2].contiguous() for t in (q, k, v, do))
                    grads = ours(p, *two, training=True)
                    if p.kind == "documents":
                        grads = [g.transpose(0, 1)[None] for g in grads]
                    row["grads"] = grad_errors(p, *two, grads)
            except Exception as err:  # noqa: BLE001
                row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            bad = "error" in row or row["forward"] > TOL[dt] or max(row.get("grads", [0])) > TOL[dt]
            log(("  CHECK FAILED " if bad else "  ok ") + json.dumps(row))
            rows.append(row)
            del q, k, v, do
            if not DRY:
                torch.cuda.empty_cache()
    results["correctness"] = rows


def dense_masks(results):
    """The drop-in with a random boolean and a float attn_mask (L ≠ S, GQA 4/2, is_causal or not), forward and
    gradients against torch's SDPA in float64 (K/V heads repeated)."""
    import torch

    import flashattn
    from flashattn import runtime
    from flashattn.reference import rel_error

    L, S = (96, 80) if DRY else (4096, 3000)
    rows = []
    for dt, D in ((("float16", 32),) if DRY else (("float16", 64), ("float16", 128), ("bfloat16", 128))):
        gen = torch.Generator(device=runtime.DEVICE).manual_seed(D)
        dtype = getattr(torch, dt)
        q, do = (torch.randn(2, 4, L, D, device=runtime.DEVICE, generator=gen, dtype=dtype) for _ in range(2))
        k, v = (torch.randn(2, 2, S, D, device=runtime.DEVICE, generator=gen, dtype=dtype) for _ in range(2))
        takes = torch.rand(2, 1, L, S, device=runtime.DEVICE, generator=gen) < 0.5
        bias = torch.randn(1, 4, L, S, device=runtime.DEVICE, generator=gen).masked_fill(~takes[0], float("-inf"))
        for kind, mask in (("bool", takes), ("float", bias)):
            for causal in (False, True):
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                out = flashattn.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=causal,
                                                             enable_gqa=True)
                grads = torch.autograd.grad(out, leaves, do)
                ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
                dense = mask if kind == "bool" else mask.double()
                if causal:
                    keep = torch.ones(L, S, dtype=torch.bool, device=runtime.DEVICE).tril()
                    dense = dense & keep if kind == "bool" else dense.masked_fill(~keep, float("-inf"))
                ref = torch.nn.functional.scaled_dot_product_attention(
                    ref_leaves[0], ref_leaves[1].repeat_interleave(2, 1), ref_leaves[2].repeat_interleave(2, 1),
                    attn_mask=dense)
                ref_grads = torch.autograd.grad(ref, ref_leaves, do.double())
                row = {"dtype": dt, "D": D, "problem": f"attn_mask {kind}, causal={causal}",
                       "forward": rel_error(out, ref), "grads": [rel_error(g, r) for g, r in zip(grads, ref_grads,
                                                                                              strict=True)]}
                bad = row["forward"] > TOL[dt] or max(row["grads"]) > TOL[dt]
                log(("  CHECK FAILED " if bad else "  ok ") + json.dumps(row))
                rows.append(row)
    results.setdefault("correctness", []).extend(rows)


def grad_errors(p, q, k, v, do, grads):
    import torch

    from flashattn.measure.measurements.masks import dense_mask
    from flashattn.reference import rel_error

    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=dense_mask(p, q.device))
    ref = torch.autograd.grad(out, leaves, do.double())
    return [rel_error(g, r) for g, r in zip(grads, ref, strict=True)]


def flex_setup():
    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    from flashattn import runtime
    from flashattn.measure.measurements.masks import flex_mask_mods

    torch._dynamo.config.cache_size_limit = 256
    compiled = flex_attention if DRY else torch.compile(flex_attention, dynamic=False)
    state, mods = flex_mask_mods(runtime.DEVICE)
    return compiled, state, mods


def sweep_one(name, p, D, dt, flex) -> dict:
    """Every tile candidate of one shape and dtype against FlexAttention, forward and forward+backward."""
    import torch

    from flashattn import runtime
    from flashattn.measure.measurements.masks import flex_block_mask

    compiled, state, mods = flex
    fwd, dkdv, dq = candidates(D, dt, p)
    q, k, v, do = make(p, D, dt)
    block_mask = flex_block_mask(p, state, mods, runtime.DEVICE)
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    row = {"shape": name, "dtype": dt, "heads": HEADS, "compile_s": {}}

    def flex_fwd():
        return compiled(q, k, v, block_mask=block_mask)

    def flex_train():
        return torch.autograd.grad(compiled(*leaves, block_mask=block_mask), leaves, do)

    t0 = time.time()
    with torch.no_grad():
        flex_fwd()
    row["compile_s"]["flex forward"] = time.time() - t0
    t0 = time.time()
    if not DRY:  # FlexAttention has no backward on the CPU
        flex_train()
    row["compile_s"]["flex forward+backward"] = time.time() - t0
    fns, tiles_of = {"flex": flex_fwd}, {f"fwd {t}": t for t in fwd}
    for label, t in tiles_of.items():
        fns[label] = functools.partial(ours, p, q, k, v, do, t)
    with torch.no_grad():
        row["forward_ms"] = rounds(first_calls(fns, f"{name} {dt}"))
    best = min((label for label in row["forward_ms"] if label != "flex"), key=row["forward_ms"].get, default=None)
    best_fwd = tiles_of[best] if best else fwd[0]
    train = {} if DRY else {"flex": flex_train}
    for t in dkdv:
        train[f"dkdv {t}"] = functools.partial(ours, p, q, k, v, do, best_fwd, t, dq[0], training=True)
    for t in dq[1:]:
        train[f"dq {t}"] = functools.partial(ours, p, q, k, v, do, best_fwd, dkdv[0], t, training=True)
    row["training_ms"] = rounds(first_calls(train, f"{name} {dt}"))
    row["best_forward"] = best_fwd
    fl, tr = row["forward_ms"], row["training_ms"]
    row["forward_vs_flex"] = {lb: fl["flex"] / t for lb, t in fl.items() if lb != "flex" and "flex" in fl}
    row["training_vs_flex"] = {lb: tr["flex"] / t for lb, t in tr.items() if lb != "flex" and "flex" in tr}
    log(f"  {name} {dt}: flex compile {row['compile_s']['flex forward']:.1f} s + "
        f"{row['compile_s']['flex forward+backward']:.1f} s; forward ×flex "
        + ", ".join(f"{lb[4:]} {r:.2f}" for lb, r in row["forward_vs_flex"].items())
        + "; fwd+bwd ×flex " + ", ".join(f"{lb} {r:.2f}" for lb, r in row["training_vs_flex"].items()))
    return row


def first_calls(fns: dict, where: str) -> dict:
    """Call each once (compiling it); the ones that fail are logged and left out."""
    for label, fn in list(fns.items()):
        try:
            fn()
        except Exception as err:  # noqa: BLE001
            log(f"  {where} {label}: {type(err).__name__}: {str(err)[:200]}")
            del fns[label]
    return fns


def sweep(results, flex):
    """fp16 on every shape, then bf16 on the first (each costs FlexAttention two compiles, about half a minute),
    while the budget lasts; PROBE_SHAPES narrows it."""
    shapes = swept()
    if SWEEP_DTYPES:
        order = [(shape, dt) for shape in shapes for dt in SWEEP_DTYPES]
    else:
        order = [(shape, "float16") for shape in shapes] + ([] if DRY or not shapes else [(shapes[0], "bfloat16")])
    rows = []
    for (name, p, D), dt in order:
        if time.time() - T0 > BUDGET_S:
            log(f"  budget: skipping {name} {dt}")
            continue
        rows.append(sweep_one(name, p, D, dt, flex))
    results["sweep"] = rows


def proportionality(results):
    """A 1k window at N = 64k: our time per computed tile against fast causal's per tile of its problem."""
    N = 512 if DRY else 65536
    results["proportionality"] = [proportional_one(N, D) for D in ((32,) if DRY else (64, 128))]


def proportional_one(N: int, D: int) -> dict:
    import torch

    from flashattn import runtime
    from flashattn.kernels import VARIANTS, masked
    from flashattn.measure.measurements.masks import Problem, computed_tiles, tile_kinds

    p = Problem("window", N, window=N // 64)
    q, k, v, do = make(p, D, "float16")
    tiles = masked.tiles_for(q.dtype, D)[0]
    fns = {"window": functools.partial(ours, p, q, k, v, do, tiles),
           "fast causal": functools.partial(VARIANTS["fast"], q, k, v, causal=True)}
    with torch.no_grad():
        ms = rounds(first_calls(fns, "proportionality"))
    window_pairs = computed_tiles(tile_kinds(p, *tiles[:2], runtime.DEVICE)) * tiles[0] * tiles[1]
    row = {"D": D, "N": N, "window": p.window, "ms": ms,
           "time_per_tile_vs_causal": (ms["window"] / window_pairs) / (ms["fast causal"] / (N * (N + 1) / 2)),
           "computed_fraction_of_causal": window_pairs / (N * (N + 1) / 2)}
    log(f"  proportionality D={D}: {json.dumps(row)}")
    return row


def triton_paths(results):
    """Time per tile of the kernels a dense mask could run on, at the padding problem's size with every key kept
    (B 4, 16 heads, N 16k, not causal, fp16): the blocks kernel (every tile full), fast's Triton kernel with and
    without TMA descriptors at the same tiles, and fast's default (Gluon on Hopper). Which of the blocks kernel's
    costs is its loads, and which its tiles?"""
    import torch

    from flashattn.kernels import VARIANTS, masked
    from flashattn.measure.measurements.masks import Problem

    N, B = (256, 2) if DRY else (16384, 4)
    p = Problem("padding", N, B=B, lengths=(N,) * B)  # no padding: every key kept, every tile full
    rows = []
    for D in ((32,) if DRY else (64, 128)):
        q, k, v, _ = make(p, D, "float16")
        tiles = [masked.tiles_for(q.dtype, D, mask=torch.bool)[0]]
        tiles += [] if DRY else [{64: (128, 128, 8, 3), 128: (128, 128, 8, 2)}[D]]
        fns = {"fast default": functools.partial(VARIANTS["fast"], q, k, v, causal=False)}
        for t in tiles:
            bm, bn, w, st = t
            fns[f"blocks {t}"] = functools.partial(ours, p, q, k, v, None, t)
            for tma in (False, True) if t == tiles[-1] else (False,):
                fns[f"fast triton {t} tma={tma}"] = functools.partial(
                    VARIANTS["fast"], q, k, v, causal=False, gluon=False, use_tma=tma, block_m=bm, block_n=bn,
                    num_warps=w, num_stages=st, autotune=False)
        with torch.no_grad():
            ms = rounds(first_calls(fns, f"triton paths D={D}"))
        flop = 4 * B * HEADS * N * N * D
        row = {"D": D, "ms": ms, "tflops": {n: flop / (t * 1e-3) / 1e12 for n, t in ms.items()}}
        log(f"  triton paths D={D}: " + ", ".join(f"{n} {t:.0f}" for n, t in row["tflops"].items()) + " TFLOP/s")
        rows.append(row)
    results["triton_paths"] = rows


def summary(results):
    lines = ["", "=== masks probe summary ==="]
    bad = [r for r in results.get("correctness", []) if "error" in r or r["forward"] > TOL[r["dtype"]]
           or max(r.get("grads", [0])) > TOL[r["dtype"]]]
    lines.append(f"correctness: {len(results.get('correctness', [])) - len(bad)} ok, {len(bad)} failed")
    lines += [f"  FAILED {json.dumps(r)}" for r in bad]
    for r in results.get("sweep", []):
        f_best = max(r["forward_vs_flex"], key=r["forward_vs_flex"].get, default=None)
        t_best = max(r["training_vs_flex"], key=r["training_vs_flex"].get, default=None)
        lines.append(f"{r['shape']:<28} {r['dtype']:<9} forward best {f_best} ×flex "
                     f"{r['forward_vs_flex'].get(f_best, float('nan')):.2f}; fwd+bwd best {t_best} ×flex "
                     f"{r['training_vs_flex'].get(t_best, float('nan')):.2f}; flex compiles "
                     f"{r['compile_s']['flex forward']:.0f}+{r['compile_s']['flex forward+backward']:.0f} s")
    for r in results.get("proportionality", []):
        lines.append(f"window {r['window']} at N={r['N']} D={r['D']}: time per tile "
                     f"×{r['time_per_tile_vs_causal']:.2f} of fast causal's "
                     f"({r['computed_fraction_of_causal']:.1%} of causal's tiles)")
    lines.append(f"total {time.time() - T0:.0f} s")
    print("\n".join(lines), flush=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    import flashattn  # noqa: F401  (sets the mode first)

    results = {"dry": DRY}
    if not DRY:
        precompile()
    phases = {"correctness": correctness, "dense_masks": dense_masks, "sweep": lambda r: sweep(r, flex_setup()),
              "proportionality": proportionality, "triton_paths": triton_paths}
    unknown = sorted(set(PHASES) - set(phases))
    if unknown:
        raise SystemExit(f"PROBE_PHASES: unknown {unknown}; accepted: {', '.join(phases)}")
    for name, phase in phases.items():
        if PHASES and name not in PHASES:
            continue
        try:
            phase(results)
        except Exception as err:  # noqa: BLE001 - keep what the other phases found
            log(f"phase failed: {type(err).__name__}: {str(err)[:500]}")
        with open(os.path.join(OUT, "masks_probe.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    summary(results)


if __name__ == "__main__":
    main()
