"""Masked attention against FlexAttention on the same GPU (notebook 14): ``masks_vs_flex``.

Cells: sliding windows of 256, 1k and 4k keys (causal, each query sees its last W keys) at N = 16k and 64k;
packed documents of random lengths 128-4k (causal in each document) filling N = 16k and 64k; and a key-padding
mask through ``attn_mask`` (B = 4 sequences of 16k, each with a random valid length); fp16 and bf16, D = 64 and
128, B·H = 16 heads, forward and forward+backward. Beside ours, in interleaved rounds on the same inputs:

* ``flex``: ``torch.compile``'d ``flex_attention`` with the same mask (its ``BlockMask`` built once per cell, from the
  same classification as ours at its 128 × 128 blocks, which the tests check against ``create_block_mask``);
* ``sdpa``: torch's SDPA with the dense mask (N × N booleans; the padding mask as its (B, 1, 1, S) broadcast), where
  that fits: up to N = 16k (:data:`SDPA_MAX_N`);
* ``fast_full``: ``fast`` on the whole length (causal; not causal for padding), what one runs without masks.

``tflops`` count the pairs the mask keeps (4·D FLOP per pair forward, 3.5× that forward+backward), the same for
every kernel; ``tflops_computed`` the pairs of the tiles each kernel computes (its hardware rate: ours and
FlexAttention by their computed tiles, SDPA every pair, ``fast_full`` causal's); the ratios are times.
``tiles``: how many tiles each kernel computes, and ``time_per_tile_vs_full``: our time per computed tile over
``fast_full``'s time per tile of its problem (1: time proportional to the tiles).

The cut (to fit about 6 minutes on an H200, most of it FlexAttention's compiles: one forward and one backward
per (mask kind, N, dtype, D), the windows of one N sharing them): cells run in groups by (dtype, D), fp16 D = 128
first; a group that would start past :data:`BUDGET_S` is skipped and listed in ``skipped``, and
``FLASHATTN_MASKS_GROUPS`` measures the others in a later run, which keeps the rows of the groups it does not
measure (so two runs of 6 minutes fill the table; ``FLASHATTN_MASKS_BUDGET_S`` = 400 lets one run of about 7
minutes measure all four). SDPA's dense mask only up to N = 16k.
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time

import torch

from flashattn import masking, masking_gluon, runtime
from flashattn.functional import attention, scaled_dot_product_attention
from flashattn.kernels import mask_blocks, masked
from flashattn.masking import attention_varlen
from flashattn.measure import recorded
from flashattn.record import measurement
from flashattn.reference import rel_error

WINDOWS = (256, 1024, 4096)
LENGTHS = (16384, 65536)
DOCUMENT_LENGTHS = (128, 4096)
PADDING = dict(B=4, N=16384)  # valid lengths uniform in N/4 .. N, one of them N
GROUPS = (("float16", 128), ("bfloat16", 128), ("float16", 64), ("bfloat16", 64))
HEADS = 16
SDPA_MAX_N = 16384  # SDPA with a dense mask: N² booleans (4 GB at 64k) and no skipping (a tenth of a second a call)
ROUNDS, WARMUP_MS, REP_MS = 3, 10, 50
BUDGET_S = float(os.environ.get("FLASHATTN_MASKS_BUDGET_S", "300"))  # longer: the whole table in one run
FLEX_BLOCK = 128  # FlexAttention's default block of its BlockMask
TRAINING_FACTOR = 3.5  # forward+backward in forward passes (the course's convention, as notebook 12's)
TOLERANCE = {"float16": 3e-3, "bfloat16": 2e-2}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One mask: ``kind`` "window" (``window`` keys per query, causal), "documents" (``lengths`` of the packed
    documents, causal in each) or "padding" (``lengths``: each sequence's valid keys; not causal)."""

    kind: str
    N: int
    B: int = 1
    window: int = 0
    lengths: tuple = ()

    @property
    def causal(self) -> bool:
        return self.kind != "padding"

    @property
    def label(self) -> str:
        if self.kind == "window":
            return f"window {self.window} at N={self.N}"
        if self.kind == "documents":
            return f"{len(self.lengths)} documents in N={self.N}"
        return f"padding, B={self.B} N={self.N}"


