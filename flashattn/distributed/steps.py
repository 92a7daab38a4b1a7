"""One step of the ring on one rank (notebook 16): the course's kernels on a (query shard, key shard) pair, and
the merge of the step's partial output into the running one.

Each step's kernel returns its output *normalised over the keys it saw* and the log-sum-exp of its rows; two
such partial results of disjoint key sets merge exactly, as the states (m, ℓ) of notebook 03 do (here the
partial output o_j = acc_j / ℓ_j is already divided, and lse_j = m_j + log ℓ_j carries m and ℓ in one number):

    lse = m + log(e^(lse_a − m) + e^(lse_b − m)),  m = max(lse_a, lse_b)
    o   = e^(lse_a − lse) · o_a + e^(lse_b − lse) · o_b

Every exponent is <= 0, so nothing overflows however far apart the two lse are. :func:`merge_partial` does it in
float32 whatever the kernels' dtype (a float16 running output would round at every one of the W steps).

Two sets of kernels (:data:`KERNELS`):

* ``"fast"`` (the GPU default): ``attention_fast(..., return_lse=True)`` and ``attention_backward_fast``, which take
  L ≠ S and grouped K/V heads directly;
* ``"teaching"`` (the interpreter default): ``v2`` with ``return_lse=True`` and the teaching backward of notebook 12,
  which take one shape for q, k and v: grouped heads are repeated here (and their gradients summed back), and an
  L ≠ S step (the zigzag halves) is cut into square pairs whose partial outputs are merged by the same merge.

Both backwards take the *global* output and log-sum-exp of the whole ring's forward (not the step's own): then
P = exp(S − lse) is each step's share of the global softmax, delta = rowsum(dO ∘ O) the global one, and the step's
dQ, dK, dV are its exact shares of the gradients (they only need summing), as in FlashAttention's ring backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from flashattn import runtime
from flashattn.kernels.backward import attention_backward
from flashattn.kernels.fast import HEAD_DIMS as FAST_HEAD_DIMS
from flashattn.kernels.fast import attention_fast
from flashattn.kernels.fast_backward import MAX_HEAD_DIM, attention_backward_fast
from flashattn.kernels.v2 import attention_v2
from flashattn.validate import POW2_HEAD_DIMS


def merge_partial(o: torch.Tensor, lse: torch.Tensor, o_j: torch.Tensor, lse_j: torch.Tensor):
    """Merge a step's partial result (o_j, lse_j) into the running one (o, lse): (…, L, D) outputs and (…, L)
    log-sum-exps of two disjoint sets of keys. Returns the float32 (o, lse) of their union (see the module
    docstring). No lse may be -inf (every row of every step sees at least one key)."""
    o, lse, o_j, lse_j = o.float(), lse.float(), o_j.float(), lse_j.float()
    m = torch.maximum(lse, lse_j)
    lse_new = m + torch.log(torch.exp(lse - m) + torch.exp(lse_j - m))
    o_new = torch.exp(lse - lse_new)[..., None] * o + torch.exp(lse_j - lse_new)[..., None] * o_j
    return o_new, lse_new


class StepKernels(NamedTuple):
    """``forward(q, k, v, *, causal, scale) -> (o, lse)`` and ``backward(q, k, v, o, lse, do, *, causal, scale)
    -> (dq, dk, dv)`` for q (B, Hq, L, D), k and v (B, Hkv, S, D); the head dimensions they take."""

    name: str
    forward: Callable
    backward: Callable
    head_dims: object


def _fast_forward(q, k, v, *, causal, scale):
    return attention_fast(q, k, v, causal=causal, scale=scale, return_lse=True)


def _fast_backward(q, k, v, o, lse, do, *, causal, scale):
    return attention_backward_fast(q, k, v, o, lse, do, causal=causal, scale=scale)


def _repeat_heads(t: torch.Tensor, group: int) -> torch.Tensor:
    """K/V heads repeated for grouped-query attention: query head h reads K/V head h // group."""
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def _square_pairs(L: int, S: int, causal: bool) -> tuple[int, int, int]:
    """(side, query pieces, key pieces): an L × S step cut into square pairs of ``side`` rows."""
    side = min(L, S)
    if L == S:
        return side, 1, 1
    if causal or max(L, S) % side:
        raise ValueError(f"teaching kernels: an L={L} × S={S}{' causal' if causal else ''} step cannot be cut into "
                         "squares; the ring only makes square causal steps and halves of a zigzag shard")
    return side, L // side, S // side


def _teaching_forward(q, k, v, *, causal, scale):
    group = q.shape[1] // k.shape[1]
    k, v = _repeat_heads(k, group), _repeat_heads(v, group)
    side, nq, nk = _square_pairs(q.shape[2], k.shape[2], causal)
    outs, lses = [], []
    for i in range(nq):
        qi = q[:, :, i * side:(i + 1) * side]
        o = lse = None
        for j in range(nk):
            kj, vj = (t[:, :, j * side:(j + 1) * side] for t in (k, v))
            o_j, lse_j = attention_v2(qi, kj, vj, causal=causal, scale=scale, return_lse=True)
            o, lse = (o_j, lse_j) if o is None else merge_partial(o, lse, o_j, lse_j)
        outs.append(o.to(q.dtype))
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def _teaching_backward(q, k, v, o, lse, do, *, causal, scale):
    B, Hkv, S, D = k.shape
    group = q.shape[1] // Hkv
    k, v = _repeat_heads(k, group), _repeat_heads(v, group)
    side, nq, nk = _square_pairs(q.shape[2], S, causal)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk, dv = (torch.zeros(k.shape, dtype=torch.float32, device=q.device) for _ in range(2))
    for i in range(nq):
        rows = slice(i * side, (i + 1) * side)
        for j in range(nk):
            cols = slice(j * side, (j + 1) * side)
            dq_ij, dk_ij, dv_ij = attention_backward(q[:, :, rows], k[:, :, cols], v[:, :, cols], o[:, :, rows],
                                                     lse[:, :, rows], do[:, :, rows], causal=causal, scale=scale)
            dq[:, :, rows] += dq_ij
            dk[:, :, cols] += dk_ij
            dv[:, :, cols] += dv_ij
    if group > 1:  # a K/V head's gradient sums over the query heads that read it
        dk, dv = (t.view(B, Hkv, group, S, D).sum(2) for t in (dk, dv))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


KERNELS = {
    "fast": StepKernels("fast", _fast_forward, _fast_backward,
                        range(1, min(FAST_HEAD_DIMS.stop - 1, MAX_HEAD_DIM) + 1)),
    "teaching": StepKernels("teaching", _teaching_forward, _teaching_backward, POW2_HEAD_DIMS),
}


def default_kernels() -> str:
    """``"fast"`` on a GPU, ``"teaching"`` in the interpreter (the kernels of notebooks 05 and 12)."""
    return "fast" if runtime.MODE == "gpu" else "teaching"


def get(name) -> StepKernels:
    """The kernels named ``name`` (None: :func:`default_kernels`); a :class:`StepKernels` is returned as it is."""
    if isinstance(name, StepKernels):
        return name
    name = default_kernels() if name is None else name
    if name not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(map(repr, KERNELS))} (or None: the mode's default), "
                         f"got {name!r}")
    return KERNELS[name]
