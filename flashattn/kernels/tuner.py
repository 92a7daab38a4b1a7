"""The tuner of ``fast``, forward and backward: the candidates timed in interleaved rounds, the pick remembered.

The first call for a problem runs each candidate once (compiling it; one that cannot run on this GPU is
dropped, as ``triton.autotune`` drops it), then times them in rounds that interleave the candidates, in an
order that reverses from round to round (a, b, c, c, b, a, ...), each keeping its median. Under load an H200
runs at its power limit and its clock drifts by a quarter within seconds, so candidates timed one after
another (as ``triton.autotune`` does) meet different clocks and a fresh process can pick a loser; over an even
number of rounds a steady drift costs every candidate the same. Later calls launch the pick directly.

The candidates are the tuning spaces of ``fast_options.py``, already pruned to what fits the live GPU.
"""

from __future__ import annotations

import functools
import statistics

import triton

from .triton_compat import RESOURCE_ERRORS

TUNE_ROUNDS = 6
TUNE_WARMUP_MS = 5
TUNE_REP_MS = 20

# key -> (the pick, each candidate's median time in ms); a key names the kernel and the problem
_picks: dict[tuple, tuple[object, dict]] = {}


def pick(key: tuple, candidates, run):
    """The fastest of ``candidates`` (a list, or a function that returns one: called only to tune) for ``key``
    (tuned on the first call, remembered after). ``run(candidate)`` launches the kernel with one candidate (it
    must leave the outputs right whichever candidate runs last)."""
    if key not in _picks:
        _picks[key] = tune(candidates() if callable(candidates) else candidates, run)
    return _picks[key][0]


def tune(candidates: list, run) -> tuple[object, dict]:
    """Run each candidate once (compiling it; one that cannot run on this GPU is dropped), then time them in
    TUNE_ROUNDS interleaved rounds of alternating order; the pick has the lowest median."""
    runs, errors = {}, []
    for candidate in candidates:
        try:
            run(candidate)
            runs[candidate] = functools.partial(run, candidate)
        except RESOURCE_ERRORS as err:  # as triton.autotune does
            errors.append(err)
    if not runs:
        raise errors[0]
    times = {candidate: [] for candidate in runs}
    order = list(runs)
    for _ in range(TUNE_ROUNDS if len(runs) > 1 else 0):
        for candidate in order:
            times[candidate].append(triton.testing.do_bench(runs[candidate], warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS,
                                                            return_mode="median"))
        order.reverse()
    medians = {candidate: statistics.median(t) for candidate, t in times.items() if t}
    return min(runs, key=lambda candidate: medians.get(candidate, 0.0)), medians


def picks(kind: str) -> dict[tuple, tuple[object, dict]]:
    """The picks made in this process for keys whose first element is ``kind`` ("forward", "dkdv", "dq")."""
    return {key: value for key, value in _picks.items() if key[0] == kind}


def tuning_times(key: tuple) -> dict | None:
    """Each candidate's median time (ms) when ``key`` was tuned in this process, or None."""
    return _picks[key][1] if key in _picks else None
