"""Timing, throughput and peak memory; ``python -m flashattn.bench`` compares the fast kernel with PyTorch.

    python -m flashattn.bench                       # v2, fast and SDPA: fp16/bf16, D 64/128, N 1k..16k
    python -m flashattn.bench --dtypes float16 --head-dims 128 --seq-lens 4096 --causal true
    python -m flashattn.bench --record              # the same table, saved into figures/data/ (via flashattn.record)

FLOP convention (the one FlashAttention papers use, ``flashattn.roofline.attention_flops``): a forward pass
does two matrix products of 2·N·N·D multiply-adds per (batch, head), so 4·B·H·N²·D FLOP; causal attention
does half of that. The variants the table times by default are those registered with ``in_bench=True``.
Times are medians of ``triton.testing.do_bench`` (GPU only). The side-by-side table times the kernels of
a problem in interleaved rounds (SDPA, fast, v2, SDPA, fast, v2, ...) and keeps each kernel's median over
the rounds: an H200 under load runs at its power limit, its clock drifts by tens of percent within
seconds, and kernels timed one after another would each meet a different clock.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import sys

import torch

from flashattn import runtime
from flashattn.kernels import registry
from flashattn.models.roofline import attention_flops
from flashattn.reference import reference, rel_error


def tflops(B: int, H: int, N: int, D: int, ms: float, causal: bool = False) -> float:
    """Throughput of a forward pass that took ``ms`` milliseconds, by :func:`attention_flops`."""
    return attention_flops(B, H, N, D, causal) / (ms * 1e-3) / 1e12


L2_FLUSHES = ("zeros", "read")


@contextlib.contextmanager
def l2_flush(how: str):
    """How ``triton.testing.do_bench`` empties the L2 before each timed call, inside the block. ``"zeros"``: its own
    way, zeros written over a 256 MB buffer. They stay in the L2 as dirty lines, and the timed kernel's misses write
    them back to DRAM within its interval: up to an L2 of bytes that are not the kernel's, a fixed cost that weighs
    on a kernel reading a few MB (``tools/gpu/decode/flush.py``; ``decode_vs_sdpa``'s ``flush_effect``). ``"read"``:
    the same buffer read instead (its sum), which leaves the L2 as cold, with clean lines."""
    if how not in L2_FLUSHES:
        raise ValueError(f"l2_flush: how must be one of {L2_FLUSHES}, got {how!r}")
    if how == "zeros":
        yield
        return
    import triton

    driver = triton.runtime.driver.active
    before = vars(driver).get("clear_cache")
    driver.clear_cache = lambda cache: cache.sum()  # an instance attribute over the driver's method
    try:
        yield
    finally:
        if before is None:
            del driver.clear_cache
        else:
            driver.clear_cache = before


def time_ms(fn, *, warmup: int = 25, rep: int = 100, flush: str = "zeros") -> float:
    """Median time of ``fn()`` in milliseconds, by ``triton.testing.do_bench`` (needs a GPU), the L2 emptied before
    each call by ``flush`` (:func:`l2_flush`)."""
    if runtime.MODE != "gpu":
        raise RuntimeError(
            "live timings need a GPU: in interpreter mode the course shows the recorded results "
            "(flashattn.recorded) instead"
        )
    from triton.testing import do_bench

    with l2_flush(flush):
        return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def time_rounds(fns: dict, rounds: int, *, rep: int = 100) -> dict[str, list[float]]:
    """Each ``fns[name]()`` timed by :func:`time_ms` in ``rounds`` interleaved rounds (a, b, c, a, b, c, ...):
    under load the clock drifts, and interleaving lets every function meet the same drift. Returns each
    name's times, one per round (the callers keep their median). ``rep``: do_bench's milliseconds per timing
    (it runs as many calls as fit, at least one)."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_ms(fn, rep=rep))
    return times


def sdpa(q, k, v, *, causal=False, scale=None):
    """PyTorch's own attention, the baseline every kernel is compared with."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def call(name: str, q, k, v, *, causal: bool = False, **options):
    """A function of no arguments that runs ``name`` (a registered variant, or "sdpa") on ``q, k, v``."""
    if name == "sdpa":
        if options:
            raise ValueError(f"sdpa takes no options, got {sorted(options)}")
        return functools.partial(sdpa, q, k, v, causal=causal)
    return functools.partial(registry.get(name).fn, q, k, v, causal=causal, **options)


def peak_memory(fn) -> int:
    """Peak bytes allocated on the GPU while ``fn()`` runs, above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def memory_vs_n(N_values, variants=("naive", "v2", "sdpa"), *, B: int, H: int, D: int, dtype=torch.float16,
                max_n: dict | None = None, rep: int = 100) -> dict:
    """Time and peak memory of each variant (or "sdpa") against N on the GPU, non-causal: the recorded
    'memory_vs_n' format, ``{"B", "H", "D", "dtype", "causal", "rows"}``.

    For each N, fresh inputs (seeded by N); per variant, :func:`peak_memory` (bytes above the inputs) and
    :func:`time_ms` (``rep`` ms of do_bench). A variant that runs out of memory gets a row with ``"oom"``
    and is not run at larger N; ``max_n`` (``{variant: N}``) leaves a variant out above an N.
    """
    if runtime.MODE != "gpu":
        raise RuntimeError("memory_vs_n measures a GPU; in interpreter mode read recorded.get('memory_vs_n')")
    fns = {name: None if name == "sdpa" else registry.get(name).fn for name in variants}  # validates the names
    rows, stopped = [], set()
    for N in N_values:
        q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N)
        for name in fns:
            if name in stopped or N > (max_n or {}).get(name, N):
                continue
            fn = call(name, q, k, v)
            row = {"variant": name, "N": N, "input_bytes": 3 * q.numel() * q.element_size(),
                   "output_bytes": q.numel() * q.element_size()}
            try:
                row.update(peak_bytes_above_inputs=peak_memory(fn), ms=time_ms(fn, rep=rep))
            except torch.cuda.OutOfMemoryError as err:
                row["oom"] = str(err).splitlines()[0]
                stopped.add(name)
            torch.cuda.empty_cache()
            rows.append(row)
        del q, k, v
        torch.cuda.empty_cache()
    return {"B": B, "H": H, "D": D, "dtype": str(dtype).replace("torch.", ""), "causal": False, "rows": rows}


