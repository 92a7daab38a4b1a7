"""A small GPT trained side by side on two attentions (notebook 13): loss curves, accuracy, step time, memory.

Two copies of ``flashattn.models.gpt.GPT`` start from the same weights and read the same batches of the
associative-recall task (``flashattn.models.tasks``); one calls ``flashattn.scaled_dot_product_attention``,
the other torch's. Whatever differs between their curves comes from the attention alone.

The registered measurement ``gpt_training`` (GPU) records the curves of a run long enough to learn the task,
and the time and peak memory of one training step at a real length (N = 4096 and 8192).
"""

from __future__ import annotations

import contextlib
import time

import torch

from flashattn import bench, runtime
from flashattn.functional import scaled_dot_product_attention
from flashattn.models.gpt import GPT, GPTConfig
from flashattn.models.tasks import AssociativeRecall
from flashattn.record import measurement

ATTENTIONS = {"flashattn": scaled_dot_product_attention,
              "torch": torch.nn.functional.scaled_dot_product_attention}


def make_model(config: GPTConfig, attention, seed: int, device) -> GPT:
    """The GPT with ``attention``, its weights drawn from ``seed`` (the same weights for every attention)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(config, attention)
    return model.to(device)


def _autocast(device, dtype):
    """bfloat16/float16 autocast on a GPU (the attention then runs in 16 bits); nothing for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def loss_and_accuracy(model, task: AssociativeRecall, batch, device, dtype=torch.float32):
    """Cross-entropy and accuracy of the next-token prediction at the answer positions of ``batch``."""
    inputs, targets, answer = (t.to(device) for t in batch)
    with _autocast(device, dtype):
        logits = model(inputs)
    logits, targets = logits[answer].float(), targets[answer]
    return torch.nn.functional.cross_entropy(logits, targets), (logits.argmax(-1) == targets).float().mean()


def train_side_by_side(config: GPTConfig, task: AssociativeRecall, *, steps: int, batch: int, lr: float = 3e-3,
                       seed: int = 0, device=None, dtype=torch.float32, eval_batch: int = 256, progress=None,
                       attentions=None) -> dict:
    """Train one model per attention (default :data:`ATTENTIONS`) from the same weights on the same batches.

    Returns ``{"loss": {name: [loss at each step]}, "accuracy": {name: accuracy on a fresh batch of
    eval_batch sequences at the end}, "eval_loss": {...}, "seconds": {name: wall time}}``. The models step in
    turn, batch by batch, so that both see the same clock if the machine slows down."""
    device = runtime.DEVICE if device is None else device
    attentions = ATTENTIONS if attentions is None else attentions
    models = {name: make_model(config, fn, seed, device) for name, fn in attentions.items()}
    optims = {name: torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0) for name, m in models.items()}
    schedule = {name: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=lr, total_steps=steps, pct_start=0.1)
                for name, o in optims.items()}
    data = torch.Generator().manual_seed(seed + 1)
    out = {"loss": {name: [] for name in models}, "seconds": {name: 0.0 for name in models}}
    for step in range(steps):
        batch_ = task.sample(batch, data)
        for name, model in models.items():
            t0 = time.perf_counter()
            loss, _ = loss_and_accuracy(model, task, batch_, device, dtype)
            optims[name].zero_grad(set_to_none=True)
            loss.backward()
            optims[name].step()
            schedule[name].step()
            out["loss"][name].append(loss.item())
            out["seconds"][name] += time.perf_counter() - t0
        if progress and (step + 1) % max(1, steps // 10) == 0:
            progress(f"step {step + 1}/{steps}: " + ", ".join(f"{n} {out['loss'][n][-1]:.3f}" for n in models))
    held_out = task.sample(eval_batch, torch.Generator().manual_seed(seed + 2))
    out["eval_loss"], out["accuracy"] = {}, {}
    with torch.no_grad():
        for name, model in models.items():
            loss, acc = loss_and_accuracy(model, task, held_out, device, dtype)
            out["eval_loss"][name], out["accuracy"][name] = loss.item(), acc.item()
    return out


def step_cost(config: GPTConfig, attention, *, batch: int, dtype=torch.bfloat16, seed: int = 0) -> dict:
    """Time (do_bench median, ms) and peak memory above the model (bytes) of one training step on the GPU:
    forward, backward and the optimizer, on random tokens of the config's length."""
    model = make_model(config, attention, seed, "cuda")
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, config.vocab_size, (batch, config.seq_len + 1), device="cuda")

    def step():
        with _autocast("cuda", dtype):
            logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()

    step()  # compile, autotune, and create the optimizer's state outside the measurement
    return {"ms": bench.time_ms(step), "peak_bytes": bench.peak_memory(step)}


# --- the registered measurement ---------------------------------------------------------------------

CURVES = dict(task=dict(n_pairs=8, n_keys=16, n_values=16), model=dict(n_layers=2, n_heads=2, d_model=128),
              steps=1500, batch=64, lr=3e-3, dtype="bfloat16")
STEP_COST = dict(seq_lens=(4096, 8192), tokens=32768, model=dict(n_layers=4, n_heads=8, d_model=512),
                 vocab_size=256, dtype="bfloat16")


@measurement("gpt_training", description="a small GPT on flashattn vs torch SDPA: loss curves, accuracy, "
                                         "step time and peak memory at N 4096/8192 (bf16)")
def gpt_training() -> dict:
    dtype = getattr(torch, CURVES["dtype"])
    task = AssociativeRecall(**CURVES["task"])
    config = GPTConfig(vocab_size=task.vocab_size, seq_len=task.seq_len, **CURVES["model"])
    curves = train_side_by_side(config, task, steps=CURVES["steps"], batch=CURVES["batch"], lr=CURVES["lr"],
                                dtype=dtype, device="cuda", progress=lambda line: print("  " + line, flush=True))
    rows = []
    for N in STEP_COST["seq_lens"]:
        cfg = GPTConfig(vocab_size=STEP_COST["vocab_size"], seq_len=N, **STEP_COST["model"])
        for name, fn in ATTENTIONS.items():
            cost = step_cost(cfg, fn, batch=STEP_COST["tokens"] // N, dtype=getattr(torch, STEP_COST["dtype"]))
            rows.append({"attention": name, "N": N, "batch": STEP_COST["tokens"] // N, **cost})
            print(f"  N={N} {name}: {cost['ms']:.2f} ms per step, peak {cost['peak_bytes'] / 2**30:.2f} GiB",
                  flush=True)
            torch.cuda.empty_cache()
    return {"curves": {**CURVES, **curves}, "step_cost": {**STEP_COST, "rows": rows},
            "notes": "curves: the two models start from the same weights and read the same batches, in bf16 "
                     "autocast; accuracy on 256 fresh sequences at the end. step_cost: one training step (forward, "
                     "backward, AdamW) timed by do_bench (median) and its peak memory above the model and optimizer"}