def document_lengths(N: int, seed: int = 0, bounds=DOCUMENT_LENGTHS) -> tuple[int, ...]:
    """Random document lengths in ``bounds`` that fill N exactly (the last one cut to fit)."""
    rng, lengths = random.Random(seed + N), []
    while sum(lengths) < N:
        lengths.append(min(rng.randint(*bounds), N - sum(lengths)))
    return tuple(lengths)


def padding_lengths(B: int, N: int, seed: int = 0) -> tuple[int, ...]:
    rng = random.Random(seed + B)
    return (N, *(rng.randint(N // 4, N) for _ in range(B - 1)))


def problems(lengths=LENGTHS, windows=WINDOWS, padding=PADDING) -> list[Problem]:
    out = [Problem("window", N, window=W) for N in lengths for W in windows]
    out += [Problem("documents", N, lengths=document_lengths(N)) for N in lengths]
    out.append(Problem("padding", padding["N"], B=padding["B"], lengths=padding_lengths(padding["B"], padding["N"])))
    return out


def kept_pairs(p: Problem) -> int:
    """(query, key) pairs the mask keeps, over the batch (one head)."""
    if p.kind == "window":
        W = min(p.window, p.N)
        return W * p.N - W * (W - 1) // 2
    if p.kind == "documents":
        return sum(n * (n + 1) // 2 for n in p.lengths)
    return p.N * sum(p.lengths)


def dense_mask(p: Problem, device) -> torch.Tensor:
    """The mask as SDPA takes it: (N, N) booleans, or the (B, 1, 1, N) padding mask."""
    if p.kind == "window":
        return mask_blocks.window_mask(p.N, p.N, (p.window - 1, 0), causal=True, device=device)
    if p.kind == "documents":
        return mask_blocks.document_mask(p.lengths, causal=True, device=device)
    return mask_blocks.padding_mask(p.lengths, p.N, device=device)


def mask_dtype(p: Problem):
    """The dtype of the dense mask ours runs the problem with (padding: the drop-in's boolean attn_mask); None for
    windows and documents, which have their own kernels (``masking.default_tiles`` takes it)."""
    return torch.bool if p.kind == "padding" else None


def ours_block(p: Problem, q, k, v) -> tuple[str, int, int]:
    """Which kernel runs our forward on these inputs ("gluon": ``masking_gluon.takes_gluon_window``'s windows,
    ``takes_gluon_key_mask``'s padding and ``takes_gluon_documents``' documents; else "triton") and the (rows, keys)
    of the tiles it computes."""
    dtype, D = q.dtype, q.shape[-1]
    window = masking.Spec(p.window - 1, 0, True) if p.kind == "window" else None
    if window is not None and masking_gluon.takes_gluon_window(q, k, v, window, None, None):
        return ("gluon", *masked.gluon_window_block(dtype, D))
    if p.kind == "padding":
        padding = masking.Spec(-1, -1, False, mask=dense_mask(p, q.device).expand(p.B, q.shape[1], p.N, p.N))
        if masking_gluon.takes_gluon_key_mask(q, k, v, padding, None, None):
            return ("gluon", *masked.gluon_block(masked.GLUON_KEY_MASK[D]))
    if p.kind == "documents":
        cu = mask_blocks.cu_seqlens(p.lengths, q.device)
        docs = masking.Spec(-1, 0, True, cu, cu, max(p.lengths), max(p.lengths))
        if masking_gluon.takes_gluon_documents(q, k, v, docs, None, None):
            return ("gluon", *masked.gluon_block(masked.GLUON_DOCUMENTS[D]))
    return ("triton", *masked.tiles_for(dtype, D, mask=mask_dtype(p))[0][:2])


def tile_kinds(p: Problem, block_m: int, block_n: int, device=None, per_document: bool = False) -> torch.Tensor:
    """The tile kinds of the mask at these blocks: (B or 1, 1, Tm, Tn); ``per_document``: the packed documents'
    tiles as ``attention_varlen`` cuts them (blocks starting at each document), summed into one (1, 1, 2) count
    of (full, partial) tiles."""
    if p.kind == "window":
        kinds = mask_blocks.window_kinds(p.N, p.N, block_m, block_n, (p.window - 1, 0), True, device=device)
    elif p.kind == "documents" and per_document:
        found = sum(mask_blocks.counts(mask_blocks.window_kinds(n, n, block_m, block_n, causal=True)).sum(0)
                    for n in p.lengths)
        return found.view(1, 1, 2)
    else:
        kinds = mask_blocks.classify(dense_mask(p, device), block_m, block_n, shape=(p.N, p.N))
    return kinds.view(-1, 1, *kinds.shape[-2:])


def computed_tiles(kinds: torch.Tensor) -> int:
    if kinds.shape[-1] == 2 and kinds.dim() == 3:  # a (full, partial) count
        return int(kinds.sum())
    return int((kinds != mask_blocks.SKIPPED).sum())


# --- the kernels of a cell ---------------------------------------------------------------------------------------

def flex_mask_mods(device) -> tuple[dict, dict]:
    """One mask_mod per kind, each reading the tensors of ``state`` that :func:`flex_block_mask` sets per problem:
    the same functions every cell, so that the compiled kernels of one (kind, N, dtype, D) serve every window."""
    state = {"window": torch.zeros((), dtype=torch.int32, device=device), "doc": None, "lengths": None}

    def sliding_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < state["window"])

    def documents(b, h, q_idx, kv_idx):
        doc = state["doc"]
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    def padding(b, h, q_idx, kv_idx):
        return kv_idx < state["lengths"][b]

    return state, {"window": sliding_window, "documents": documents, "padding": padding}


def flex_block_mask(p: Problem, state: dict, mask_mods: dict, device):
    """FlexAttention's BlockMask of the problem (its 128 × 128 blocks), built once, from our classification."""
    from torch.nn.attention.flex_attention import BlockMask

    if p.kind == "window":
        state["window"].fill_(p.window)
    elif p.kind == "documents":
        state["doc"] = mask_blocks.document_ids(p.lengths).to(device)
    else:
        state["lengths"] = torch.tensor(p.lengths, dtype=torch.int32, device=device)
    t = mask_blocks.block_tables(tile_kinds(p, FLEX_BLOCK, FLEX_BLOCK, device), FLEX_BLOCK, FLEX_BLOCK)
    return BlockMask.from_kv_blocks(t.kv_num_blocks, t.kv_indices, t.full_kv_num_blocks, t.full_kv_indices,
                                    BLOCK_SIZE=FLEX_BLOCK, mask_mod=mask_mods[p.kind], seq_lengths=(p.N, p.N))


def inputs(p: Problem, D: int, dtype, device, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(p.B, HEADS, p.N, D, device=device, generator=gen, dtype=dtype) for _ in range(4))


def packed(x: torch.Tensor) -> torch.Tensor:
    """(1, H, N, D) seen as the packed (N, H, D) of flash_attn_varlen_func (a view)."""
    return x[0].transpose(0, 1)


def unpacked(x: torch.Tensor) -> torch.Tensor:
    """Packed (N, H, D) seen as (1, H, N, D) (a view): :func:`packed` undone."""
    return x.transpose(0, 1)[None]


def takes_packed(p: Problem, name: str) -> bool:
    """Whether kernel ``name`` of the cell takes packed (N, H, D) tensors: ours on packed documents, which is
    ``flash_attn_varlen_func``'s layout, the one its users' tensors have (a projection's output seen as (N, H, D)).
    Its leaves are made so (:func:`timed`): leaves of shape (1, H, N, D) seen packed would add to every
    backward the autograd's copies of their gradients back through the views, which a user does not have."""
    return p.kind == "documents" and name == "ours"


def ours_fn(p: Problem, device):
    """Our masked attention of the problem, as ``fn(q, k, v) -> (B, H, N, D)``; on packed documents
    (:func:`takes_packed`) ``fn(q, k, v) -> (N, H, D)`` of (N, H, D) inputs."""
    if p.kind == "window":
        return lambda q, k, v: attention(q, k, v, variant="fast", causal=True, window=(p.window - 1, 0))
    if p.kind == "documents":
        cu = mask_blocks.cu_seqlens(p.lengths, device)
        longest = max(p.lengths)
        return lambda q, k, v: attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)
    mask = dense_mask(p, device)
    return lambda q, k, v: scaled_dot_product_attention(q, k, v, attn_mask=mask)


def kernels(p: Problem, device, flex_state=None, flex_mods=None, flex_compiled=None) -> dict:
    """``{name: fn(q, k, v)}`` of the cell: ours, flex (given its compiled function), sdpa (where it fits),
    fast_full."""
    fns = {"ours": ours_fn(p, device)}
    if flex_compiled is not None:
        block_mask = flex_block_mask(p, flex_state, flex_mods, device)
        fns["flex"] = lambda q, k, v: flex_compiled(q, k, v, block_mask=block_mask)
    if p.N <= SDPA_MAX_N or p.kind == "padding":
        mask = dense_mask(p, device)
        fns["sdpa"] = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    fns["fast_full"] = lambda q, k, v: attention(q, k, v, variant="fast", causal=p.causal)  # differentiable
    return fns


def timed(fn, q, k, v, do, training: bool, packed_args: bool = False):
    """A function of no arguments: the forward (no autograd), or forward and backward (the gradients returned), of
    (1, H, N, D) inputs; ``packed_args``: ``fn`` takes and returns packed (N, H, D) tensors, made contiguous here
    (:func:`takes_packed`), and what it returns is seen as (1, H, N, D) again."""
    if packed_args:
        q, k, v, do = (packed(t).contiguous() for t in (q, k, v, do))
    if not training:
        def forward():
            with torch.no_grad():
                out = fn(q, k, v)
            return unpacked(out) if packed_args else out
        return forward
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    if packed_args:
        return lambda: tuple(map(unpacked, torch.autograd.grad(fn(*leaves), leaves, do)))
    return lambda: torch.autograd.grad(fn(*leaves), leaves, do)


def reference_rows(p: Problem, q, k, v, rows: int = 256) -> tuple[int, slice, torch.Tensor]:
    """Float64 output of the last ``rows`` queries of head 0 of the batch with the fewest valid keys."""
    b = min(range(p.B), key=lambda i: p.lengths[i]) if p.kind == "padding" else 0
    rows = min(rows, p.N)
    sl = slice(p.N - rows, p.N)
    if p.kind == "window":  # only these rows of the mask (at N = 64k the whole one is 4 GB)
        mask = mask_blocks.window_mask(rows, p.N, (p.window - 1, 0), causal=True, offset=p.N - rows, device=q.device)
    else:
        mask = dense_mask(p, q.device)
        mask = mask[b, 0, 0][None, :] if p.kind == "padding" else mask[sl]
    s = (q[b, 0, sl].double() @ k[b, 0].double().T) * q.shape[-1] ** -0.5
    return b, sl, torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v[b, 0].double()


def interleaved(fns: dict, rounds: int = ROUNDS) -> dict:
    """Each function's times (ms), timed in rounds that interleave them (the clock drifts under load)."""
    from triton.testing import do_bench

    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"))
    return times


def measure_cell(p: Problem, dtype_name: str, D: int, training: bool, fns: dict, full_ms: dict,
                 rounds: int = ROUNDS) -> dict:
    """One row: each kernel's time, TFLOP/s, ratios, tiles, and errors (ours and flex against float64 on a slice
    of rows; forward+backward: ours' gradients against flex's)."""
    device = runtime.DEVICE
    dtype = getattr(torch, dtype_name)
    q, k, v, do = inputs(p, D, dtype, device, seed=D + p.N)
    row = {"kind": p.kind, "N": p.N, "B": p.B, "H": HEADS, "D": D, "dtype": dtype_name, "training": training,
           "label": p.label, "window": p.window, "documents": len(p.lengths) if p.kind == "documents" else None,
           "errors": {}, "rel_error": {}}
    full_key = (p.N, p.B, p.causal, dtype_name, D, training)
    calls = {name: timed(fn, q, k, v, do, training, takes_packed(p, name)) for name, fn in fns.items()
             if not (name == "fast_full" and full_key in full_ms)}
    b, sl, ref = reference_rows(p, q, k, v)
    outputs, row["first_call_s"] = {}, {}
    for name, call in list(calls.items()):  # compile outside the timing, and check what is timed
        try:
            t0 = time.perf_counter()
            out = call()
            row["first_call_s"][name] = time.perf_counter() - t0  # FlexAttention's: mostly its compile
            outputs[name] = out
            if not training and name in ("ours", "flex"):
                row["rel_error"][name] = rel_error(out[b, 0, sl], ref)
        except Exception as err:  # noqa: BLE001 - a kernel that fails is a result; the others go on
            row["errors"][name] = f"{type(err).__name__}: {str(err)[:300]}"
            del calls[name]
    if training and "ours" in outputs and "flex" in outputs:
        row["grads_vs_flex"] = [rel_error(a, f) for a, f in zip(outputs["ours"], outputs["flex"], strict=True)]
    times = interleaved(calls, rounds)
    ms = {name: statistics.median(t) for name, t in times.items()}
    if "fast_full" in ms:
        full_ms[full_key] = ms["fast_full"]
    ms["fast_full"] = full_ms.get(full_key)
    flop = 4 * D * HEADS * kept_pairs(p) * (TRAINING_FACTOR if training else 1)
    kernel, bm, bn = ours_block(p, q, k, v)
    ours_tiles = computed_tiles(tile_kinds(p, bm, bn, device, per_document=p.kind == "documents"))
    full_pairs = p.B * (p.N * (p.N + 1) // 2 if p.causal else p.N * p.N)
    flex_tiles = computed_tiles(tile_kinds(p, FLEX_BLOCK, FLEX_BLOCK, device))
    computed = {"ours": ours_tiles * bm * bn, "flex": flex_tiles * FLEX_BLOCK ** 2, "sdpa": p.B * p.N * p.N,
                "fast_full": full_pairs}  # the pairs each kernel computes: its tiles, whole
    per_pair = 4 * D * HEADS * (TRAINING_FACTOR if training else 1)
    row.update(ms_rounds=times, ms={n: t for n, t in ms.items() if t is not None},
               tflops={n: flop / (t * 1e-3) / 1e12 for n, t in ms.items() if t is not None},
               tflops_computed={n: per_pair * computed[n] / (t * 1e-3) / 1e12 for n, t in ms.items()
                                if t is not None},
               tiles={"ours": ours_tiles, "ours_block": [bm, bn], "ours_forward": kernel, "flex": flex_tiles,
                      "flex_block": FLEX_BLOCK},
               kept_pairs=kept_pairs(p))
    if "ours" in ms:
        row["vs"] = {n: t / ms["ours"] for n, t in ms.items() if t is not None and n != "ours"}
        if ms["fast_full"]:
            row["time_per_tile_vs_full"] = (ms["ours"] / (ours_tiles * bm * bn)) / (ms["fast_full"] / full_pairs)
    return row


def chosen_groups() -> tuple:
    """``FLASHATTN_MASKS_GROUPS`` ("float16:64,bfloat16:64"): the (dtype, D) groups to measure in this run (default:
    all, in :data:`GROUPS`' order); the others keep their rows from the previous recording."""
    wanted = os.environ.get("FLASHATTN_MASKS_GROUPS", "").strip()
    if not wanted:
        return GROUPS
    groups = tuple((g.split(":")[0], int(g.split(":")[1])) for g in wanted.split(","))
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"FLASHATTN_MASKS_GROUPS: {unknown} not in {GROUPS}")
    return groups


def _carried_rows(measured: set) -> list[dict]:
    """The previous recording's rows of the groups not measured in this run, marked with when they were."""
    previous = recorded.find("masks_vs_flex", gpu=runtime.gpu_name())
    if previous is None:
        return []
    return [{**row, "measured_at": row.get("measured_at", previous["recorded_at"])} for row in previous["rows"]
            if (row["dtype"], row["D"]) not in measured]


@measurement("masks_vs_flex", description="masked attention (windows, documents, padding) vs FlexAttention and SDPA: "
             "fp16/bf16, D 64/128, N 16k/64k, forward and forward+backward")
def masks_vs_flex(groups=None, budget_s: float = BUDGET_S, cells=None) -> dict:
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    # one compiled flex_attention per (kind, N, dtype, D): more than dynamo's default of 8 recompilations
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
    flex = torch.compile(flex_attention, dynamic=False)
    state, mods = flex_mask_mods(runtime.DEVICE)
    t0, rows, skipped, full_ms, measured = time.perf_counter(), [], [], {}, set()
    for dtype_name, D in groups or chosen_groups():
        if time.perf_counter() - t0 > budget_s:
            skipped.append({"dtype": dtype_name, "D": D, "reason": f"past the budget of {budget_s:.0f} s"})
            continue
        measured.add((dtype_name, D))
        for training in (False, True):
            for p in cells or problems():
                row = measure_cell(p, dtype_name, D, training, kernels(p, runtime.DEVICE, state, mods, flex), full_ms)
                rows.append(row)
                print(f"  {dtype_name} D={D} {'fwd+bwd' if training else 'fwd'} {p.label}: "
                      + ", ".join(f"{n} {t:.3f} ms" for n, t in row["ms"].items())
                      + (f"; ×flex {row['vs'].get('flex', 0):.2f}" if "vs" in row else "")
                      + (f"; errors {row['errors']}" if row["errors"] else ""), flush=True)
    carried = _carried_rows(measured)
    skipped = [g for g in skipped if not any((r["dtype"], r["D"]) == (g["dtype"], g["D"]) for r in carried)]
    return {"rows": rows + carried, "skipped": skipped, "heads": HEADS, "rounds": ROUNDS,
            "seconds": time.perf_counter() - t0,
            "flop_convention": "tflops: 4·D FLOP per (query, key) pair the mask keeps, per head; tflops_computed: per "
                               "pair of the tiles each kernel computes; forward+backward 3.5×",
            "notes": "per cell, every kernel timed on the same inputs in interleaved rounds (do_bench medians, each "
                     "kernel's median over the rounds); vs: the kernel's time over ours (> 1: ours faster); flex: "
                     "torch.compile'd flex_attention, its BlockMask built once per cell; sdpa: the dense mask, up to "
                     f"N = {SDPA_MAX_N} (padding: its (B, 1, 1, S) broadcast at any N); fast_full: fast on the whole "
                     "length, causal but for padding, timed in the first cell of its problem; packed documents: ours "
                     "on (N, H, D) tensors, flash_attn_varlen_func's layout (its leaves so), the others on (1, H, N, "
                     "D); sliding windows: each "
                     "query sees its last W keys (window=(W - 1, 0), causal); rows with measured_at come from an "
                     "earlier run of this measurement (FLASHATTN_MASKS_GROUPS chooses the groups a run measures); "
                     "first_call_s: each kernel's first call in the cell (FlexAttention's compile)"}
