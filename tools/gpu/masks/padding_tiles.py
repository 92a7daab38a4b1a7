"""GPU probe (issue 30): the padding cells of ``masks_vs_flex``, where the key-padding Gluon forward
(``masked.GLUON_KEY_MASK``) lost to the dense mask's Triton kernel at D = 64 on its first run, on the H200 (it
read every key block's mask bytes; reading only the partial blocks' won at both D on 2026-12-04, and is the default).

    python tools/gpu/masks/padding_tiles.py    # about 3 minutes; summary on stdout, $OUT/padding_tiles.json
    PADDING_TILES_TRAINING=1 python ...         # and part 2 (2.5 minutes more)

1. the forward, D = 64 and 128: the Gluon kernel with each schedule and tile of ``CONFIGS``, reading every key
   block's mask bytes (``masked.GLUON_KEY_MASK_BLOCKS`` off: "bytes") or only the partial blocks' (on: "flags"),
   its output against the dense kernel's; the dense kernel (default tiles, and three others) and FlexAttention,
   in interleaved rounds;
2. forward + backward at D = 64: ``backward_tiles.one_cell`` on the same problem (the dense mask's backward with each
   dK/dV and dQ tile pair, the drop-in's own step and FlexAttention, and their kernels' times).
"""

from __future__ import annotations

import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backward_tiles  # noqa: E402  (beside this script)
import probe  # noqa: E402
from concurrent_dq import patched  # noqa: E402

CONFIGS = {
    "single (64, 128)": dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="single"),
    "single (64, 64)": dict(block_m=64, block_n=64, num_warps=4, num_stages=2, schedule="single"),
    "specialized 2": dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="specialized", consumers=2),
    "specialized 3": dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="specialized", consumers=3),
    "persistent 2": dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="persistent", consumers=2),
    "persistent 3": dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="persistent", consumers=3),
}


def forward_cell(p, D, dtype_name, flex) -> dict:
    from flashattn import runtime
    from flashattn.kernels import masked
    from flashattn.measure.measurements import masks
    from flashattn.reference import rel_error

    compiled, state, mods = flex
    q, k, v, do = probe.make(p, D, dtype_name)
    fns = masks.kernels(p, runtime.DEVICE, state, mods, compiled)
    ours = masks.timed(fns["ours"], q, k, v, do, training=False)
    calls = {"flex": masks.timed(fns["flex"], q, k, v, do, training=False),
             "dense": patched(ours, masked, "GLUON_KEY_MASK_DIMS", ())}
    for tiles in masked.MASK_FORWARD_TILES[D][1:4]:  # the dense kernel's other tiles (explicit tiles: Triton)
        calls[f"dense {tiles}"] = functools.partial(probe.ours, p, q, k, v, do, tiles)
    for name, config in CONFIGS.items():
        for how, blocks in (("bytes", False), ("flags", True)):
            on = patched(ours, masked, "GLUON_KEY_MASK_DIMS", (64, 128))
            on = patched(on, masked, "GLUON_KEY_MASK_BLOCKS", blocks)
            calls[f"{name} {how}"] = patched(on, masked, "GLUON_KEY_MASK", {**masked.GLUON_KEY_MASK, D: config})
    errors = {}
    dense = calls["dense"]()
    for name in [n for n in calls if n.endswith(("bytes", "flags"))]:
        try:
            errors[name] = rel_error(calls[name](), dense)
        except Exception as err:  # noqa: BLE001
            backward_tiles.log(f"  {name}: {type(err).__name__}: {str(err)[:200]}")
            del calls[name]
    ms = probe.rounds(calls)
    row = {"cell": p.label, "D": D, "dtype": dtype_name, "ms": ms, "rel_error_vs_dense": errors,
           "vs_flex": {name: ms["flex"] / t for name, t in ms.items() if name != "flex"}}
    backward_tiles.log(f"{p.label} D={D} {dtype_name} forward: " +
                       "; ".join(f"{n} {t:.3f} ms (x flex {row['vs_flex'].get(n, 1):.3f})" for n, t in ms.items()))
    return row


def main():
    from flashattn.measure.measurements.masks import Problem, padding_lengths

    os.makedirs(probe.OUT, exist_ok=True)
    flex = probe.flex_setup()
    p = Problem("padding", 16384, B=4, lengths=padding_lengths(4, 16384))
    rows = {"forward": [], "training": []}
    save = functools.partial(json.dump, rows)
    for D in (64, 128):
        for dtype_name in ("float16", "bfloat16"):
            rows["forward"].append(forward_cell(p, D, dtype_name, flex))
            with open(os.path.join(probe.OUT, "padding_tiles.json"), "w") as f:
                save(f, indent=1)
    for dtype_name in ("float16", "bfloat16") if os.environ.get("PADDING_TILES_TRAINING") else ():
        rows["training"].append(backward_tiles.one_cell(p, 64, dtype_name, flex))
        with open(os.path.join(probe.OUT, "padding_tiles.json"), "w") as f:
            save(f, indent=1)


if __name__ == "__main__":
    main()
