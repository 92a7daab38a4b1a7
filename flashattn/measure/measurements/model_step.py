"""A whole model's training step on flashattn against torch SDPA, eager and ``torch.compile``d (notebook 13).

The course's GPT (``flashattn.models.gpt.GPT``: q, k and v are views of one fused QKV projection) with
4 layers, d_model 1024 (16 heads of 64) and 2048 (16 heads of 128), causal, N = 1024 ... 8192 with
B·N = 16384 tokens, in bf16 and fp16 autocast. One step is the forward, the loss (cross-entropy in float32)
and ``loss.backward()``, with the gradients set to None first; no optimizer step (it is the same code on both
sides, and ``gpt_training`` times one with AdamW). Each cell times four steps in interleaved rounds
(``bench.time_rounds``): the flashattn model and the torch model (the same weights), each eager and through
``torch.compile(model, fullgraph=True, dynamic=False)`` (default mode: Inductor on the GPU; ``fullgraph``
makes a graph break an error rather than a silent split, ``dynamic=False`` compiles each cell at its own
shapes instead of switching to dynamic shapes at the second N; ``torch._dynamo.reset()`` before every cell
keeps Dynamo's recompile limit out of the way). Beside each time, its peak memory above the weights
(``bench.peak_memory``, gradients included), and per cell SDPA_ms / flashattn_ms, eager and compiled (> 1:
flashattn's step is faster). For the flashattn model each cell also records how far the compiled step's loss
and gradients are from the eager step's (relative error; gradients: the worst parameter). The two models of
a width are built once, with position embeddings for the largest N, and serve every N (the same weights in
every row; the embeddings' gradient, 8192 × d_model float32, is in every peak, on both sides).

Runtime: the 16 cells' compiles (two models each, forward and backward, Inductor; about 140 s on the H200) and the
timing, 16 cells × 4 steps × ``ROUNDS = 5`` calls of ``do_bench`` of ``STEP_REP_MS`` each (about 190 s). A cell's
ratio divides the two models' median times; ``vs_sdpa_rounds`` keeps each round's ratio (the two models' steps in
that round), whose spread says how far from 1 a ratio must be to mean something. Each row records its first calls'
seconds (``first_call_s``, compiles and autotuning included) and the result its ``seconds``. The cut: a cell that
would start past :data:`BUDGET_S` is not measured and is listed in ``skipped``; with
``FLASHATTN_MODEL_STEP_CELLS=missing`` a run measures only the cells the previous run did not measure itself (those
the recording lacks or kept from an earlier run), and every run keeps the previous recording's rows of the cells it
does not measure (marked ``measured_at``), so that runs of a few minutes each fill the table.

:func:`run_cells` is the loop with the sizes as arguments, so that a CPU test runs it at a toy size
(``backend="aot_eager"``, float32).
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from flashattn import bench, runtime
from flashattn.measure import recorded
from flashattn.models.gpt import GPTConfig
from flashattn.record import measurement
from flashattn.reference import rel_error

from .training import ATTENTIONS, _autocast, make_model

CONFIGS = ((1024, 16), (2048, 16))  # (d_model, n_heads): heads of 64 and of 128
SEQ_LENS = (1024, 2048, 4096, 8192)
TOKENS = 16384  # B·N held fixed
N_LAYERS = 4
VOCAB_SIZE = 256
DTYPES = ("bfloat16", "float16")
ROUNDS = 5
# do_bench's milliseconds per timing: its default 100 holds 2-7 steps of 14-50 ms, and with it (and 3 rounds) one
# step's rounds differed by up to 19 % (median 3 %) in the 12-05 01:55 recording, more than the ratios they were to
# decide; 600 holds 12-42
STEP_REP_MS = 600
BUDGET_S = 480.0  # no cell starts after this many seconds (a whole run: about 470 s)


def cell_key(row: dict) -> tuple:
    """What tells two cells apart: (d_model, n_heads, N, dtype)."""
    return (row["d_model"], row["n_heads"], row["N"], row["dtype"])


def make_step(model, tokens, dtype, device):
    """One training step of ``model`` on ``tokens`` (B, N + 1) as a function of no arguments: gradients set to
    None, forward under ``dtype`` autocast, float32 cross-entropy, ``loss.backward()``. Returns the loss."""

    def step():
        model.zero_grad(set_to_none=True)
        with _autocast(device, dtype):
            logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        return loss

    return step


def loss_and_grads(step, model) -> tuple[torch.Tensor, dict]:
    """Run ``step`` once: its loss and a copy of every parameter's gradient, by name."""
    loss = step().detach()
    return loss, {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def compiled_vs_eager(eager_step, compiled_step, model) -> dict:
    """Relative error of the compiled step's loss and gradients against the eager step's (the same weights)."""
    loss_e, grads_e = loss_and_grads(eager_step, model)
    loss_c, grads_c = loss_and_grads(compiled_step, model)
    errors = {name: rel_error(grads_c[name], grads_e[name]) for name in grads_e}
    worst = max(errors, key=errors.get)
    return {"loss": rel_error(loss_c, loss_e), "grads": errors[worst], "worst_grad": worst}


def run_cells(configs=CONFIGS, seq_lens=SEQ_LENS, *, tokens: int = TOKENS, n_layers: int = N_LAYERS,
              vocab_size: int = VOCAB_SIZE, dtypes=DTYPES, rounds: int = ROUNDS, device=None, backend="inductor",
              seed: int = 0, progress=None, budget_s: float | None = None, skip=(),
              skipped: list | None = None) -> list[dict]:
    """One row per (d_model and heads, N, dtype): see the module docstring. ``configs`` holds (d_model, n_heads);
    ``dtypes`` are names ("bfloat16", "float16"; "float32" runs without autocast); B = tokens // N. Cells whose
    :func:`cell_key` is in ``skip`` are not run; with ``budget_s``, nor is a cell that would start past it (its
    key appended to ``skipped``)."""
    device = runtime.DEVICE if device is None else torch.device(device)
    bad = [N for N in seq_lens if tokens % N]
    if bad:
        raise ValueError(f"tokens={tokens} (B·N, held fixed) must be a multiple of every N; {bad} are not")
    rows, t0 = [], time.perf_counter()
    for d_model, n_heads in configs:
        todo = [(N, d) for N in seq_lens for d in dtypes if (d_model, n_heads, N, d) not in skip]
        if not todo:
            continue
        # one pair of models per width, their position embeddings long enough for every N: the same weights in
        # every row of a width
        config = GPTConfig(vocab_size, max(seq_lens), n_layers=n_layers, n_heads=n_heads, d_model=d_model)
        models = {name: make_model(config, fn, seed, device) for name, fn in ATTENTIONS.items()}
        for N, dtype_name in todo:
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                if skipped is not None:
                    skipped.append([d_model, n_heads, N, dtype_name])
                continue
            B = tokens // N
            data = torch.randint(0, vocab_size, (B, N + 1), generator=torch.Generator().manual_seed(seed + N))
            data = data.to(device)
            rows.append(_cell(models, data, getattr(torch, dtype_name), device, backend, rounds,
                              dict(d_model=d_model, n_heads=n_heads, head_dim=d_model // n_heads, N=N, B=B,
                                   n_layers=n_layers, dtype=dtype_name)))
            if progress:
                progress(format_row(rows[-1]))
        del models
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _cell(models, data, dtype, device, backend, rounds, row) -> dict:
    torch._dynamo.reset()  # each cell compiles afresh, far from the recompile limit
    compiled = {name: torch.compile(m, backend=backend, fullgraph=True, dynamic=False) for name, m in models.items()}
    steps, owner = {}, {}
    for name in models:
        steps[f"{name} eager"] = make_step(models[name], data, dtype, device)
        steps[f"{name} compiled"] = make_step(compiled[name], data, dtype, device)
        owner[f"{name} eager"] = owner[f"{name} compiled"] = models[name]
    first = {}
    for key, step in steps.items():  # compile, autotune, warm the caches outside the timing
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        first[key] = time.perf_counter() - t0
    check = compiled_vs_eager(steps["flashattn eager"], steps["flashattn compiled"], models["flashattn"])
    times = bench.time_rounds(steps, rounds, rep=STEP_REP_MS)
    peaks = {}
    for key, step in steps.items():
        owner[key].zero_grad(set_to_none=True)  # the peak counts this step's gradients
        peaks[key] = bench.peak_memory(step)
    ms = {key: statistics.median(t) for key, t in times.items()}
    for model in models.values():
        model.zero_grad(set_to_none=True)
    return {**row, "ms": ms, "ms_rounds": times, "peak_bytes": peaks, "first_call_s": first,
            "vs_sdpa": {mode: ms[f"torch {mode}"] / ms[f"flashattn {mode}"] for mode in ("eager", "compiled")},
            "vs_sdpa_rounds": {mode: [t / f for t, f in zip(times[f"torch {mode}"], times[f"flashattn {mode}"],
                                                            strict=True)] for mode in ("eager", "compiled")},
            "compiled_vs_eager": check}


def merge_with_previous(rows: list, skipped: list, previous: dict | None) -> tuple[list, list]:
    """This run's rows, with the previous recording's rows of the cells this run did not measure (each marked
    ``measured_at``, when it was), in the table's order; and the skipped cells that neither run measured."""
    measured = {cell_key(r) for r in rows}
    if previous is not None:
        rows = rows + [{**r, "measured_at": r.get("measured_at", previous["recorded_at"])} for r in previous["rows"]
                       if cell_key(r) not in measured]
    have = {cell_key(r) for r in rows}
    order = {(d_model, heads, N, d): i for i, (d_model, heads, N, d) in
             enumerate((c[0], c[1], N, d) for c in CONFIGS for N in SEQ_LENS for d in DTYPES)}
    rows = sorted(rows, key=lambda r: order.get(cell_key(r), len(order)))
    return rows, [list(k) for k in skipped if tuple(k) not in have]


def format_row(row: dict) -> str:
    """One line per cell, for the measurement's progress."""
    peak = row["peak_bytes"]
    return (f"d_model={row['d_model']} {row['n_heads']}x{row['head_dim']} N={row['N']} B={row['B']} {row['dtype']}: "
            f"SDPA/flashattn eager {row['vs_sdpa']['eager']:.2f}, compiled {row['vs_sdpa']['compiled']:.2f}; "
            f"flashattn ms eager {row['ms']['flashattn eager']:.2f}, compiled {row['ms']['flashattn compiled']:.2f}; "
            f"peak GiB flashattn {peak['flashattn eager'] / 2**30:.2f}/{peak['flashattn compiled'] / 2**30:.2f}, "
            f"torch {peak['torch eager'] / 2**30:.2f}/{peak['torch compiled'] / 2**30:.2f}; "
            f"compiled vs eager: loss {row['compiled_vs_eager']['loss']:.1e}, "
            f"grads {row['compiled_vs_eager']['grads']:.1e}")


def summary(rows) -> dict:
    """Per dtype, the largest compiled-vs-eager errors over the cells: ``{dtype: {"loss", "grads"}}``."""
    out = {}
    for r in rows:
        entry = out.setdefault(r["dtype"], {"loss": 0.0, "grads": 0.0})
        entry["loss"] = max(entry["loss"], r["compiled_vs_eager"]["loss"])
        entry["grads"] = max(entry["grads"], r["compiled_vs_eager"]["grads"])
    return out


@measurement("model_step_vs_sdpa", description="the GPT's forward+backward on flashattn vs torch SDPA, eager and "
                                               "torch.compile'd: d_model 1024/2048, N 1k..8k, bf16/fp16")
def model_step_vs_sdpa() -> dict:
    if runtime.MODE != "gpu":
        raise RuntimeError("model_step_vs_sdpa measures a GPU; notebook 13 shows the recorded result instead")
    t0 = time.perf_counter()
    previous = recorded.find("model_step_vs_sdpa", gpu=runtime.gpu_name())
    wanted = os.environ.get("FLASHATTN_MODEL_STEP_CELLS", "all").strip()
    if wanted not in ("all", "missing"):
        raise ValueError(f"FLASHATTN_MODEL_STEP_CELLS={wanted!r}: 'all' or 'missing'")
    skip = set()
    if previous and wanted == "missing":  # the rows the previous run measured itself (not kept from an earlier one)
        skip = {cell_key(r) for r in previous["rows"] if "measured_at" not in r}
    skipped = []
    rows = run_cells(device="cuda", progress=lambda line: print("  " + line, flush=True), budget_s=BUDGET_S,
                     skip=skip, skipped=skipped)
    rows, skipped = merge_with_previous(rows, skipped, previous)
    return {"configs": [list(c) for c in CONFIGS], "seq_lens": list(SEQ_LENS), "tokens": TOKENS,
            "n_layers": N_LAYERS, "vocab_size": VOCAB_SIZE, "dtypes": list(DTYPES), "causal": True,
            "rounds": ROUNDS, "rep_ms": STEP_REP_MS,
            "compile": {"backend": "inductor", "mode": "default", "fullgraph": True, "dynamic": False},
            "optimizer_step": False, "rows": rows, "compiled_vs_eager": summary(rows),
            "skipped": [dict(zip(("d_model", "n_heads", "N", "dtype"), k, strict=True)) for k in skipped],
            "budget_s": BUDGET_S,
            "seconds": time.perf_counter() - t0,
            "notes": "one step: gradients set to None, forward in autocast, float32 cross-entropy, loss.backward() "
                     "(no optimizer step); the flashattn and torch models share their weights; ms: do_bench's "
                     "median over as many steps as fit rep_ms, median over interleaved rounds; vs_sdpa_rounds: "
                     "each round's torch ms / flashattn ms; peak_bytes: above the weights, gradients included; "
                     "vs_sdpa: torch's ms / flashattn's (> 1: flashattn faster); compiled_vs_eager: the flashattn "
                     "model's compiled step against its eager step, relative error of the loss and of the worst "
                     "parameter's gradient"}
