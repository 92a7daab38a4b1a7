"""The key-padding mask of ``fast_gluon.py``'s forward (its KEY_MASK; ``masking_gluon.py`` decides when it runs):
where a program finds its batch's row of the mask, and what it loads of it for each key block.

KEY_MASK 1 loads every block's mask bytes (one per key) and masks the scores with them. KEY_MASK 2 first loads
one flag per block, which the host computed (``masking_gluon.key_mask_blocks``): 1 where some key of the block is
dropped. Only such a partial block loads its bytes; a full block runs as it would without a mask. A padding mask
leaves one partial block per sequence, where its padding starts; the loop ends at the sequence's last real key.
"""

from __future__ import annotations

from . import triton_compat

if not triton_compat.HAS_GLUON:
    raise ImportError(f"Triton's Gluon is incomplete here: {triton_compat.MISSING}")

from .triton_compat import gl, gluon  # noqa: E402


@gluon.jit
def _key_mask(KMASK, KV_END, stride_kmb, stride_kmn, bh, H, N, BLOCK_N: gl.constexpr, KEY_MASK: gl.constexpr):
    """Head ``bh``'s batch's key-padding mask: (its row of the mask, the mask's key stride, its block flags) and the
    end of its last kept key (``masking.py`` computes them); without KEY_MASK, (unused, N). KV_END's row b: with
    KEY_MASK 1 that end; with 2 the end, then a flag per key block of BLOCK_N keys, 1 where the block is partial."""
    if KEY_MASK:
        b = (bh // H).to(gl.int64)
        ends = KV_END + b * (1 + gl.cdiv(N, BLOCK_N)) if KEY_MASK == 2 else KV_END + b
        return (KMASK + b * stride_kmb, stride_kmn, ends + 1), gl.load(ends)
    else:
        return (KMASK, stride_kmn, KV_END), N


@gluon.jit
def _kept_keys(kmask, start_n, N, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """A key-padding mask's entries for keys ``start_n ..`` (``kmask``: :func:`_key_mask`'s), as booleans in the
    layout of a row of scores. KEY_MASK 1 loads them before the block's scores are waited for, so that the load's
    latency hides behind the product; KEY_MASK 2, in a partial block only, after."""
    row, stride, _ = kmask
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    return gl.load(row + offs_n.to(gl.int64) * stride, mask=offs_n < N, other=0) != 0


@gluon.jit
def _block_kind(kmask, start_n, N, BLOCK_N: gl.constexpr, KEY_MASK: gl.constexpr, s_layout: gl.constexpr):
    """What ``_softmax`` takes of a key-padding mask for keys ``start_n ..``, loaded before the block's scores are
    waited for: KEY_MASK 1, their entries (:func:`_kept_keys`); 2, whether the host found the block partial."""
    if KEY_MASK == 2:
        _, _, flags = kmask
        return gl.load(flags + start_n // BLOCK_N) != 0, kmask
    elif KEY_MASK == 1:
        return _kept_keys(kmask, start_n, N, BLOCK_N, s_layout)
    else:
        return 0
