"""The exercise of notebook 16: the merge after one step of ring attention.

``check_merge_step(fn)``: ``fn(o, lse, o_j, lse_j)`` returns ``(o_new, lse_new)``: the running output ``o`` (…, L, D)
float32 and its log-sum-exp ``lse`` (…, L) float32, over the keys seen so far, merged with one step's partial
output ``o_j`` (in the kernel's dtype, float16 here) and ``lse_j`` over a disjoint set of keys. The merge of
notebook 03, with the output already normalised:

    m = max(lse, lse_j),  lse_new = m + log(e^(lse − m) + e^(lse_j − m)),
    o_new = e^(lse − lse_new) · o + e^(lse_j − lse_new) · o_j       (in float32)

The check runs it on moderate values, on log-sum-exps far past exp's range (scores of a few hundred), on a float16
partial output, and on a ring of four steps; it compares with the models of the classic mistakes and names the one
that matches.
"""

from __future__ import annotations

import torch

from ._check import ExerciseFailed, call, exercise, rel_error

SHAPE = (2, 3, 5, 8)  # (B, H, L, D)
TOLERANCE = 1e-5  # float32 merging of float16 partials: about 1e-7 here; half precision: about 1e-3


def _inputs(seed: int, lse_shift: float, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(SHAPE, generator=gen).float()
    o_j = torch.randn(SHAPE, generator=gen).to(dtype)
    lse = torch.randn(SHAPE[:-1], generator=gen) * 2 + lse_shift
    lse_j = torch.randn(SHAPE[:-1], generator=gen) * 2 + lse_shift
    return o, lse, o_j, lse_j


def _right(o, lse, o_j, lse_j):
    """The merge in float64 (the truth the check compares with)."""
    o, lse, o_j, lse_j = (t.double() for t in (o, lse, o_j, lse_j))
    lse_new = torch.logaddexp(lse, lse_j)
    return torch.exp(lse - lse_new)[..., None] * o + torch.exp(lse_j - lse_new)[..., None] * o_j, lse_new


def _mistakes(o, lse, o_j, lse_j) -> dict[str, tuple]:
    """(o, lse) of each classic mistake, in float64, with the message that names it."""
    o, lse, o_j, lse_j = (t.double() for t in (o, lse, o_j, lse_j))
    m = torch.maximum(lse, lse_j)
    right_o, right_lse = _right(o, lse, o_j, lse_j)
    w, w_j = torch.exp(lse - right_lse)[..., None], torch.exp(lse_j - right_lse)[..., None]
    return {
        "the outputs were added without their weights: each partial output is normalised over its own keys, so "
        "weight it by its share of the union, e^(lse − lse_new) and e^(lse_j − lse_new)": (o + o_j, None),
        "the two outputs were averaged with equal weights: a part's weight is its share e^(lse − lse_new), "
        "not 1/2": ((o + o_j) / 2, None),
        "the weights are swapped: o gets e^(lse − lse_new), o_j gets e^(lse_j − lse_new)": (w_j * o + w * o_j, None),
        "the weights are not divided by the union's sum: use e^(lse − lse_new), not e^(lse − m)":
            (torch.exp(lse - m)[..., None] * o + torch.exp(lse_j - m)[..., None] * o_j, None),
        "lse_new has the wrong sign of the log: the log-sum-exp of the union is at least each part's, "
        "m + log(e^(lse − m) + e^(lse_j − m))": (None, m - torch.log(torch.exp(lse - m) + torch.exp(lse_j - m))),
        "lse_new is just the max: add log(e^(lse − m) + e^(lse_j − m))": (None, m),
        "lse_new is the old lse: return the union's log-sum-exp, the next step merges into it": (None, lse),
        "lse_new is lse + lse_j: log-sum-exps do not add, their exponentials do": (None, lse + lse_j),
    }


def _close(got, want, tol=1e-4) -> bool:
    return want is not None and rel_error(got, want) < tol


def _check_result(result, where: str):
    if not (isinstance(result, tuple) and len(result) == 2 and all(isinstance(t, torch.Tensor) for t in result)):
        raise ExerciseFailed(f"{where}: return a tuple (o_new, lse_new) of two tensors, got {type(result).__name__}")
    o_new, lse_new = result
    if tuple(o_new.shape) != SHAPE or tuple(lse_new.shape) != SHAPE[:-1]:
        raise ExerciseFailed(f"{where}: o_new must have shape {SHAPE} and lse_new {SHAPE[:-1]}; got "
                             f"{tuple(o_new.shape)} and {tuple(lse_new.shape)} (did you return (lse, o)?)")
    return o_new, lse_new


def _diagnose(o_new, lse_new, inputs, where: str) -> None:
    want_o, want_lse = _right(*inputs)
    if not (torch.isfinite(o_new).all() and torch.isfinite(lse_new).all()):
        raise ExerciseFailed(f"{where}: the result has inf or NaN. e^(lse) overflows float32 once lse passes 88 (and "
                             "scores of a few hundred are ordinary): subtract the max first, m = max(lse, lse_j), so "
                             "that every exponent is <= 0 (notebook 03's safe form)")
    lse_ok = rel_error(lse_new, want_lse) < 1e-5
    o_ok = rel_error(o_new, want_o) < TOLERANCE
    if lse_ok and o_ok:
        return
    mistakes = _mistakes(*inputs)
    for message, (_, model_lse) in mistakes.items():  # a wrong lse first: a wrong output may follow from it
        if not lse_ok and _close(lse_new, model_lse):
            raise ExerciseFailed(f"{where}: {message}")
    for message, (model_o, _) in mistakes.items():
        if not o_ok and _close(o_new, model_o):
            raise ExerciseFailed(f"{where}: {message}")
    if not lse_ok:
        raise ExerciseFailed(f"{where}: lse_new is off by {rel_error(lse_new, want_lse):.1e} (relative); it is the "
                             "log-sum-exp of the union, m + log(e^(lse − m) + e^(lse_j − m))")
    err = rel_error(o_new, want_o)
    if err < 1e-2:
        raise ExerciseFailed(f"{where}: o_new is off by {err:.1e} (relative), the size of float16 rounding: merge in "
                             "float32 (o_j.float()), not in the partial output's dtype")
    row = int(((o_new.double() - want_o).abs().amax(-1) > 1e-3).flatten().nonzero()[0])
    raise ExerciseFailed(f"{where}: o_new is off by {err:.1e} (relative), first in row {row} (flattened over B, H, L)")


@exercise("ring merge step")
def check_merge_step(fn):
    """``fn(o, lse, o_j, lse_j)`` → ``(o_new, lse_new)`` in float32 (see the module docstring)."""
    for seed, shift, where in ((0, 0.0, "moderate lse"), (1, 300.0, "lse around 300 (scores of a few hundred)"),
                               (2, -200.0, "lse around -200")):
        inputs = _inputs(seed, shift)
        o_new, lse_new = _check_result(call(fn, *(t.clone() for t in inputs)), where)
        if o_new.dtype != torch.float32 or lse_new.dtype != torch.float32:
            raise ExerciseFailed(f"{where}: o_new is {o_new.dtype} and lse_new {lse_new.dtype}; keep the running "
                                 "output and lse in float32 (o_j arrives in float16; the running output is rounded "
                                 "at every one of the W steps if it is kept in float16)")
        _diagnose(o_new, lse_new, inputs, where)
    # a ring of four steps: the partial results of four disjoint key shards, merged in turn, give the whole softmax
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen, dtype=torch.float64) for n in (6, 24, 24))
    scores = (q @ k.transpose(-1, -2)) * 4.0  # sharp: the shards' lse are far apart
    whole = torch.softmax(scores, -1) @ v
    o = lse = None
    for shard in range(4):
        s = scores[..., shard * 6:(shard + 1) * 6]
        o_j = (torch.softmax(s, -1) @ v[:, :, shard * 6:(shard + 1) * 6]).half()
        lse_j = torch.logsumexp(s, -1).float()
        if o is None:
            o, lse = o_j.float(), lse_j
        else:
            o, lse = call(fn, o, lse, o_j, lse_j)
    err = rel_error(o, whole)
    if err > 2e-3:  # float16 partials: about 3e-4
        raise ExerciseFailed(f"a ring of four steps merged with your function is off by {err:.1e} from the whole "
                             "softmax; each step must merge into the union of the keys so far (return its lse)")
    return f"a ring of four steps merged with your function gives the whole attention (relative error {err:.1e})"
