"""GPU probe (issue 30): packed documents on the Gluon kernels (``fast_gluon.py``'s and ``fast_backward_gluon.py``'s
DOCS), at the documents cells of ``masks_vs_flex``, on the H200. Its one run (stop 53) stopped at the backward's
"illegal instruction" (``gluon_documents_bisect.py`` found why); it has not run since the fix.

    python tools/gpu/masks/gluon_documents.py    # about 4 minutes; summary on stdout, $OUT/gluon_documents.json

For each cell (documents of random lengths filling N = 16k and 64k, 16 heads), D = 64 and 128, fp16 and bf16:
the Gluon forward with each schedule of ``CONFIGS``, its output against the Triton kernel's (relative error) and
its log-sum-exp too, and the Gluon backward's gradients (``fast_backward_gluon.py``'s DOCS,
``masked.GLUON_DOCUMENTS_BACKWARD_DIMS``) against the Triton kernels'; then, in interleaved rounds, the forward, and
forward + backward (the drop-in's step, as ``masks_vs_flex`` times it: ``attention_varlen`` on packed leaves),
with the Triton forward and with each Gluon schedule, each with the Triton backward, and the Gluon backward after
the Triton forward and after the default Gluon one, beside FlexAttention.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backward_tiles  # noqa: E402  (beside this script)
import probe  # noqa: E402
from concurrent_dq import patched  # noqa: E402

CONFIGS = {
    "specialized 2": dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="specialized", consumers=2),
    "persistent 2": dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="persistent", consumers=2),
    "specialized 3": dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="specialized", consumers=3),
}


def with_gluon(fn, D: int, config: dict | None, backward: bool = False):
    """``fn`` with the documents' forward on the Gluon kernel in ``config`` (None: on the Triton kernel), and their
    backward on the Gluon backward kernel (``backward``) or the Triton ones."""
    from flashattn.kernels import masked

    fn = patched(fn, masked, "GLUON_DOCUMENTS_BACKWARD_DIMS", (D,) if backward else ())
    if config is None:
        return patched(fn, masked, "GLUON_DOCUMENTS_DIMS", ())
    on = patched(fn, masked, "GLUON_DOCUMENTS_DIMS", (D,))
    return patched(on, masked, "GLUON_DOCUMENTS", {**masked.GLUON_DOCUMENTS, D: config})


def one_cell(p, D, dtype_name, flex) -> dict:
    from flashattn import masking, runtime
    from flashattn.measure.measurements import masks
    from flashattn.reference import rel_error

    compiled, state, mods = flex
    q, k, v, do = probe.make(p, D, dtype_name)
    configs = {name: c for name, c in CONFIGS.items() if c.get("consumers") != 3 or D == 64}
    cu, longest = probe._cu_seqlens(p.lengths, q.device), max(p.lengths)
    args = [masks.packed(t).contiguous() for t in (q, k, v)]
    kw = dict(causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
    o_t, lse_t = with_gluon(lambda: masking.masked_forward(*args, **kw), D, None)()
    do_p = masks.packed(do).contiguous()
    grads_t = with_gluon(lambda: masking.masked_backward(*args, o_t, lse_t, do_p, **kw), D, None)()
    try:  # the Gluon backward's gradients against the Triton kernels' (from the same forward)
        grads_g = with_gluon(lambda: masking.masked_backward(*args, o_t, lse_t, do_p, **kw), D, None, True)()
        grad_errors = [rel_error(g, t) for g, t in zip(grads_g, grads_t, strict=True)]
    except Exception as err:  # noqa: BLE001
        grad_errors = f"{type(err).__name__}: {str(err)[:300]}"
    row = {"cell": p.label, "D": D, "dtype": dtype_name, "rel_error_vs_triton": {}, "lse_vs_triton": {}, "ms": {},
           "forward_kernel": with_gluon(lambda: masks.ours_block(p, q, k, v), D, CONFIGS["specialized 2"])(),
           "grads_gluon_bwd_vs_triton": grad_errors}
    fns = masks.kernels(p, runtime.DEVICE, state, mods, compiled)
    for training in (False, True):
        step = "fwd+bwd" if training else "fwd"
        ours = masks.timed(fns["ours"], q, k, v, do, training=training, packed_args=True)
        calls = {f"flex {step}": masks.timed(fns["flex"], q, k, v, do, training=training),
                 f"triton {step}": with_gluon(ours, D, None)}
        if training:  # the Gluon backward, after the Triton forward and after the default Gluon one
            calls[f"triton+gluon-bwd {step}"] = with_gluon(ours, D, None, backward=True)
            calls[f"specialized 2+gluon-bwd {step}"] = with_gluon(ours, D, CONFIGS["specialized 2"], backward=True)
        for name, config in configs.items():
            calls[f"{name} {step}"] = with_gluon(ours, D, config)
            if training:
                continue
            try:
                o, lse = with_gluon(lambda: masking.masked_forward(*args, **kw), D, config)()
                row["rel_error_vs_triton"][name] = rel_error(o, o_t)
                row["lse_vs_triton"][name] = (lse - lse_t).abs().max().item()
            except Exception as err:  # noqa: BLE001 - a schedule that fails is a finding; the others go on
                backward_tiles.log(f"  {name}: {type(err).__name__}: {str(err)[:300]}")
                del calls[f"{name} {step}"]
        calls = probe.first_calls(calls, f"{p.label} D={D} {dtype_name} {step}")
        row["ms"].update(probe.rounds(calls))
    row["vs_flex"] = {name: row["ms"][f"flex {name.split()[-1]}"] / t for name, t in row["ms"].items()
                      if f"flex {name.split()[-1]}" in row["ms"]}  # (FlexAttention's backward: not on a CPU)
    backward_tiles.log(f"{p.label} D={D} {dtype_name}: forward {row['forward_kernel']}, errors "
                       f"{row['rel_error_vs_triton']}, lse {row['lse_vs_triton']}, Gluon backward's gradients "
                       f"{grad_errors}; " +
                       "; ".join(f"{n} {t:.3f} ms (x flex {row['vs_flex'].get(n, float('nan')):.3f})"
                                 for n, t in row["ms"].items()))
    return row


def main():
    from flashattn.measure.measurements.masks import Problem, document_lengths, problems

    os.makedirs(probe.OUT, exist_ok=True)
    flex = probe.flex_setup()
    rows = []
    cells = ([Problem("documents", 256, lengths=document_lengths(256, bounds=(1, 100)))] if probe.DRY
             else [p for p in problems() if p.kind == "documents"])  # PROBE_DRY=1: the script's logic, on a CPU
    for p in cells:
        for D in (128, 64):
            for dtype_name in ("float16",) if probe.DRY else ("float16", "bfloat16"):
                rows.append(one_cell(p, D, dtype_name, flex))
                with open(os.path.join(probe.OUT, "gluon_documents.json"), "w") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
