"""Exercise of notebook 08: the block sizes of FlashAttention-1's rule of thumb."""

from __future__ import annotations

import math

from flashattn.models.tuning import fa1_block_sizes

from ._check import ExerciseFailed, call, exercise


@exercise("FA1 block sizes")
def check_fa1_block_sizes(fn) -> str:
    """``fn(sram_bytes, D, elem_bytes) -> (Bc, Br)``, the raw (not rounded) values of the paper's rule."""
    cases = [(48 * 1024, 64, 4), (48 * 1024, 32, 4), (232448, 64, 2), (232448, 128, 2), (100_000, 48, 2),
             (1000, 64, 4)]
    for sram, D, eb in cases:
        want = fa1_block_sizes(sram, D, eb)
        got = call(fn, sram, D, eb)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise ExerciseFailed(f"return a tuple (Bc, Br), got {got!r}")
        bc, br = got
        where = f"for sram_bytes={sram}, D={D}, elem_bytes={eb}"
        if bc == math.ceil(sram / (4 * D)):
            raise ExerciseFailed(f"Bc={bc} {where}: M counts elements, not bytes (divide by elem_bytes)")
        if bc == (sram // eb) // (4 * D) and bc != want["bc"]:
            raise ExerciseFailed(f"Bc={bc} {where}: the paper rounds M / (4d) up (math.ceil), not down")
        if bc != want["bc"]:
            raise ExerciseFailed(f"Bc={bc} {where}, expected {want['bc']} (= ceil(M / (4·D)), M in elements)")
        if br != want["br"]:
            raise ExerciseFailed(f"Br={br} {where}, expected {want['br']} (= min(Bc, D))")
    return f"{len(cases)} cases agree with the paper's rule"
