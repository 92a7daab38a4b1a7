"""Exercise of notebook 11: the producer warp of ``fast``'s Gluon kernel, written as a program of operations.

The learner's ``producer(blocks_per_tile, STAGES, CONSUMERS)`` returns the list of operations
(``Wait``, ``Load``) that ``fast_gluon._producer`` performs. The check runs it with the kernel's consumers in
the schedule model (``flashattn.models.schedule``), on rings of one to three slots, one to three consumers and
tiles whose block counts are not multiples of the ring, and reports the first thing that goes wrong (a
deadlock, a tile read before it landed, a slot refilled while still in use), with the first operation in which
the learner's program differs from the kernel's.
"""

from __future__ import annotations

from flashattn.models.schedule import Load, Wait, costs_for, producer_ops, simulate, specialized_program

from ._check import ExerciseFailed, call, exercise

__all__ = ["Load", "Wait", "check_producer", "producer_solution", "CASES"]

# (consumers, ring slots, key blocks of each tile): one consumer; two sharing a ring; three slots; a first tile
# whose block count is not a multiple of the slots (the ring position runs on across tiles); three consumers;
# a one-slot ring; tiles of one block.
CASES = [(1, 2, [5]), (2, 2, [5]), (2, 3, [7]), (2, 2, [3, 5]), (3, 2, [4, 4, 3]), (2, 1, [3, 2]), (2, 2, [1, 1, 2])]
COSTS = costs_for(64, 64, 128)

producer_solution = producer_ops  # the kernel's producer, as the schedule model writes it

PHASE_ADVICE = ("a slot's barriers complete one phase per lap of the ring (every STAGES blocks), so the phase "
                "of block cnt is lap = (cnt // STAGES) & 1; the producer waits for the consumers' release of the "
                "lap before, lap ^ 1 (a fresh barrier passes a wait on parity 1: the first lap does not wait)")
SLOT_ADVICE = ("the ring position is cnt, the number of K/V blocks loaded since the program started, over all "
               "tiles: slot = cnt % STAGES (j restarts at 0 with every tile)")


def _first_difference(got: list, want: list) -> str:
    """Where the learner's program first differs from the kernel's, and what that usually means."""
    for k, (g, w) in enumerate(zip(got, want, strict=False)):
        if g == w:
            continue
        head = f"operation {k} is '{g}', the kernel's is '{w}'"
        if isinstance(g, Wait) and isinstance(w, Wait) and (g.barrier, g.index) == (w.barrier, w.index):
            return f"{head}: the phase. {PHASE_ADVICE}"
        if isinstance(g, Wait) and isinstance(w, Wait) and g.barrier == w.barrier:
            return f"{head}: the slot. {SLOT_ADVICE}"
        if isinstance(g, Load) and isinstance(w, Wait):
            return (f"{head}: a copy without waiting first. Before refilling a slot, wait on its empty barrier "
                    f"({w.barrier}): its last tile may still be in use")
        if isinstance(g, Load) and isinstance(w, Load) and g.slot != w.slot:
            return f"{head}: the slot. {SLOT_ADVICE}"
        if isinstance(g, Load) and isinstance(w, Load):
            return f"{head}: block j of tile `it` goes to the ring (j counts the key blocks of this tile)"
        return head
    if len(got) < len(want):
        return (f"your producer stops after {len(got)} operations, the kernel's issues {len(want)}: K and V of every "
                "key block of every tile, each after its wait")
    return f"your producer issues {len(got) - len(want)} operations more than the kernel's {len(want)}"


def _check_ops(ops, case) -> list:
    if not isinstance(ops, (list, tuple)):
        raise ExerciseFailed(f"return a list of operations (Wait, Load), got {type(ops).__name__}")
    for op in ops:
        if not isinstance(op, Wait | Load):
            raise ExerciseFailed(f"{case}: every operation must be a Wait or a Load, got {op!r}")
    return list(ops)


@exercise("producer")
def check_producer(fn) -> str:
    for consumers, stages, tiles in CASES:
        case = f"{consumers} consumer(s), STAGES={stages}, key blocks per tile {tiles}"
        ops = _check_ops(call(fn, list(tiles), stages, consumers), case)
        result = simulate(specialized_program(tiles, stages, consumers, producer=lambda *_, ops=ops: ops), COSTS)
        if result.error:
            hint = _first_difference(ops, producer_ops(list(tiles), stages, consumers))
            raise ExerciseFailed(f"{case}: {result.error}.\nWhere your program departs from the kernel's: {hint}")
    return (f"the ring protocol holds in {len(CASES)} set-ups (1-3 consumers, 1-3 slots, several tiles): no "
            "deadlock, no tile read before it landed, no slot refilled while in use")
