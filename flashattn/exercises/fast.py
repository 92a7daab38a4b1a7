"""Exercise of notebook 10: the stages of ``fast``'s key loop, which blocks run with a mask and which without.

``attn_kernel_fast`` runs a Q tile's key loop in two stages (``_attend`` with ``MASK=False``, then with
``MASK=True``), so that only the blocks that need it pay for ``tl.where``. The learner writes the stages as
``key_stages(m0, block_m, block_n, n_keys, causal) -> [(lo, hi, masked), ...]`` for the tile of query rows
``m0 .. m0 + block_m`` (as many queries as keys); the loop visits the key blocks ``range(lo, hi, block_n)``, each
covering keys ``start .. start + block_n``. The check compares every (row, key) pair with what attention
needs, and names the first mistake: a key some row never sees (or sees twice), an unmasked block with keys
past the end or right of a row's diagonal, a masked block that needs no mask, a block no row sees.
"""

from __future__ import annotations

from ._check import ExerciseFailed, call, exercise

# (block_m, block_n, N, causal): whole blocks, a ragged tail, N = 1, blocks of different sizes
CASES = [(64, 64, 256, False), (64, 64, 256, True), (128, 64, 1000, False), (128, 64, 1000, True),
         (64, 16, 17, True), (64, 16, 17, False), (32, 32, 1, False), (32, 32, 1, True), (64, 32, 200, True)]


def key_stages_solution(m0: int, block_m: int, block_n: int, n_keys: int, causal: bool) -> list:
    """The stages of ``attn_kernel_fast`` (``L == S``): causal, the blocks left of the tile's diagonal unmasked
    and the diagonal masked; otherwise every whole block unmasked and the ragged tail masked."""
    if causal:
        return [(0, m0, False), (m0, min(m0 + block_m, n_keys), True)]
    s_full = (n_keys // block_n) * block_n
    return [(0, s_full, False), (s_full, n_keys, True)]


def _visible(row: int, key: int, n_keys: int, causal: bool) -> bool:
    return key < n_keys and (not causal or key <= row)


def _blocks(stages, block_n: int, where: str) -> list:
    """The (start, masked) of every key block the stages visit, checked for form."""
    if not isinstance(stages, (list, tuple)):
        raise ExerciseFailed(f"{where}: return a list of (lo, hi, masked) stages, got {type(stages).__name__}")
    blocks = []
    for stage in stages:
        if not (isinstance(stage, (list, tuple)) and len(stage) == 3):
            raise ExerciseFailed(f"{where}: every stage is a triple (lo, hi, masked), got {stage!r}")
        lo, hi, masked = stage
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi)) or not isinstance(masked, bool):
            raise ExerciseFailed(f"{where}: lo and hi are ints and masked a bool, got {stage!r}")
        if lo < 0:
            raise ExerciseFailed(f"{where}: the stage {stage} starts at key {lo}, before the first key (0)")
        if lo % block_n:
            raise ExerciseFailed(f"{where}: the stage {stage} starts at key {lo}, not at a block boundary (a multiple "
                                 f"of BLOCK_N = {block_n}): its blocks would straddle two of the key blocks")
        blocks += [(start, masked) for start in range(lo, hi, block_n)]
    return blocks


def _check_tile(stages, m0: int, block_m: int, block_n: int, n_keys: int, causal: bool) -> None:
    where = f"{'causal' if causal else 'non-causal'}, N={n_keys}, BLOCK_M={block_m}, BLOCK_N={block_n}, tile m0={m0}"
    blocks = _blocks(stages, block_n, where)
    rows = range(m0, min(m0 + block_m, n_keys))  # rows past N are computed but never stored
    starts = [start for start, _ in blocks]
    for start in sorted(set(starts)):
        if starts.count(start) > 1:
            raise ExerciseFailed(f"{where}: keys {start}..{start + block_n - 1} are visited {starts.count(start)} "
                                 "times: the stages overlap, and those keys would count twice in every row")
    for start, masked in blocks:
        keys = range(start, start + block_n)
        seen = [(r, c) for r in rows for c in keys if _visible(r, c, n_keys, causal)]
        span = f"block {start}..{start + block_n - 1}"
        if not seen:
            raise ExerciseFailed(f"{where}: the {span} is visited, but no row of this tile sees any of its keys (past "
                                 "the end, or right of every row's diagonal): work for nothing; the loop can stop "
                                 "before it")
        if not masked and len(seen) < len(rows) * block_n:
            past = [c for c in keys if c >= n_keys]
            if past:
                raise ExerciseFailed(f"{where}: the unmasked {span} reaches past the last key ({n_keys - 1}): the "
                                     "ragged tail needs the mask, or keys past N (read as zeros) count as scores")
            row, key = next((r, c) for r in rows for c in keys if not _visible(r, c, n_keys, causal))
            raise ExerciseFailed(f"{where}: the unmasked {span} holds key {key}, right of row {row}'s diagonal: the "
                                 "blocks from the tile's first row (m0) on are the diagonal, and need the causal mask")
        if masked and len(seen) == len(rows) * block_n:
            raise ExerciseFailed(f"{where}: the {span} is masked but every row sees every key in it: run it in the "
                                 "unmasked stage (the point of the stages is that only the diagonal and the ragged "
                                 "tail pay for tl.where)")
    covered = {c for start, _ in blocks for c in range(start, start + block_n)}
    for r in rows:
        missing = [c for c in range(n_keys) if _visible(r, c, n_keys, causal) and c not in covered]
        if missing:
            raise ExerciseFailed(f"{where}: row {r} never sees key {missing[0]} ({len(missing)} keys missed): the "
                                 "stages must cover every key a row may see")


@exercise("key stages")
def check_key_stages(fn) -> str:
    visited = masked = 0
    for block_m, block_n, n_keys, causal in CASES:
        for m0 in range(0, n_keys, block_m):
            stages = call(fn, m0, block_m, block_n, n_keys, causal)
            _check_tile(stages, m0, block_m, block_n, n_keys, causal)
            blocks = _blocks(stages, block_n, "")
            visited, masked = visited + len(blocks), masked + sum(m for _, m in blocks)
    return (f"{len(CASES)} problems: every key seen once, only the blocks that need it masked "
            f"({masked} of {visited} blocks visited)")
