"""Exercise of notebook 07: blocks per SM from registers, shared memory and warps."""

from __future__ import annotations

from flashattn.models.occupancy import SHARED_UNIT, SMLimits, _round_up, occupancy

from ._check import ExerciseFailed, call, exercise

OCCUPANCY_CASES = [  # (registers_per_thread, shared_bytes, num_warps): example kernels, bound by registers,
    # shared memory or warps, several near a rounding boundary
    (255, 41216, 4), (128, 100000, 4), (24, 0, 8), (73, 0, 4), (64, 58000, 4), (143, 0, 8), (168, 81920, 4),
]


@exercise("blocks per SM")
def check_blocks_per_sm(fn) -> str:
    """``fn(registers_per_thread, shared_bytes, num_warps) -> blocks per SM`` on an H100/H200-like SM."""

    limits = SMLimits()
    for regs, shared, warps in OCCUPANCY_CASES:
        want = occupancy(registers_per_thread=regs, shared_bytes=shared, num_warps=warps, limits=limits)
        got = call(fn, regs, shared, warps)
        if got == want["blocks_per_sm"]:
            continue
        where = f"registers_per_thread={regs}, shared_bytes={shared}, num_warps={warps}"
        no_rounding = min(limits.registers // (regs * 32 * warps), want["limits"]["shared_memory"],
                          want["limits"]["warps"], limits.max_blocks)
        no_reserve = min(want["limits"]["registers"], want["limits"]["warps"], limits.max_blocks,
                         limits.shared_bytes // max(1, _round_up(shared, SHARED_UNIT)) if shared else limits.max_blocks)
        hint = ""
        if got == no_rounding:
            hint = " — registers are allocated per warp in units of 256: round regs·32 up before dividing"
        elif got == no_reserve:
            hint = " — each block also costs the 1 KiB the driver reserves (after rounding to 128 bytes)"
        elif got == min(want["limits"]["registers"], want["limits"]["shared_memory"], limits.max_blocks):
            hint = " — the SM also has at most 64 warps: num_warps limits the blocks too"
        raise ExerciseFailed(f"{where}: got {got} blocks per SM, expected {want['blocks_per_sm']} "
                             f"(limited by {', '.join(want['limited_by'])}){hint}")
    return f"{len(OCCUPANCY_CASES)} kernels, limited by registers, shared memory or warps, agree with the calculator"

