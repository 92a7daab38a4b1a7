"""Which rows and keys a tile of ``fast_gluon.py``'s forward covers (``masking_gluon.py`` decides when each of
these runs): the key blocks a tile sees (causal, a window, a key-padding mask's last kept key); with DOCS, the
packed document a tile belongs to; with KEY_MASK, where a program finds its batch's row of a key-padding mask, and
what it loads of it for each key block.

DOCS (packed documents, ``flash_attn_varlen_func``'s layout) makes each document a sequence of its own: a tile's
rows and keys are those of one document, found from a block table that lists (document, Q block) for each tile
(``masked.block_table``), so the loop, its masks and the store are the ones of a whole sequence of that length.

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
def _m_tiles(N, n_docs, ROWS: gl.constexpr, DOCS: gl.constexpr):
    """How many tiles of ROWS rows a head has: over the whole sequence, or with DOCS the block table's entries
    (``N // ROWS + n_docs``, as the host counts them in ``fast_options.document_blocks``: every document starts a
    tile; the entries past the last tile are marked -1)."""
    if DOCS:
        return N // ROWS + n_docs
    else:
        return gl.cdiv(N, ROWS)


@gluon.jit
def _document(CU, TABLE, tm, N, DOCS: gl.constexpr):
    """Tile ``tm`` of a head -> (its sequence's first row, the rows its loop sees, the rows it stores, its Q block in
    that sequence). Without DOCS, the whole sequence: (0, N, N, tm). With DOCS, entry ``tm`` of TABLE, (document
    d, block): the rows CU[d] .. CU[d + 1]. An entry past the last tile (d = -1) runs one key block of the first
    document and stores nothing, so that a program's producer and consumers still go through the same tiles."""
    if DOCS:
        doc = gl.load(TABLE + 2 * tm)
        valid = doc >= 0
        q0 = gl.load(CU + gl.maximum(doc, 0))
        n = gl.load(CU + gl.maximum(doc, 0) + 1) - q0
        return q0, gl.where(valid, n, 1), gl.where(valid, n, 0), gl.where(valid, gl.load(TABLE + 2 * tm + 1), 0)
    else:
        return 0, N, N, tm


@gluon.jit
def _key_blocks(m0, N, left, kv_end, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                WINDOW: gl.constexpr, KEY_MASK: gl.constexpr):
    """The key blocks rows ``m0 .. m0 + ROWS`` see, as (the first one's first key, how many): causal, up to the
    diagonal; with a WINDOW, from the block of the first row's first key (``m0 - left``); with a KEY_MASK, none past
    the batch's last kept key (``kv_end``), but at least one (the loop's first block is not conditional)."""
    if CAUSAL:
        end = gl.cdiv(gl.minimum(m0 + ROWS, N), BLOCK_N)
    else:
        end = gl.cdiv(N, BLOCK_N)
    if KEY_MASK:
        end = gl.maximum(gl.minimum(end, gl.cdiv(kv_end, BLOCK_N)), 1)
    if WINDOW:
        first = gl.maximum(m0 - left, 0) // BLOCK_N
    else:
        first = end * 0
    return first * BLOCK_N, end - first


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