# --- the side-by-side benchmark of notebook 10 ---------------------------------------------------

BENCH_DTYPES = ("float16", "bfloat16")
BENCH_HEAD_DIMS = (64, 128)
BENCH_SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
BENCH_TOKENS = 16384  # B·N is held fixed, so every row does the same number of rows of work
BENCH_HEADS = 16
BENCH_ROUNDS = 3


def default_variants() -> list[str]:
    """The variants the table times when none are named: those registered with ``in_bench=True``."""
    return registry.names(bench=True)


def compare(variants=None, dtypes=BENCH_DTYPES, head_dims=BENCH_HEAD_DIMS, seq_lens=BENCH_SEQ_LENS,
            causals=(False, True), tokens: int = BENCH_TOKENS, H: int = BENCH_HEADS, check: bool = True,
            rounds: int = BENCH_ROUNDS, progress=None) -> list[dict]:
    """Time each variant and SDPA on the same inputs, one problem after another, on the GPU.

    ``variants`` defaults to :func:`default_variants`. One row per (dtype, D, N, causal) with
    B = tokens // N: ``ms`` and ``tflops`` per kernel (the
    median over ``rounds`` interleaved rounds of do_bench's median; each round's time in ``ms_rounds``),
    ``vs_sdpa`` = SDPA's time / the variant's time (> 1: faster than SDPA) and, with ``check``, each
    variant's relative error against the float64 reference on the first two heads of the first batch.
    """
    variants = default_variants() if variants is None else list(variants)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    if runtime.MODE != "gpu":
        raise RuntimeError("the benchmark needs a GPU; notebook 10 shows the recorded table instead")
    for name in variants:
        registry.get(name)  # ValueError naming the registered variants
    rows = []
    for problem, (q, k, v) in problems(dtypes, head_dims, seq_lens, tokens, H):
        for causal in causals:
            row = {**problem, "causal": causal, "ms": {}, "tflops": {}, "vs_sdpa": {}, "rel_error": {}}
            kernels = {name: call(name, q, k, v, causal=causal) for name in ("sdpa", *variants)}
            for fn in kernels.values():
                fn()  # compile and autotune outside the timing
            row["ms_rounds"] = time_rounds(kernels, rounds)
            for name in kernels:
                row["ms"][name] = statistics.median(row["ms_rounds"][name])
                row["tflops"][name] = tflops(row["B"], H, row["N"], row["D"], row["ms"][name], causal)
            for name in variants:
                row["vs_sdpa"][name] = row["ms"]["sdpa"] / row["ms"][name]
                if check:
                    sl = (slice(0, 1), slice(0, 2))
                    out = kernels[name]()[sl]  # the timed call's own output
                    row["rel_error"][name] = rel_error(out, reference(q[sl], k[sl], v[sl], causal=causal))
            rows.append(row)
            if progress:
                progress(format_row(row, variants))
    return rows


