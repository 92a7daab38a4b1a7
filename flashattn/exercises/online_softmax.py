"""Exercises of notebook 03 (online softmax): merging two softmax states, and softmax over chunks.

Each check runs the learner's function on fresh random inputs chosen to expose one classic mistake
at a time (moderate values, a row length that is not a multiple of the chunk, logits large enough
to overflow exp, empty or fully masked chunks). When the output is wrong, it is compared with
deliberately wrong implementations (mistake models) on the same inputs, so the message can name
the mistake instead of only saying "wrong".
"""

# ruff: noqa: E741  (l is the running sum, as in the FlashAttention papers and the kernels' li)

from __future__ import annotations

import contextlib

import torch

from flashattn.models.softmax import merge as _merge
from flashattn.models.softmax import running_stats as _running_stats

from ._check import ExerciseFailed, call, exercise

__all__ = ["check_merge", "check_online_softmax", "MERGE_MISTAKES", "ONLINE_SOFTMAX_MISTAKES"]

NEG_INF = float("-inf")


def _close(a, b, rtol: float, atol: float = 0.0) -> bool:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.shape != b.shape:
        return False
    return bool(torch.isclose(a.to(torch.float64), b.to(torch.float64), rtol=rtol, atol=atol, equal_nan=True).all())


def _first_bad(out, ref, rtol: float, atol: float = 0.0):
    """Index (as a tuple) of the first element where out and ref disagree."""
    bad = ~torch.isclose(out.to(torch.float64), ref.to(torch.float64), rtol=rtol, atol=atol, equal_nan=True)
    return tuple(int(i) for i in bad.nonzero()[0])


def _match_mistake(out, ref, mistakes, args, rtol: float, atol: float = 0.0):
    """The message of the first mistake model that differs from ref here and that out reproduces."""
    for _name, model, message in mistakes:
        try:
            wrong = model(*args)
        except Exception:  # a model may not apply to an input (e.g. no full chunk at all)
            continue
        if not _close(wrong, ref, rtol, atol) and _close(out, wrong, rtol, atol):
            return message
    return None


# ---------------------------------------------------------------------------------------------
# Exercise 1: merge(m1, l1, m2, l2) -> (m, l)


def _offset(m):
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def _merge_no_rescale(m1, l1, m2, l2):
    return l1 + l2


def _merge_forgot_first(m1, l1, m2, l2):
    m = torch.maximum(m1, m2)
    return l1 + torch.exp(m2 - _offset(m)) * l2


def _merge_forgot_second(m1, l1, m2, l2):
    m = torch.maximum(m1, m2)
    return torch.exp(m1 - _offset(m)) * l1 + l2


def _merge_wrong_sign(m1, l1, m2, l2):
    m = torch.maximum(m1, m2)
    return torch.exp(_offset(m) - m1) * l1 + torch.exp(_offset(m) - m2) * l2


def _merge_unshifted(m1, l1, m2, l2):
    return torch.exp(m1) * l1 + torch.exp(m2) * l2


def _merge_unshifted_then_divided(m1, l1, m2, l2):
    m = torch.maximum(m1, m2)
    return (torch.exp(m1) * l1 + torch.exp(m2) * l2) / torch.exp(m)


def _merge_no_guard(m1, l1, m2, l2):
    m = torch.maximum(m1, m2)
    return torch.exp(m1 - m) * l1 + torch.exp(m2 - m) * l2


