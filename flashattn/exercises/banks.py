"""Checks for notebooks 06 and 06b (shared-memory bank conflicts).

``check_wavefront_predictions`` (notebook 06) takes the learner's hand-made predictions for a fixed set of
warp requests (:data:`PREDICTION_CASES`); ``check_padding`` (notebook 06b) takes a function that proposes
a row padding.
Wrong answers are compared with the classic mistakes (no broadcast, no phases for wide accesses,
lanes counted instead of distinct words, the conflict degree given instead of wavefronts) and named.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from dataclasses import dataclass

from flashattn.models import banks

from ._check import ExerciseFailed, _NotAttempted, call, exercise

# --- notebook 06, exercise 1: predict the wavefronts -------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    text: str  # the request in words, as the notebook shows it
    access_bytes: int
    addresses: tuple[int, ...]


def _case(name, text, access_bytes, fn):
    return Case(name, text, access_bytes, tuple(fn(i) for i in range(banks.WARP_SIZE)))


PREDICTION_CASES = (
    _case("a", "4-byte loads, lane i reads byte address 4·i (32 consecutive floats)", 4, lambda i: 4 * i),
    _case("b", "4-byte loads, every lane reads byte address 256 (the same float)", 4, lambda i: 256),
    _case("c", "4-byte loads, lane i reads byte address 8·i (every other float)", 4, lambda i: 8 * i),
    _case("d", "4-byte loads, lane i reads byte address 128·i (column 0 of a row-major 32×32 float32 tile)",
          4, lambda i: 128 * i),
    _case("e", "4-byte loads, lane i reads byte address 128·(i mod 16) (lanes i and i+16 read the same float)",
          4, lambda i: 128 * (i % 16)),
    _case("f", "4-byte loads, lane i reads byte address 132·i (the same column with rows padded by one word)",
          4, lambda i: 132 * i),
    _case("g", "8-byte loads, lane i reads byte address 8·i", 8, lambda i: 8 * i),
    _case("h", "8-byte loads, lane i reads byte address 8·(i mod 16) (lanes i and i+16 read the same 8 bytes)",
          8, lambda i: 8 * (i % 16)),
    _case("i", "16-byte loads, every lane reads byte address 0", 16, lambda i: 0),
    _case("j", "16-byte loads, lane i reads byte address 128·i (16 bytes of each row of a 32-float-wide tile)",
          16, lambda i: 128 * i),
)


def _model_no_broadcast(case: Case) -> int:
    """Phases respected, but every lane's words counted, even when lanes read the same word."""
    words, per_phase = case.access_bytes // 4, banks.lanes_per_phase(case.access_bytes)
    total = 0
    for start in range(0, banks.WARP_SIZE, per_phase):
        hits = Counter((case.addresses[i] // 4 + w) % 32 for i in range(start, start + per_phase) for w in range(words))
        total += max(hits.values())
    return total


def _model_no_phases(case: Case) -> int:
    """Broadcast respected, but all 32 lanes served as one group whatever the access width."""
    words = case.access_bytes // 4
    distinct = {a // 4 + w for a in case.addresses for w in range(words)}
    return max(Counter(w % 32 for w in distinct).values())


def _model_ways(case: Case) -> float:
    return banks.conflict_ways(case.addresses, case.access_bytes)


def _same_address(case: Case) -> bool:
    return len(set(case.addresses)) == 1


_MISTAKES = (
    (_model_no_broadcast, lambda c: _same_address(c),
     "you forgot the broadcast: when lanes of one phase read the same 4-byte word, one wavefront serves them all"),
    (_model_no_broadcast, lambda c: not _same_address(c),
     "you counted lanes instead of distinct words: lanes {dup} read the same word, which they share "
     "(broadcast); count the distinct words in the busiest bank, phase by phase"),
    (_model_no_phases, lambda c: c.access_bytes > 4,
     "you forgot the phases: a warp's {width}-byte request is served in {ideal} phases of {lanes} lanes "
     "(a phase moves at most 128 bytes), and every phase with an active lane costs at least one wavefront"),
    (_model_ways, lambda c: True,
     "you gave the conflict degree (wavefronts ÷ the ideal {ideal}); the question asks for wavefronts, "
     "and {a_width}-byte request takes at least {ideal} (one per phase of {lanes} lanes)"),
)


def _duplicate_lanes(case: Case) -> str:
    first = {}
    for lane, a in enumerate(case.addresses):
        if a in first:
            return f"{first[a]} and {lane}"
        first[a] = lane
    return "several"


def _answer_value(value, name):
    if value is None or value is Ellipsis:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ExerciseFailed(f"case {name}: answer with a number of wavefronts, got {type(value).__name__} {value!r}")
    return value


def prediction_answers() -> dict:
    """The right answers (used by the tests and the worked solution's check)."""
    return {c.name: banks.wavefronts(c.addresses, c.access_bytes) for c in PREDICTION_CASES}


@exercise("wavefront predictions")
def check_wavefront_predictions(answers):
    """``answers``: a dict from case name ('a'..'j') to the predicted wavefronts, or a function returning it.

    Unanswered cases (``...`` or None) are listed; all unanswered counts as not attempted.
    """
    if callable(answers):
        answers = call(answers)
    if not isinstance(answers, dict):
        raise ExerciseFailed("give a dict from case name to wavefronts, e.g. {'a': 1, ...}; "
                             f"got {type(answers).__name__}")
    names = [c.name for c in PREDICTION_CASES]
    unknown = sorted(set(answers) - set(names))
    if unknown:
        raise ExerciseFailed(f"unknown case name(s) {unknown}; the cases are {', '.join(names)}")
    given = {n: _answer_value(answers.get(n), n) for n in names}
    if all(v is None for v in given.values()):
        raise _NotAttempted
    problems = []
    for case in PREDICTION_CASES:
        got = given[case.name]
        if got is None:
            continue
        right = banks.wavefronts(case.addresses, case.access_bytes)
        if got == right:
            continue
        fmt = dict(width=case.access_bytes, lanes=banks.lanes_per_phase(case.access_bytes),
                   ideal=banks.ideal_wavefronts(case.access_bytes))
        fmt["dup"] = _duplicate_lanes(case)
        fmt["a_width"] = f"{_a(case.access_bytes)} {case.access_bytes}"
        why = next((text.format(**fmt) for model, applies, text in _MISTAKES
                    if applies(case) and model(case) != right and model(case) == got), None)
        if why is None:
            why = (f"not {got}. Work phase by phase: {fmt['lanes']} lanes per phase for {case.access_bytes}-byte "
                   f"accesses; in each phase, list the distinct 4-byte words, find the bank holding the most of them; "
                   f"add the phases")
        problems.append(f"case {case.name} ({case.text}): {why}.")
    missing = [n for n in names if given[n] is None]
    if problems:
        raise ExerciseFailed("\n".join(problems + ([f"not answered yet: {', '.join(missing)}"] if missing else [])))
    if missing:
        raise ExerciseFailed(f"all answered cases are right; still to answer: {', '.join(missing)}")
    worst = max(PREDICTION_CASES, key=lambda c: banks.conflict_ways(c.addresses, c.access_bytes))
    return (f"all {len(names)} right; the worst is case {worst.name}, "
            f"{banks.conflict_ways(worst.addresses, worst.access_bytes):g}-way")


def _a(n) -> str:
    """The article for a number read aloud: 'an 8-way', 'a 16-way'."""
    return "an" if str(int(n)).startswith("8") or int(n) in (11, 18) else "a"


# --- notebook 06b, exercise 1: pad the rows ----------------------------------------------------

# (D, access_bytes) for float32 tiles: powers of two, and widths that are not
PADDING_CASES = ((32, 4), (64, 4), (128, 4), (40, 4), (32, 8), (64, 16), (32, 16), (48, 16), (36, 16), (33, 4))


def _padding_result(D, access_bytes, pad):
    return banks.column_read_ways(D, pad, access_bytes)


@exercise("row padding")
def check_padding(fn):
    """``fn(D, access_bytes)`` → extra 4-byte words at the end of each row of a float32 ``(rows, D)`` tile
    such that a warp reading a column (lane i reads row i, ``access_bytes`` bytes at the same column)
    is conflict-free at every column."""
    for D, access_bytes in PADDING_CASES:
        pad = call(fn, D, access_bytes)
        if isinstance(pad, bool) or not isinstance(pad, numbers.Integral):
            raise ExerciseFailed(f"D={D}, {access_bytes}-byte accesses: return a whole number of 4-byte words, "
                                 f"got {type(pad).__name__} {pad!r}")
        pad = int(pad)
        where = (f"D={D}, {access_bytes}-byte accesses, +{pad} word{'' if pad == 1 else 's'} "
                 f"(row stride {D + pad} words)")
        if pad < 0:
            raise ExerciseFailed(f"D={D}, {access_bytes}-byte accesses: padding cannot be negative, got {pad}")
        w = access_bytes // 4
        if (D + pad) % w:
            raise ExerciseFailed(f"{where}: rows would start at addresses that are not multiples of {access_bytes} "
                                 f"bytes, so the {8 * access_bytes}-bit loads would be misaligned: pad by a "
                                 f"multiple of {w} words")
        ways = _padding_result(D, access_bytes, pad)
        if ways == 1:
            continue
        stride_units = (D + pad) // w
        if pad == 0:
            hint = (f"without padding the row stride is {D} words, so "
                    + ("every row starts in the same bank" if D % 32 == 0 else
                       f"consecutive rows start {D % 32} banks apart and rows {32 // math.gcd(D, 32)} apart collide"))
        elif pad % 32 == 0:
            turns = "a whole turn" if pad == 32 else f"{pad // 32} whole turns"
            hint = (f"+{pad} words moves each row by {turns} of the 32 banks, so every row lands in the bank "
                    "it had without padding")
            if pad == D:
                hint += " (here it is also the source's doubling: twice the memory, the same conflict)"
        elif pad == D:
            hint = ("doubling the row (the source's compute_padded_headdim) keeps the row stride a multiple of "
                    "the bank width: the conflict stays and the tile takes twice the memory")
        else:
            hint = (f"the stride is {stride_units} {access_bytes}-byte accesses, an even number, so rows of one "
                    f"phase still start in the same banks")
        raise ExerciseFailed(f"{where}: still {_a(ways)} {ways:g}-way conflict; {hint}. What matters is the row stride "
                             f"counted in {access_bytes}-byte accesses, modulo the 32 banks: make it odd")
    return ("every column read is conflict-free; the smallest padding makes the row stride an odd number of "
            "accesses (+1 word for 4-byte, +2 for 8-byte, +4 for 16-byte loads when D is a multiple of 32)")
