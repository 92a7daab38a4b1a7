"""Softmax three ways, and attention streamed over key chunks: plain PyTorch references.

Everything works along the last dimension, on any leading shape, in the input's dtype (use float64
to see that the online forms are exact up to rounding).

* ``naive_softmax``   exp(x) / Σ exp(x): overflows as soon as a logit passes log(dtype max)
* ``safe_softmax``    subtract the row max first: three passes (max, sum, normalize)
* ``online_softmax``  max and sum in one pass over chunks, merged with ``merge``; then normalize
* ``online_attention`` softmax(q·kᵀ·scale)·v, streaming over key chunks with the state (m, l, acc),
  in the FlashAttention-1 form (normalize every step) or the FlashAttention-2 form (divide once)

The running state of a row is ``m`` (the largest logit seen) and ``l`` (Σ e^(x - m) over the logits
seen). An empty chunk, or one whose logits are all -inf (masked), has the state (m, l) = (-inf, 0).
"""

# ruff: noqa: E741  (l is the running sum, as in the FlashAttention papers and the kernels' li)

from __future__ import annotations

import math

import torch

FORMS = ("fa1", "fa2")


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """exp(x) / Σ exp(x) along the last dim, exactly as written: inf/inf = NaN once exp overflows."""
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def safe_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax with the row max subtracted first: pass 1 max, pass 2 sum, pass 3 normalize."""
    m = x.amax(dim=-1, keepdim=True)  # pass 1
    l = torch.exp(x - m).sum(dim=-1, keepdim=True)  # pass 2
    return torch.exp(x - m) / l  # pass 3


def _exponent_offset(m: torch.Tensor) -> torch.Tensor:
    """m where finite, 0 where m is -inf, so exp(x - offset) never computes exp(-inf - -inf) = NaN."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def chunk_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, l) of one chunk along the last dim: its max, and Σ e^(x - m). All -inf or empty: (-inf, 0)."""
    if x.shape[-1] == 0:
        m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
        return m, torch.zeros_like(m)
    m = x.amax(dim=-1)
    l = torch.exp(x - _exponent_offset(m)[..., None]).sum(dim=-1)
    return m, l


def merge(m1: torch.Tensor, l1: torch.Tensor, m2: torch.Tensor, l2: torch.Tensor):
    """Combine the states of two disjoint parts of a row: returns (m, l) of their union.

        m = max(m1, m2),   l = e^(m1 - m)·l1 + e^(m2 - m)·l2

    Exact (an identity, not an approximation), associative and commutative. Two empty parts
    (m1 = m2 = -inf) give (-inf, 0), not NaN.
    """
    m = torch.maximum(m1, m2)
    offset = _exponent_offset(m)
    return m, torch.exp(m1 - offset) * l1 + torch.exp(m2 - offset) * l2


def _chunks(n: int, chunk: int):
    if int(chunk) != chunk or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    return [(start, min(start + chunk, n)) for start in range(0, n, int(chunk))]


def running_stats(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The state (m, l) after each chunk: two tensors of shape (..., number of chunks).

    One pass over x; the last column is the state of the whole row (the tail chunk may be short).
    """
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    l = torch.zeros_like(m)
    ms, ls = [], []
    for start, stop in _chunks(x.shape[-1], chunk):
        m, l = merge(m, l, *chunk_stats(x[..., start:stop]))
        ms.append(m)
        ls.append(l)
    return torch.stack(ms, dim=-1), torch.stack(ls, dim=-1)


def online_stats(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, l) of the whole row, computed in one pass over chunks of ``chunk`` logits."""
    m, l = running_stats(x, chunk)
    return m[..., -1], l[..., -1]


def online_softmax(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """Softmax along the last dim: one pass over chunks for (m, l), one pass to normalize.

    Equals torch.softmax(x, -1) up to rounding for any chunk size, including ones that do not
    divide the row length.
    """
    m, l = online_stats(x, chunk)
    return torch.exp(x - _exponent_offset(m)[..., None]) / l[..., None]


def online_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int, *,
                     scale: float | None = None, form: str = "fa2") -> torch.Tensor:
    """softmax(scale · q·kᵀ)·v streamed over chunks of keys, never holding a full row of P.

    q is (..., M, D), k and v are (..., N, D); ``scale`` defaults to 1/sqrt(D). Each query row
    carries m (running max), l (running sum) and an output accumulator of D numbers.

    * ``form="fa1"``: FlashAttention-1 update. Each chunk's scores are exponentiated against the
      chunk's own max m_j; the old and new parts are rescaled by alpha = e^(m - m_new) and
      beta = e^(m_j - m_new); the output is kept normalized, so it is divided by l_new every step.
    * ``form="fa2"``: FlashAttention-2 update. Scores are exponentiated against m_new directly
      (one exp per score, no beta); the unnormalized accumulator is rescaled by alpha; one division
      by l at the end.

    Computed in q's dtype (float16/bfloat16 are promoted to float32), returned in q's dtype.
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if q.shape[-1] != k.shape[-1] or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    work = torch.promote_types(q.dtype, torch.float32)
    q_, k_, v_ = (t.to(work) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale

    rows = q_.shape[:-1]
    m = torch.full(rows, float("-inf"), dtype=work, device=q.device)
    l = torch.zeros(rows, dtype=work, device=q.device)
    acc = torch.zeros(*rows, v.shape[-1], dtype=work, device=q.device)  # fa1: the normalized output

    for start, stop in _chunks(k.shape[-2], chunk):
        s = (q_ @ k_[..., start:stop, :].transpose(-1, -2)) * scale  # (..., M, chunk): never more
        vj = v_[..., start:stop, :]
        if form == "fa1":
            mj, lj = chunk_stats(s)
            pj = torch.exp(s - mj[..., None])
            m_new = torch.maximum(m, mj)
            alpha, beta = torch.exp(m - m_new), torch.exp(mj - m_new)
            l_new = alpha * l + beta * lj
            acc = (alpha[..., None] * l[..., None] * acc + beta[..., None] * (pj @ vj)) / l_new[..., None]
        else:
            m_new = torch.maximum(m, s.amax(dim=-1))
            pj = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l_new = alpha * l + pj.sum(dim=-1)
            acc = alpha[..., None] * acc + pj @ vj
        m, l = m_new, l_new

    out = acc if form == "fa1" else acc / l[..., None]
    return out.to(q.dtype)