# (name, l computed the wrong way, what to tell the learner); the first model that reproduces the
# learner's output where the right answer differs names the mistake, so specific ones come first
MERGE_MISTAKES = [
    ("no_rescale", _merge_no_rescale,
     "l is l1 + l2: the two sums are relative to different maxima (m1 and m2), so they cannot be added "
     "as they are. Rescale each to the new max first: l = exp(m1 - m)·l1 + exp(m2 - m)·l2."),
    ("forgot_first", _merge_forgot_first,
     "l is right where m1 is the larger max but too large where m2 > m1: you did not rescale l1. "
     "l1 is relative to m1; to make it relative to m = max(m1, m2) multiply it by exp(m1 - m)."),
    ("forgot_second", _merge_forgot_second,
     "l is right where m2 is the larger max but too large where m1 > m2: you did not rescale l2. "
     "l2 is relative to m2; to make it relative to m = max(m1, m2) multiply it by exp(m2 - m)."),
    ("wrong_sign", _merge_wrong_sign,
     "l is too large: the rescaling factor has the wrong sign. Use exp(m1 - m), not exp(m - m1): "
     "the new max m is at least m1, so the factor must be <= 1 (the old terms shrink)."),
    ("unshifted", _merge_unshifted,
     "l is the plain sum of exponentials, e^m times too large (or inf): it must be relative to the "
     "max, l = Σ e^(x - m). Return exp(m1 - m)·l1 + exp(m2 - m)·l2 together with m = max(m1, m2)."),
    ("no_guard", _merge_no_guard,
     "NaN when both parts are empty (m1 = m2 = -inf, l1 = l2 = 0): then m = -inf and exp(m1 - m) is "
     "exp(-inf - (-inf)) = exp(NaN). Real kernels meet this (a causal row whose first key block is "
     "fully masked). Where m is -inf subtract 0 instead, e.g. torch.where(m == -inf, 0, m): the "
     "result must be (m, l) = (-inf, 0)."),
    ("unshifted_then_divided", _merge_unshifted_then_divided,
     "right for moderate values but inf/NaN when the maxima are large (~800): you computed e^m1 or "
     "e^m2 on its own, which overflows. Compute exp(m1 - m) instead: its exponent is never positive."),
]


def _merge_cases(gen: torch.Generator, rows: int = 12):
    """(label, m1, l1, m2, l2) in float64: moderate, large, one side empty, both sides empty."""

    def uniform(lo, hi):
        return lo + (hi - lo) * torch.rand(rows, generator=gen, dtype=torch.float64)

    def sums():  # the sum of a chunk relative to its own max is at least 1 (the max itself)
        return uniform(1.0, 9.0)

    # moderate: m1 - m2 takes both signs and is never 0, so a missing rescale always shows
    gap = uniform(0.5, 4.0) * torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0).to(torch.float64)
    m2 = uniform(-3.0, 3.0)
    cases = [("moderate values", m2 + gap, sums(), m2, sums())]

    big = uniform(780.0, 820.0)  # exp overflows float64 above ~709.8
    big_gap = uniform(0.5, 4.0) * torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0).to(torch.float64)
    cases.append(("large maxima (about 800; exp(800) overflows even float64)", big + big_gap, sums(), big, sums()))

    # one side empty (an empty or fully masked chunk has the state (-inf, 0)), alternating sides
    m1, l1, m2, l2 = uniform(-3.0, 3.0), sums(), uniform(-3.0, 3.0), sums()
    left = torch.arange(rows) % 2 == 0
    m1, l1 = torch.where(left, NEG_INF, m1), torch.where(left, 0.0, l1)
    m2, l2 = torch.where(~left, NEG_INF, m2), torch.where(~left, 0.0, l2)
    cases.append(("one part empty (m = -inf, l = 0 on one side)", m1, l1, m2, l2))

    m1, l1, m2, l2 = uniform(-3.0, 3.0), sums(), uniform(-3.0, 3.0), sums()
    both = torch.arange(rows) % 3 == 0
    m1, l1 = torch.where(both, NEG_INF, m1), torch.where(both, 0.0, l1)
    m2, l2 = torch.where(both, NEG_INF, m2), torch.where(both, 0.0, l2)
    cases.append(("both parts empty in some rows (m1 = m2 = -inf, l1 = l2 = 0)", m1, l1, m2, l2))
    return cases


