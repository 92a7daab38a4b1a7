"""Exercise of notebook 14: the rule that classifies a tile of a sliding window as skipped, partial or full.

The learner writes ``block_kind(m0, block_m, n0, block_n, L, S, left, right) -> "skipped" | "partial" | "full"`` for
the tile of query rows ``m0 .. m0 + block_m`` and keys ``n0 .. n0 + block_n`` of an L × S problem whose query i
sees the keys ``i - left .. i + right`` (FlashAttention's ``window_size``, -1 unbounded, aligned top-left). The
check compares every tile of many problems with the dense mask's tiles (``mask_blocks.classify``) and names the
first mistake by a (query, key) pair that shows it: a tile skipped though a row sees a key in it, a tile computed
though no row sees any of its keys, a full tile with a pair outside the window (at which edge), or hanging over
the end of the problem, a partial tile every pair of which takes part.
"""

from __future__ import annotations

from flashattn.kernels import mask_blocks

from ._check import ExerciseFailed, call, exercise

KINDS = ("skipped", "partial", "full")
# (L, S, block_m, block_n, left, right): windows on both sides, causal ones (right 0), unbounded sides, ragged
# ends, more keys than queries and fewer, one query, blocks of different shapes, windows ending on tile corners
CASES = [(256, 256, 32, 32, 40, 0), (256, 256, 64, 16, 63, 0), (200, 200, 32, 64, 100, 20), (100, 100, 16, 16, 0, 0),
         (130, 97, 32, 16, -1, 0), (97, 130, 16, 32, 24, -1), (64, 64, 16, 16, -1, -1), (120, 120, 32, 32, 31, 31),
         (1, 50, 16, 16, 3, 7), (90, 40, 32, 16, 10, 2), (256, 256, 32, 32, 32, 0), (80, 80, 16, 32, 0, 15),
         (160, 160, 32, 32, 33, 1)]  # the last: a window whose ends fall exactly on a tile's corners


def block_kind_solution(m0, block_m, n0, block_n, L, S, left, right) -> str:
    """From the tile's corners: the span of ``j - i`` over the tile against the window's ``[-left, right]``."""
    left = L + S if left == -1 else left
    right = L + S if right == -1 else right
    m_last, n_last = min(m0 + block_m, L) - 1, min(n0 + block_n, S) - 1
    if n0 - m_last > right or n_last - m0 < -left:
        return "skipped"
    inside = m0 + block_m <= L and n0 + block_n <= S
    if inside and n0 + block_n - 1 - m0 <= right and n0 - (m0 + block_m - 1) >= -left:
        return "full"
    return "partial"


def _sees(i: int, j: int, L: int, S: int, left: int, right: int) -> bool:
    return i < L and j < S and (left == -1 or j >= i - left) and (right == -1 or j <= i + right)


def _explain(got: str, want: str, m0, block_m, n0, block_n, L, S, left, right, skips: bool) -> str:
    """Why ``got`` is wrong, by a (query, key) pair of the tile; ``skips``: the function skipped some tile of this
    problem (if it never does, the mistake is not an edge off by one)."""
    rows, keys = range(m0, m0 + block_m), range(n0, n0 + block_n)
    unbounded = " (-1 means unbounded on that side: every key that far is in the window)" if -1 in (left, right) else ""
    if want == "skipped":  # computed, but no pair
        reach_left, reach_right = (L + S if side == -1 else side for side in (left, right))

        def outside(pair):  # how far the pair is outside the window
            return max(pair[0] - reach_left - pair[1], pair[1] - pair[0] - reach_right)

        near = min(((i, j) for i in rows if i < L for j in keys if j < S), key=outside, default=None)
        hint = "" if skips else "; it never returns 'skipped' in this problem"
        if skips and near is not None and outside(near) == 1:
            hint = (f"; the nearest pair, query {near[0]} and key {near[1]}, is just outside: the window is "
                    "i - left <= j <= i + right, no more")
        return (f"it is {got}, but no query of the tile sees any of its keys: work for nothing{hint} (rows past "
                f"L={L} and keys past S={S} do not count)")
    if got == "skipped":  # a pair is lost
        i, j = next((i, j) for i in rows for j in keys if _sees(i, j, L, S, left, right))
        edge = " (the window includes its ends)" if j in (i - left, i + right) else ""
        return (f"it is skipped, but query {i} sees key {j}{edge}: that pair would be lost{unbounded}; check the "
                "tile's extreme rows: the first sees keys furthest left, the last furthest right")
    if got == "full":  # a pair outside the window, or outside the problem
        i, j = next((i, j) for i in rows for j in keys if not _sees(i, j, L, S, left, right))
        if i >= L or j >= S:
            past = f"query {i} is past the last query (L={L})" if i >= L else f"key {j} is past the last key (S={S})"
            return (f"it is called full, but it hangs over the end of the problem ({past}): rows and keys past the "
                    "end need the mask, so the tile is partial")
        side = "left" if left != -1 and j < i - left else "right"
        row = "last" if side == "left" else "first"
        return (f"it is called full, but query {i} does not see key {j} (past the window's {side} edge): for a full "
                f"tile the {row} row of the tile must see the {'first' if side == 'left' else 'last'} key")
    return (f"it is partial, but every query of the tile sees every one of its keys: run it unmasked (full){unbounded}"
            " (only the tiles that cross the window's edges or the problem's end pay for tl.where)")


@exercise("block kinds")
def check_block_kind(fn) -> str:
    tiles = {kind: 0 for kind in KINDS}
    for L, S, block_m, block_n, left, right in CASES:
        want_kinds = mask_blocks.classify(mask_blocks.window_mask(L, S, (left, right)), block_m, block_n)
        starts = [(a * block_m, b * block_n) for a in range(want_kinds.shape[0]) for b in range(want_kinds.shape[1])]
        got_kinds = [call(fn, m0, block_m, n0, block_n, L, S, left, right) for m0, n0 in starts]
        for (m0, n0), got in zip(starts, got_kinds, strict=True):
            where = (f"L={L}, S={S}, window=({left}, {right}), tile of queries {m0}..{m0 + block_m - 1} and "
                     f"keys {n0}..{n0 + block_n - 1}")
            if got not in KINDS:
                raise ExerciseFailed(f"{where}: return one of {', '.join(map(repr, KINDS))}, got {got!r}")
            want = KINDS[int(want_kinds[m0 // block_m, n0 // block_n])]
            if got != want:
                why = _explain(got, want, m0, block_m, n0, block_n, L, S, left, right, "skipped" in got_kinds)
                raise ExerciseFailed(f"{where}: {why}")
            tiles[got] += 1
    return (f"{len(CASES)} problems, {sum(tiles.values())} tiles: {tiles['full']} full, {tiles['partial']} partial, "
            f"{tiles['skipped']} skipped, every one right")
