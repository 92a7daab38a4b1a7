"""The float64 reference every kernel is checked against."""

from __future__ import annotations

import torch

from .validate import check_causal, check_scale, check_shapes


def reference(q, k, v, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(scale · Q·Kᵀ [+ causal mask]) · V computed in float64, returned in q.dtype on q.device.

    q, k, v have shape (B, H, N, D), as for ``torch.nn.functional.scaled_dot_product_attention``.
    ``scale`` defaults to 1/sqrt(D). The causal mask lets query i see keys j <= i.
    """
    _, _, N, D = check_shapes(q, k, v)
    causal = check_causal(causal)
    scale = check_scale(scale, D)
    q64, k64, v64 = (t.to(torch.float64) for t in (q, k, v))
    s = (q64 @ k64.transpose(-1, -2)) * scale
    if causal:
        future = torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return (p @ v64).to(q.dtype)