def _as_pair(result):
    if isinstance(result, tuple | list) and len(result) == 2:
        return torch.as_tensor(result[0]), torch.as_tensor(result[1])
    what = f"a {type(result).__name__} of length {len(result)}" if isinstance(result, tuple | list) else (
        f"one {type(result).__name__}")
    raise ExerciseFailed(
        f"merge must return two things, (m, l): the max of the union and its sum relative to that max. "
        f"It returned {what}. If you returned only l, add the max: return m, l.")


@exercise("merge")
def check_merge(fn, seed: int = 0) -> str:
    """Check ``fn(m1, l1, m2, l2) -> (m, l)``, the merge of two softmax states, on float64 tensors."""
    gen = torch.Generator().manual_seed(seed)
    rtol = 1e-9
    cases = _merge_cases(gen)
    for label, m1, l1, m2, l2 in cases:
        args = (m1.clone(), l1.clone(), m2.clone(), l2.clone())
        m_out, l_out = _as_pair(call(fn, *args))
        m_ref, l_ref = _merge(m1, l1, m2, l2)
        where = f"[{label}]"
        for name, got in (("m", m_out), ("l", l_out)):
            if got.shape != m_ref.shape:
                raise ExerciseFailed(f"{where} {name} has shape {tuple(got.shape)}, expected {tuple(m_ref.shape)} "
                                     "(one value per row: work elementwise on the tensors).")

        if not _close(m_out, m_ref, rtol):
            if _close(m_out, l_ref, rtol) and _close(l_out, m_ref, rtol):
                raise ExerciseFailed(f"{where} the outputs are swapped: return (m, l), the max first.")
            r = _first_bad(m_out, m_ref, rtol)[0]
            hint = ("you took the smaller one" if _close(m_out, torch.minimum(m1, m2), rtol)
                    else "m must be max(m1, m2), e.g. torch.maximum(m1, m2)")
            raise ExerciseFailed(f"{where} row {r}: m1 = {m1[r].item():.6g}, m2 = {m2[r].item():.6g}, expected "
                                 f"m = {m_ref[r].item():.6g}, got {m_out[r].item():.6g}: {hint}.")

        if _close(l_out, l_ref, rtol):
            continue
        message = _match_mistake(l_out, l_ref, MERGE_MISTAKES, (m1, l1, m2, l2), rtol)
        r = _first_bad(l_out, l_ref, rtol)[0]
        row = (f"row {r}: m1 = {m1[r].item():.6g}, l1 = {l1[r].item():.6g}, m2 = {m2[r].item():.6g}, "
               f"l2 = {l2[r].item():.6g}: expected l = {l_ref[r].item():.6g}, got {l_out[r].item():.6g}")
        if message is None:
            if not torch.isfinite(l_out[r]):
                message = ("l is not finite: make every exponent <= 0 by subtracting the new max "
                           "(and subtract 0 where the new max is -inf).")
            else:
                message = "expected l = exp(m1 - m)·l1 + exp(m2 - m)·l2 with m = max(m1, m2)."
        raise ExerciseFailed(f"{where} {message}\n  {row}")
    return f"{len(cases)} cases (moderate, large, one side empty, both sides empty)"


# ---------------------------------------------------------------------------------------------
# Exercise 2: online_softmax(x, chunk) -> softmax(x, dim=-1), one pass over chunks for (m, l)


def _spans(n, chunk):
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)]


