"""GPU probe (issue 30): masked attention's dQ kernel on a second stream beside the dK/dV kernel
(``masked_backward.CONCURRENT_DQ``), against the two one after the other, on the H200.

    python tools/gpu/masks/concurrent_dq.py    # summary on stdout; details in $OUT/concurrent_dq.json

For some cells of ``masks_vs_flex`` (documents, windows, padding; fp16 and bf16), forward+backward: ours with the
kernels in turn, ours with dQ beside dK/dV, and FlexAttention (torch.compile'd, BlockMask built once), timed in
interleaved rounds as the measurement times them; the gradients of both of ours compared (the same kernels: they
must be equal).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT") or "probe_out"
T0 = time.time()


def log(*args):
    print(f"[{time.time() - T0:6.1f}s]", *args, flush=True)


def cells():
    from flashattn.measure.measurements.masks import Problem, document_lengths, padding_lengths

    return [(Problem("documents", 16384, lengths=document_lengths(16384)), 128),
            (Problem("documents", 65536, lengths=document_lengths(65536)), 128),
            (Problem("documents", 16384, lengths=document_lengths(16384)), 64),
            (Problem("window", 16384, window=256), 128),
            (Problem("window", 16384, window=1024), 64),
            (Problem("padding", 16384, B=4, lengths=padding_lengths(4, 16384)), 128)]


def patched(fn, module, name: str, value):
    """``fn`` that runs with ``module.name`` set to ``value`` (put back after each call)."""
    def call():
        before = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn()
        finally:
            setattr(module, name, before)
    return call


def with_flag(fn, on: bool):
    from flashattn.kernels import masked_backward

    return patched(fn, masked_backward, "CONCURRENT_DQ", on)


def compare(cells, variants: dict, json_name: str) -> list:
    """Per cell (a ``masks.Problem`` and D) and dtype, forward+backward: ours through each of ``variants`` (name -> a
    wrapper of the timed step; the first is the reference), and FlexAttention, timed in interleaved rounds as
    ``masks_vs_flex`` times them; each variant's gradients compared with the first's (the same kernels: equal).
    Rows written to $OUT/``json_name`` as they come (``window_backward.py`` runs the same loop)."""
    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    from flashattn import runtime
    from flashattn.measure.measurements import masks
    from flashattn.reference import rel_error

    os.makedirs(OUT, exist_ok=True)
    torch._dynamo.config.cache_size_limit = 256
    flex = torch.compile(flex_attention, dynamic=False)
    state, mods = masks.flex_mask_mods(runtime.DEVICE)
    names, rows = list(variants), []
    for p, D in cells:
        for dtype_name in ("float16", "bfloat16"):
            q, k, v, do = masks.inputs(p, D, getattr(torch, dtype_name), runtime.DEVICE, seed=D + p.N)
            fns = masks.kernels(p, runtime.DEVICE, state, mods, flex)
            step = masks.timed(fns["ours"], q, k, v, do, training=True, packed_args=masks.takes_packed(p, "ours"))
            calls = {name: wrap(step) for name, wrap in variants.items()}
            calls["flex"] = masks.timed(fns["flex"], q, k, v, do, training=True)
            grads = {name: calls[name]() for name in names}
            differ = {name: max(rel_error(a, b) for a, b in zip(grads[names[0]], grads[name], strict=True))
                      for name in names[1:]}
            times = masks.interleaved(calls)
            ms = {name: statistics.median(t) for name, t in times.items()}
            row = {"cell": p.label, "D": D, "dtype": dtype_name, "ms": ms, "ms_rounds": times,
                   f"grads_vs_{names[0]}": differ, "vs_flex": {name: ms["flex"] / ms[name] for name in names}}
            rows.append(row)
            log(f"{p.label} D={D} {dtype_name}: " + ", ".join(f"{n} {ms[n]:.3f} ms" for n in calls)
                + "; ×flex " + " -> ".join(f"{row['vs_flex'][n]:.2f}" for n in names)
                + "; grads differ by " + ", ".join(f"{d:.1e}" for d in differ.values()))
            with open(os.path.join(OUT, json_name), "w") as f:
                json.dump(rows, f, indent=1)
    return rows


def main():
    rows = compare(cells(), {"in turn": lambda step: with_flag(step, False),
                             "beside": lambda step: with_flag(step, True)}, "concurrent_dq.json")
    gains = [r["ms"]["in turn"] / r["ms"]["beside"] for r in rows]
    log(f"beside / in turn: geomean speed-up {statistics.geometric_mean(gains):.3f}, "
        f"min {min(gains):.3f}, max {max(gains):.3f}; total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()
