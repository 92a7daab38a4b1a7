"""Exercise of notebook 10: how much of the tensor cores' time the exponentials cost."""

from __future__ import annotations

from ._check import ExerciseFailed, call, exercise

# Per SM and clock on Hopper (NVIDIA's throughput tables): 16 MUFU.EX2, and dense fp16 tensor-core
# work of 1024 multiply-adds = 4096 FLOP.
MUFU_PER_CLOCK = 16
MMA_FLOPS_PER_CLOCK = 4096


def exp_share_solution(D: int, mufu_per_clock: float = MUFU_PER_CLOCK,
                       mma_flops_per_clock: float = MMA_FLOPS_PER_CLOCK) -> float:
    """Time for one score's exponential ÷ time for that score's share of the two matrix products."""
    return (1 / mufu_per_clock) / (4 * D / mma_flops_per_clock)


@exercise("exp share")
def check_exp_share(fn) -> str:
    cases = [(64, 16, 4096), (128, 16, 4096), (32, 16, 4096), (64, 32, 4096), (256, 16, 2048)]
    for D, mufu, mma in cases:
        got = call(fn, D, mufu, mma)
        want = exp_share_solution(D, mufu, mma)
        if not isinstance(got, (int, float)):
            raise ExerciseFailed(f"return a number (a ratio), got {type(got).__name__}")
        if abs(got - want) <= 1e-9 * want:
            continue
        if abs(got - 1 / want) <= 1e-9 / want:
            raise ExerciseFailed(f"D={D}: got {got:g}, the inverse of the expected {want:g}: "
                             "exp time goes on top, matrix time below")
        if abs(got - 2 * want) <= 1e-9 * want:
            raise ExerciseFailed(f"D={D}: got {got:g}, twice {want:g}: each score feeds two products "
                             "(S = QKᵀ and O += PV), 2·D FLOP each, so 4·D FLOP per score")
        if abs(got - 4 * want) <= 1e-9 * want:
            raise ExerciseFailed(f"D={D}: got {got:g}, four times {want:g}: count 2 FLOP per multiply-add "
                             "and both products (4·D FLOP per score)")
        raise ExerciseFailed(f"D={D}, {mufu} EX2/clock, {mma} FLOP/clock: got {got:g}, expected {want:g}")
    return (f"at D=64 the exponentials take {exp_share_solution(64):.2f}× the matrix time, "
            f"at D=128 {exp_share_solution(128):.2f}×")