def _softmax_no_rescale(x, chunk):
    m = torch.full(x.shape[:-1], NEG_INF, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s, e in _spans(x.shape[-1], chunk):
        m = torch.maximum(m, x[..., s:e].amax(-1))
        l = l + torch.exp(x[..., s:e] - _offset(m)[..., None]).sum(-1)
    return torch.exp(x - m[..., None]) / l[..., None]


def _softmax_wrong_sign(x, chunk):
    """exp(m_new - m_old): from the start m_old = -inf, so the factor is inf and inf · 0 = NaN."""
    m = torch.full(x.shape[:-1], NEG_INF, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s, e in _spans(x.shape[-1], chunk):
        m_new = torch.maximum(m, x[..., s:e].amax(-1))
        l = torch.exp(m_new - m) * l + torch.exp(x[..., s:e] - m_new[..., None]).sum(-1)
        m = m_new
    return torch.exp(x - m[..., None]) / l[..., None]


def _softmax_wrong_sign_guarded(x, chunk):
    """exp(m_new - m_old), with the first chunk started from its own state (no inf · 0)."""
    m = torch.full(x.shape[:-1], NEG_INF, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s, e in _spans(x.shape[-1], chunk):
        m_new = torch.maximum(m, x[..., s:e].amax(-1))
        grow = torch.where(torch.isneginf(m), torch.zeros_like(m), torch.exp(m_new - m) * l)
        l = grow + torch.exp(x[..., s:e] - m_new[..., None]).sum(-1)
        m = m_new
    return torch.exp(x - m[..., None]) / l[..., None]


def _softmax_early_normalize(x, chunk):
    """Each chunk normalized with the running (m, l) at the moment it arrives."""
    m = torch.full(x.shape[:-1], NEG_INF, dtype=x.dtype)
    l = torch.zeros_like(m)
    out = torch.empty_like(x)
    for s, e in _spans(x.shape[-1], chunk):
        xj = x[..., s:e]
        m, l = _merge(m, l, xj.amax(-1), torch.exp(xj - _offset(xj.amax(-1))[..., None]).sum(-1))
        out[..., s:e] = torch.exp(xj - m[..., None]) / l[..., None]
    return out


def _softmax_chunk_max_in_normalize(x, chunk):
    """Right (m, l), but the normalize pass subtracts each chunk's own max instead of the final m."""
    _, l = _stats(x, chunk)
    out = torch.empty_like(x)
    for s, e in _spans(x.shape[-1], chunk):
        xj = x[..., s:e]
        out[..., s:e] = torch.exp(xj - xj.amax(-1, keepdim=True)) / l[..., None]
    return out


def _full_chunk_stats(x, chunk):
    full = (x.shape[-1] // chunk) * chunk
    if full == 0:
        raise ValueError("no full chunk")
    return _stats(x[..., :full], chunk)


def _softmax_ignore_tail(x, chunk):
    """The tail chunk (N % chunk logits) left out of (m, l); every column normalized with them."""
    m, l = _full_chunk_stats(x, chunk)
    return torch.exp(x - m[..., None]) / l[..., None]


def _softmax_ignore_tail_zero(x, chunk):
    """The tail chunk left out of (m, l) and out of the output (its columns stay 0)."""
    m, l = _full_chunk_stats(x, chunk)
    out = torch.exp(x - m[..., None]) / l[..., None]
    out[..., (x.shape[-1] // chunk) * chunk:] = 0.0
    return out


def _softmax_unshifted(x, chunk):
    l = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for s, e in _spans(x.shape[-1], chunk):
        l = l + torch.exp(x[..., s:e]).sum(-1)
    return torch.exp(x) / l[..., None]


def _softmax_no_guard(x, chunk):
    m = torch.full(x.shape[:-1], NEG_INF, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s, e in _spans(x.shape[-1], chunk):
        xj = x[..., s:e]
        m_new = torch.maximum(m, xj.amax(-1))
        l = torch.exp(m - m_new) * l + torch.exp(xj - m_new[..., None]).sum(-1)
        m = m_new
    return torch.exp(x - m[..., None]) / l[..., None]


def _stats(x, chunk):
    m, l = _running_stats(x, chunk)
    return m[..., -1], l[..., -1]


def _softmax_loop(x, chunk, *, exponent="new", update_max=True, final="m"):
    """The running (m, l) loop with one mistake, then exp(x - m) / l.

    exponent: "new" (exp(xj - m_new), right), "old" (exp(xj - m_old): -inf at the first chunk),
    "old_guarded" (exp(xj - m_old) with -inf replaced by 0). update_max=False: m is never assigned, and
    the final step uses m ("m", -inf: exp overflows), m with -inf replaced by 0 ("m_guarded"), or the last
    chunk's m_new ("m_new").
    """
    m = torch.full(x.shape[:-1], NEG_INF, dtype=x.dtype)
    l = torch.zeros_like(m)
    m_new = m
    for s, e in _spans(x.shape[-1], chunk):
        xj = x[..., s:e]
        m_new = torch.maximum(m, xj.amax(-1))
        against = {"new": _offset(m_new), "old": m, "old_guarded": _offset(m)}[exponent]
        l = torch.exp(m - _offset(m_new)) * l + torch.exp(xj - against[..., None]).sum(-1)
        if update_max:
            m = m_new
    last = {"m": m, "m_guarded": _offset(m), "m_new": _offset(m_new)}[final]
    return torch.exp(x - last[..., None]) / l[..., None]


def _softmax_zero_padded_tail(x, chunk):
    """The last chunk filled up with zeros to the chunk size, and the zeros counted as logits."""
    pad = torch.zeros(*x.shape[:-1], (-x.shape[-1]) % chunk, dtype=x.dtype)
    m, l = _stats(torch.cat([x, pad], -1), chunk)
    return torch.exp(x - _offset(m)[..., None]) / l[..., None]


_NEVER_UPDATED = ("m is never updated: set m = m_new after each chunk. Otherwise m stays -inf, the factor "
                  "exp(m - m_new) that rescales l is 0 at every chunk, and l only holds the last chunk.")
_EXP_OLD_MAX = ("you exponentiate each chunk against the max from before it (m_old, -inf at the first "
                "chunk). Exponentiate against m_new = max(m_old, max of the chunk), so that every exponent "
                "is <= 0, and rescale the old l by exp(m_old - m_new).")


_TAIL = ("the tail chunk is missing: when N is not a multiple of the chunk size the last chunk is "
         "shorter (N % chunk logits). Loop with range(0, N, chunk) and slice x[..., start:start + chunk] "
         "(slicing past the end is fine), so the last, short chunk is included.")

ONLINE_SOFTMAX_MISTAKES = [
    ("exp_old_max", lambda x, chunk: _softmax_loop(x, chunk, exponent="old"), _EXP_OLD_MAX),
    ("exp_old_max_guarded", lambda x, chunk: _softmax_loop(x, chunk, exponent="old_guarded"), _EXP_OLD_MAX),
    ("max_never_updated", lambda x, chunk: _softmax_loop(x, chunk, update_max=False), _NEVER_UPDATED),
    ("max_never_updated_guarded", lambda x, chunk: _softmax_loop(x, chunk, update_max=False, final="m_guarded"),
     _NEVER_UPDATED),
    ("max_never_updated_last", lambda x, chunk: _softmax_loop(x, chunk, update_max=False, final="m_new"),
     _NEVER_UPDATED),
    ("zero_padded_tail", _softmax_zero_padded_tail,
     "the last chunk was filled up with zeros to the chunk size, and the zeros count as logits: each adds "
     "exp(0 - m) to l. The last chunk is shorter: take x[..., start:start + chunk] (or pad with -inf)."),
    ("no_rescale", _softmax_no_rescale,
     "the result is off by a factor per row (the rows sum to less than 1): did you rescale l by "
     "exp(m_old - m_new)? When a chunk raises the max, the sum so far is relative to the old max and "
     "must be multiplied by exp(m_old - m_new) before the new chunk's terms are added."),
    ("wrong_sign_guarded", _softmax_wrong_sign_guarded,
     "the result is off by a factor per row: the rescaling factor has the wrong sign. Use "
     "exp(m_old - m_new) (<= 1), not exp(m_new - m_old)."),
    ("early_normalize", _softmax_early_normalize,
     "each chunk is off by its own factor (the early chunks are too large): you normalized a chunk "
     "with the running m and l at the moment it arrived, but they are final only after the last "
     "chunk. First run over all chunks to get (m, l), then normalize: exp(x - m) / l."),
    ("chunk_max_in_normalize", _softmax_chunk_max_in_normalize,
     "each chunk is off by its own factor: the normalize step subtracted the chunk's own max. "
     "Subtract the final max m of the whole row: p = exp(x - m) / l."),
    ("ignore_tail", _softmax_ignore_tail,
     "the rows sum to more than 1: " + _TAIL),
    ("ignore_tail_zero", _softmax_ignore_tail_zero,
     "the last columns are 0: " + _TAIL),
    ("unshifted", _softmax_unshifted,
     "NaN or inf for large logits: exp(x) overflows (float64 above x ~ 709.8, float32 above ~ 88.7). "
     "Subtract the running max before exponentiating, and rescale the sum when the max grows."),
    ("no_guard", _softmax_no_guard,
     "NaN in the rows whose first chunk is fully masked (all -inf): the running max is still -inf after "
     "it, so exp(m_old - m_new) = exp(-inf - (-inf)) = NaN. A fully masked chunk must leave the state "
     "(m, l) = (-inf, 0) unchanged: where the new max is -inf, subtract 0 instead of it (your merge from "
     "exercise 1 does exactly this)."),
    ("wrong_sign", _softmax_wrong_sign,
     "NaN in every row: is your rescaling factor exp(m_new - m_old)? Its sign is wrong: before the "
     "first chunk m_old = -inf, so it is exp(+inf) = inf, and inf · 0 = NaN. Use exp(m_old - m_new), "
     "which is <= 1 (the old sum shrinks when the max grows)."),
]


def _softmax_cases(gen: torch.Generator):
    """(label, x, chunk, rtol, atol) with a reference computed in float64."""

    def randn(rows, n, dtype=torch.float64):
        return torch.randn(rows, n, generator=gen, dtype=torch.float64).to(dtype)

    rows = 6
    cases = []
    # the max grows from chunk to chunk in most rows (a rising trend), and falls in the last row
    n, chunk = 48, 16
    trend = torch.linspace(0.0, 6.0, n, dtype=torch.float64)
    x = randn(rows, n) + trend
    x[-1] = randn(1, n)[0] + trend.flip(0)
    cases.append((f"moderate logits, N = {n}, chunk = {chunk}", x, chunk, 1e-9, 1e-15))

    for n, chunk in ((45, 16), (7, 16), (10, 3)):
        x = randn(rows, n) + torch.linspace(0.0, 4.0, n, dtype=torch.float64)
        cases.append((f"N = {n} is not a multiple of chunk = {chunk}", x, chunk, 1e-9, 1e-15))

    n, chunk = 45, 16
    x = 40.0 * randn(rows, n) + 800.0 + torch.linspace(0.0, 60.0, n, dtype=torch.float64)
    cases.append((f"large logits (about 800, float64), N = {n}, chunk = {chunk}", x, chunk, 1e-9, 1e-15))
    x = (10.0 * randn(rows, n) + 100.0).to(torch.float32)
    cases.append((f"large logits (about 100, float32), N = {n}, chunk = {chunk}", x, chunk, 1e-4, 1e-7))

    n, chunk = 45, 16
    x = randn(rows, n) + torch.linspace(0.0, 4.0, n, dtype=torch.float64)
    x[::2, :chunk] = NEG_INF  # every other row: the whole first chunk is masked, as in causal attention
    x[1::2, 20:24] = NEG_INF  # other rows: a few masked keys inside a chunk
    cases.append((f"masked logits (-inf; the whole first chunk in some rows), N = {n}, chunk = {chunk}",
                  x, chunk, 1e-9, 1e-15))
    return cases


def _describe_softmax_error(out, ref, x, chunk, rtol, atol) -> str:
    """A generic diagnosis when no mistake model matches."""
    r, c = _first_bad(out, ref, rtol, atol)
    n = x.shape[-1]
    detail = f"row {r}, column {c}: expected {ref[r, c].item():.6g}, got {out[r, c].item():.6g}"
    if not torch.isfinite(out).all():
        return f"NaN or inf in the output ({detail}): subtract the running max before every exp."
    full = (n // chunk) * chunk
    if full < n and _close(out[:, :full], ref[:, :full], rtol, atol):
        return f"only the last {n - full} columns (the tail chunk) are wrong ({detail}): " + _TAIL
    out64, ref64 = out.to(torch.float64), ref.to(torch.float64)
    factors = []
    for row in range(out64.shape[0]):
        seen = ref64[row] > 0
        ratio = out64[row][seen] / ref64[row][seen]
        factors.append(ratio[0] if _close(ratio, ratio[:1].expand_as(ratio), 1e-6) else None)
    if all(f is not None for f in factors):
        sums = out64.sum(-1)
        return (f"the result is off by a factor per row (row {r}: ×{factors[r].item():.6g}; it sums to "
                f"{sums[r].item():.6g}, not 1): did you rescale l by exp(m_old - m_new)? ({detail})")
    return f"{detail}. Each row must equal torch.softmax(x, dim=-1)."


_SOFTMAX_FUNCTIONS = ((torch, "softmax"), (torch, "log_softmax"), (torch.nn.functional, "softmax"),
                      (torch.nn.functional, "log_softmax"), (torch.special, "softmax"), (torch.special, "log_softmax"),
                      (torch.Tensor, "softmax"), (torch.Tensor, "log_softmax"))


@contextlib.contextmanager
def _watch_softmax(used: list):
    """Record (in ``used``) every call of PyTorch's own softmax while the learner's function runs."""
    saved = []
    for owner, name in _SOFTMAX_FUNCTIONS:
        original = getattr(owner, name)

        def watched(*args, _original=original, _name=name, **kwargs):
            used.append(_name)
            return _original(*args, **kwargs)

        saved.append((owner, name, original, name in vars(owner)))
        setattr(owner, name, watched)
    try:
        yield
    finally:
        for owner, name, original, own in reversed(saved):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)


@exercise("online softmax")
def check_online_softmax(fn, seed: int = 0) -> str:
    """Check ``fn(x, chunk)``: softmax of a (rows, N) tensor along its last dim, over chunks of keys."""
    gen = torch.Generator().manual_seed(seed)
    cases = _softmax_cases(gen)
    used: list[str] = []
    for label, x, chunk, rtol, atol in cases:
        with _watch_softmax(used):
            out = call(fn, x.clone(), chunk)
        ref = torch.softmax(x.to(torch.float64), dim=-1)
        where = f"[{label}]"
        if not isinstance(out, torch.Tensor):
            raise ExerciseFailed(f"{where} expected a tensor shaped like x, got {type(out).__name__}.")
        if out.shape != x.shape:
            raise ExerciseFailed(f"{where} the output has shape {tuple(out.shape)}, x has {tuple(x.shape)}: "
                                 "return one probability per logit.")
        if out.dtype != x.dtype:
            raise ExerciseFailed(f"{where} the output is {str(out.dtype).replace('torch.', '')} for "
                                 f"{str(x.dtype).replace('torch.', '')} x: keep x's dtype (create the running "
                                 "state with dtype=x.dtype, and do not convert the result).")
        if _close(out, ref, rtol, atol):
            continue
        message = _match_mistake(out, ref, ONLINE_SOFTMAX_MISTAKES, (x, chunk), rtol, atol)
        if message is None:
            message = _describe_softmax_error(out, ref, x, chunk, rtol, atol)
        raise ExerciseFailed(f"{where} {message}")
    if used:
        raise ExerciseFailed(
            f"the results are right, but your function calls PyTorch's own {used[0]}: the exercise is the loop "
            "that makes softmax online. Keep the running state (m, l) over the chunks, then return "
            "exp(x - m) / l, with no softmax call.")
    return f"{len(cases)} cases (row lengths that are not multiples of the chunk, large logits, masked chunks)"
