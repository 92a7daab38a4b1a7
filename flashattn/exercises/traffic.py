"""Exercises of notebook 09: what the L2 counters of Nsight Compute say about the traffic model."""

from __future__ import annotations

import math

from flashattn.models.traffic import l2_served_fraction

from ._check import ExerciseFailed, call, exercise

_L2_CASES = (  # (read sectors, write sectors, dram read, dram write, lts__t_bytes): all different
    (1_000_003, 20_011, 12_345_678.0, 640_000.0, 70_000_000.0),
    (37, 5, 0.0, 0.0, 4_096.0),
    (268_435_456, 2_097_152, 7.3e9, 6.5e7, 1.9e10),
)


def _l2_models(rs, ws, dr, dw, lb):
    right = (rs * 32, ws * 32)
    return right, {
        "you returned sectors: a sector is 32 bytes, multiply by 32": (rs, ws),
        "you multiplied by 128: 128 bytes is a cache line, the sector counters count 32-byte sectors":
            (rs * 128, ws * 128),
        "you returned DRAM bytes: dram__bytes_* is what missed in L2, the question is what the SMs asked of L2":
            (dr, dw),
        "read and write are swapped": (ws * 32, rs * 32),
        "lts__t_bytes.sum counts every L2 lookup from any unit: use the srcunit_tex sector counters":
            (lb, lb),
    }


@exercise("L2 request bytes")
def check_l2_request_bytes(fn):
    """``fn(metrics)`` → ``{"read": bytes, "write": bytes}`` the SMs asked of L2, from ncu metrics."""
    for rs, ws, dr, dw, lb in _L2_CASES:
        metrics = {"lts__t_sectors_srcunit_tex_op_read.sum": float(rs),
                   "lts__t_sectors_srcunit_tex_op_write.sum": float(ws),
                   "dram__bytes_read.sum": dr, "dram__bytes_write.sum": dw, "lts__t_bytes.sum": lb}
        got = call(fn, dict(metrics))
        if not isinstance(got, dict) or set(got) != {"read", "write"}:
            raise ExerciseFailed(f"return a dict with the keys 'read' and 'write', got {got!r}")
        pair = (float(got["read"]), float(got["write"]))
        right, mistakes = _l2_models(rs, ws, dr, dw, lb)
        if pair != right:
            for text, model in mistakes.items():
                if pair == tuple(float(m) for m in model):
                    raise ExerciseFailed(text)
            raise ExerciseFailed(f"for {metrics} you returned {pair}, expected {right}")
    return "L2 requests = sectors × 32 bytes (reads and writes separately)"


_REUSE_CASES = (  # (dram_read, model_read, compulsory_read): made-up round numbers, not measurements
    (250e6, 8e9, 200e6),
    (14e9, 18e9, 300e6),
    (1.6e6, 9e6, 1.5e6),
)


@exercise("L2 reuse")
def check_l2_served_fraction(fn):
    """``fn(dram_read, model_read, compulsory_read)`` → the fraction of repeated reads that L2 served."""
    for dram, model, comp in _REUSE_CASES:
        got = call(fn, dram, model, comp)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise ExerciseFailed(f"return one number (a fraction between 0 and 1), got {got!r}")
        right = l2_served_fraction(dram, model, comp)
        mistakes = {
            "you returned DRAM ÷ model: that is the fraction that *missed* (counting compulsory reads too); "
            "the question asks what L2 served": dram / model,
            "you returned 1 − DRAM ÷ model: the compulsory reads can never be served by L2 (first touch); "
            "subtract them from both DRAM and the model": 1 - dram / model,
            "you subtracted the compulsory bytes from DRAM only, not from the model's requests":
                1 - (dram - comp) / model,
            "you returned a percentage: give a fraction (0.93, not 93)": 100 * right,
        }
        if not math.isclose(got, right, rel_tol=1e-9):
            for text, value in mistakes.items():
                if math.isclose(got, value, rel_tol=1e-9):
                    raise ExerciseFailed(text)
            raise ExerciseFailed(f"for dram_read={dram:g}, model_read={model:g}, compulsory_read={comp:g} "
                                 f"you returned {got:.6g}, expected {right:.6g}")
    return "served = 1 − (DRAM − compulsory) ÷ (requests − compulsory)"