def problems(dtypes, head_dims, seq_lens, tokens: int, H: int):
    """The table's problems, one after another: ``({"dtype", "B", "H", "N", "D"}, (q, k, v))`` with
    B = tokens // N (B·N held fixed) and fresh inputs on the GPU, seeded by N + D."""
    _check_tokens(tokens, seq_lens)
    for dtype_name in dtypes:
        for D in head_dims:
            for N in seq_lens:
                B = tokens // N
                qkv = runtime.random_qkv(B, H, N, D, dtype=getattr(torch, dtype_name), seed_value=N + D)
                yield {"dtype": dtype_name, "B": B, "H": H, "N": N, "D": D}, qkv


def _check_tokens(tokens: int, seq_lens) -> None:
    """B = tokens // N for every N: each sequence length must divide ``tokens``."""
    bad = [N for N in seq_lens if N < 1 or tokens % N]
    if bad:
        raise ValueError(f"tokens={tokens} (B·N, held fixed) must be a multiple of every sequence length; "
                         f"{', '.join(map(str, bad))} is not a divisor")


def format_header(variants=None) -> str:
    """The table's header line (``variants`` defaults to :func:`default_variants`)."""
    variants = default_variants() if variants is None else variants
    cells = "".join(f"{name + ' TF/s':>12}{'×SDPA':>7}" for name in variants)
    return f"{'dtype':<9}{'D':>4}{'N':>7}{'B':>4} {'causal':<7}{'SDPA TF/s':>10}{cells}"


def format_row(row: dict, variants=None) -> str:
    """One line of the table for a row of :func:`compare`."""
    variants = default_variants() if variants is None else variants
    cells = "".join(f"{row['tflops'][n]:>12.0f}{row['vs_sdpa'][n]:>7.2f}" for n in variants)
    return (f"{row['dtype']:<9}{row['D']:>4}{row['N']:>7}{row['B']:>4} {str(row['causal']):<7}"
            f"{row['tflops']['sdpa']:>10.0f}{cells}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashattn.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=None,
                        help=f"registered variants to time next to SDPA (default: {' '.join(default_variants())})")
    parser.add_argument("--dtypes", nargs="+", default=list(BENCH_DTYPES), choices=["float16", "bfloat16"])
    parser.add_argument("--head-dims", nargs="+", type=int, default=list(BENCH_HEAD_DIMS))
    parser.add_argument("--seq-lens", nargs="+", type=int, default=list(BENCH_SEQ_LENS))
    parser.add_argument("--causal", choices=["both", "true", "false"], default="both")
    parser.add_argument("--rounds", type=int, default=BENCH_ROUNDS,
                        help="interleaved timing rounds per problem (each kernel's median over them is shown)")
    parser.add_argument("--record", action="store_true",
                        help="run the default table as the 'fast_vs_sdpa' measurement and save it in figures/data/")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if runtime.MODE != "gpu":
        print("flashattn.bench times kernels on a GPU, and none is in use here (" + runtime.describe() + ").\n"
              "Notebook 10 shows the recorded table instead.", file=sys.stderr)
        return 2
    if args.record:
        from flashattn import record

        print(f"[bench] wrote {record.run(['fast_vs_sdpa'], command='python -m flashattn.bench --record')}")
        return 0
    causals = {"both": (False, True), "true": (True,), "false": (False,)}[args.causal]
    tokens = max(BENCH_TOKENS, *args.seq_lens)
    try:
        _check_tokens(tokens, args.seq_lens)
    except ValueError as err:
        parser.error(f"--seq-lens: {err}")
    variants = default_variants() if args.variants is None else args.variants
    print(format_header(variants), flush=True)
    compare(variants, args.dtypes, args.head_dims, args.seq_lens, causals, tokens=tokens, rounds=args.rounds,
            progress=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    from flashattn.bench import main as _main

    sys.exit(_main())
