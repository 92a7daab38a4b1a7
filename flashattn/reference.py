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


def reference_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, block_table=None, causal=True,
                           softmax_scale=None) -> torch.Tensor:
    """``flashattn.attention_with_kvcache`` computed in float64, sequence by sequence: returned in q.dtype.

    q (B, Lq, Hq, D); k_cache, v_cache (B, S_max, Hkv, D), or paged (num_pages, page_size, Hkv, D) with block_table
    (B, max_pages) naming each sequence's pages in order; cache_seqlens (B,) or an int: the valid keys of each
    sequence, the new ones included. With ``causal``, query i sees keys j < cache_seqlens − Lq + i + 1 (bottom
    right). Query head h reads key/value head h // (Hq / Hkv). Reads the lengths and the block table on the host.
    """
    B, Lq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    scale = check_scale(softmax_scale, D)
    lens = [cache_seqlens] * B if isinstance(cache_seqlens, int) else [int(n) for n in cache_seqlens.tolist()]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for b, n in enumerate(lens):
        if block_table is None:
            k, v = k_cache[b, :n], v_cache[b, :n]
        else:
            page_size = k_cache.shape[1]
            pages = block_table[b, : -(-n // page_size)].long()
            k, v = (c[pages].reshape(-1, Hkv, D)[:n] for c in (k_cache, v_cache))
        k, v = (t.double().transpose(0, 1).repeat_interleave(Hq // Hkv, dim=0) for t in (k, v))  # (Hq, n, D)
        s = q[b].double().transpose(0, 1) @ k.transpose(-1, -2) * scale  # (Hq, Lq, n)
        if causal:
            limit = n - Lq + 1 + torch.arange(Lq, device=q.device)  # query i sees keys j < limit[i]
            hidden = torch.arange(n, device=q.device)[None, :] >= limit[:, None]
            s = s.masked_fill(hidden, float("-inf"))
        out[b] = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).to(q.dtype)
    return out
