"""GPU probe (issue 30): a sliding window's forward+backward with its backward bound once per problem
(``masking._window_backward``) against the ordinary backward path and FlexAttention, on the H200.

    python tools/gpu/masks/window_backward.py    # about two minutes; summary on stdout, $OUT/window_backward.json

The short windows' forward+backward cells of ``masks_vs_flex`` (a window of 256 keys at N = 16k, D = 64 and 128;
1k keys at D = 64), fp16 and bf16: ours bound, ours through ``_backward`` (the binding switched off), and
FlexAttention, in ``concurrent_dq.py``'s loop (interleaved rounds, the two of ours' gradients compared: the same
kernels, they must be equal).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from concurrent_dq import compare, patched  # noqa: E402  (tools/gpu/masks/concurrent_dq.py, beside this script)


def unbound(step):
    from flashattn import masking

    return patched(step, masking, "_window_backward", lambda *a, **kw: None)


def main():
    from flashattn.measure.measurements.masks import Problem

    cells = [(Problem("window", 16384, window=window), D) for window, D in ((256, 64), (256, 128), (1024, 64))]
    compare(cells, {"bound": lambda step: step, "ordinary": unbound}, "window_backward.json")


if __name__ == "__main__":
    main()
