"""The float64 reference every kernel is checked against."""

from __future__ import annotations

import torch

from flashattn.validate import check_causal, check_scale, check_shapes


def reference(q, k, v, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(scale · Q·Kᵀ [+ causal mask]) · V computed in float64, returned in q.dtype on q.device.

    q, k, v have shape (B, H, N, D), as for ``torch.nn.functional.scaled_dot_product_attention``.
    ``scale`` defaults to 1/sqrt(D). The causal mask lets query i see keys j <= i.
    """
    _, _, N, D = check_shapes(q, k, v)
    causal = check_causal(causal)
    scale = check_scale(scale, D)
    B, H = q.shape[:2]
    # float64 scores are N×N per head: go through the heads in groups so that a group's scores stay
    # near 256 MB (a full-size problem at once would need tens of GB on the GPU)
    heads_per_group = max(1, (256 << 20) // (8 * N * N))
    mask = torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1) if causal else None
    q, k, v = (t.reshape(B * H, N, D) for t in (q, k, v))
    out = torch.empty((B * H, N, D), dtype=q.dtype, device=q.device)
    for start in range(0, B * H, heads_per_group):
        group = slice(start, start + heads_per_group)
        s = (q[group].double() @ k[group].double().transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(mask, float("-inf"))
        out[group] = (torch.softmax(s, dim=-1) @ v[group].double()).to(q.dtype)
    return out.reshape(B, H, N, D)


def rel_error(out, ref) -> float:
    """``‖out − ref‖ / ‖ref‖`` in float64: how every kernel, test and exercise check is compared with the
    reference. ``inf`` when ``out`` has NaN or inf, or a shape other than ``ref``'s."""
    out, ref = torch.as_tensor(out), torch.as_tensor(ref)
    if out.shape != ref.shape or not torch.isfinite(out).all():
        return float("inf")
    ref64 = ref.to(torch.float64)
    return ((out.to(device=ref.device, dtype=torch.float64) - ref64).norm() / ref64.norm().clamp_min(1e-300)).item()
