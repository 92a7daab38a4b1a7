"""flashattn.kernels.mask_blocks (notebook 14): the tile kinds of a mask against a tile-by-tile brute force, the
windows' rule from the tiles' corners against the dense window mask, the block tables, and FlexAttention's own
BlockMask of the same masks (built on the CPU)."""

import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from flashattn.kernels import mask_blocks as mb


def brute_force(mask: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """Tile by tile, as the module docstring defines the kinds."""
    L, S = mask.shape
    kinds = torch.zeros(math.ceil(L / block_m), math.ceil(S / block_n), dtype=torch.int8)
    for a in range(kinds.shape[0]):
        for b in range(kinds.shape[1]):
            tile = mask[a * block_m:(a + 1) * block_m, b * block_n:(b + 1) * block_n]
            takes, free = (tile, tile) if tile.dtype == torch.bool else (tile != float("-inf"), tile == 0)
            inside = (a + 1) * block_m <= L and (b + 1) * block_n <= S
            kinds[a, b] = mb.FULL if inside and free.all() else mb.PARTIAL if takes.any() else mb.SKIPPED
    return kinds


SIDES = st.sampled_from([-1, 0, 1, 3, 10, 40])
BLOCKS = st.sampled_from([4, 8, 16])


@given(L=st.integers(1, 60), S=st.integers(1, 60), left=SIDES, right=SIDES, causal=st.booleans(), bm=BLOCKS,
       bn=BLOCKS, shift=st.integers(-20, 20))
def test_window_kinds_from_the_corners_are_the_dense_masks(L, S, left, right, causal, bm, bn, shift):
    right = min(right, 0) if causal else right
    mask = mb.window_mask(L, S, (left, right), causal, offset=shift)
    kinds = mb.window_kinds(L, S, bm, bn, (left, right), causal, offset=shift)
    assert torch.equal(kinds, brute_force(mask, bm, bn))
    assert torch.equal(mb.classify(mask, bm, bn), kinds)


@given(L=st.integers(1, 50), S=st.integers(1, 50), bm=BLOCKS, bn=BLOCKS, seed=st.integers(0, 2**16),
       density=st.sampled_from([0.0, 0.3, 0.9, 1.0]))
@example(L=46, S=41, bm=4, bn=16, seed=0, density=1.0)  # full tiles: of the mask, above the diagonal
def test_classify_boolean_float_and_broadcast_masks(L, S, bm, bn, seed, density):
    gen = torch.Generator().manual_seed(seed)
    takes = torch.rand(L, S, generator=gen) < density
    assert torch.equal(mb.classify(takes, bm, bn), brute_force(takes, bm, bn))
    values = torch.where(torch.rand(L, S, generator=gen) < 0.5, torch.randn(L, S, generator=gen), 0.0)
    values = values.masked_fill(~takes, float("-inf"))
    assert torch.equal(mb.classify(values, bm, bn), brute_force(values, bm, bn))
    for shape in ((1, S), (L, 1)):  # a key-padding mask, a query mask: length 1 where it broadcasts
        small = torch.rand(shape, generator=gen) < density
        assert torch.equal(mb.classify(small, bm, bn, shape=(L, S)), brute_force(small.expand(L, S), bm, bn))
    kinds = mb.classify(takes, bm, bn, causal=True)  # combined tile by tile: never skips what the two keep
    exact = brute_force(takes & mb.window_mask(L, S, causal=True), bm, bn)
    assert ((kinds == exact) | ((kinds == mb.PARTIAL) & (exact == mb.SKIPPED))).all()


def test_leading_dimensions_are_kept_as_they_are():
    mask = mb.padding_mask([3, 40], 40)  # (2, 1, 1, 40)
    kinds = mb.classify(mask, 16, 16, shape=(40, 40))
    assert kinds.shape == (2, 1, 3, 3)
    assert kinds[0, 0].tolist() == [[mb.PARTIAL, mb.SKIPPED, mb.SKIPPED]] * 3
    assert kinds[1, 0].tolist() == [[mb.FULL, mb.FULL, mb.PARTIAL]] * 2 + [[mb.PARTIAL] * 3]
    with pytest.raises(ValueError, match="does not broadcast"):
        mb.classify(torch.ones(5, 7, dtype=torch.bool), 4, 4, shape=(5, 8))


def test_block_tables_list_each_kind_in_order():
    kinds = mb.window_kinds(100, 90, 16, 16, (20, 5))
    t = mb.block_tables(kinds, 16, 16)
    for m in range(kinds.shape[0]):
        partial = t.kv_indices[m, :t.kv_num_blocks[m]].tolist()
        full = t.full_kv_indices[m, :t.full_kv_num_blocks[m]].tolist()
        assert partial == [n for n in range(kinds.shape[1]) if kinds[m, n] == mb.PARTIAL]
        assert full == [n for n in range(kinds.shape[1]) if kinds[m, n] == mb.FULL]
    for n in range(kinds.shape[1]):
        assert t.q_indices[n, :t.q_num_blocks[n]].tolist() == [m for m in range(kinds.shape[0])
                                                                if kinds[m, n] == mb.PARTIAL]
    assert torch.equal(mb.counts(kinds), torch.stack([t.full_kv_num_blocks, t.kv_num_blocks], -1))
    assert mb.summary(kinds)["computed"] == int((t.kv_num_blocks + t.full_kv_num_blocks).sum())


def test_documents_and_padding():
    mask = mb.document_mask([2, 3], [3, 1], causal=True)  # bottom-right in each document
    assert mask.tolist() == [[True, True, False, False], [True, True, True, False],
                             [False, False, False, False], [False, False, False, False], [False, False, False, True]]
    assert mb.cu_seqlens([2, 3]).tolist() == [0, 2, 5] and mb.cu_seqlens([2, 3]).dtype == torch.int32
    assert mb.document_ids([2, 1]).tolist() == [0, 0, 1]
    assert mb.padding_mask([1, 2], 3)[:, 0, 0].tolist() == [[True, False, False], [True, True, False]]
    with pytest.raises(ValueError, match="as many key documents"):
        mb.document_mask([2, 3], [3])


def test_window_arguments_are_checked():
    assert mb.normalize_window((5, -1), causal=True) == (5, 0)
    assert mb.normalize_window([-1, 3], causal=False) == (-1, 3)
    with pytest.raises(ValueError, match="right side is 0"):
        mb.normalize_window((5, 2), causal=True)
    with pytest.raises(ValueError, match=">= -1"):
        mb.normalize_window((5, -3), causal=False)
    with pytest.raises(TypeError, match="pair of ints"):
        mb.normalize_window((5.0, 1), causal=False)


@pytest.mark.parametrize("name", ["sliding window", "documents"])
def test_flexattentions_block_mask_has_the_same_tiles(name):
    """FlexAttention's create_block_mask, on the CPU, lists the same partial and full key blocks per Q block."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    N, block = 300, 64
    if name == "sliding window":
        def mask_mod(b, h, q, kv):
            return (q >= kv) & (q - kv < 100)
        dense = mb.window_mask(N, N, (99, 0), causal=True)
    else:
        doc = mb.document_ids([70, 1, 150, 79])

        def mask_mod(b, h, q, kv):
            return (doc[q] == doc[kv]) & (q >= kv)
        dense = mb.document_mask([70, 1, 150, 79], causal=True)
    theirs = flex.create_block_mask(mask_mod, None, None, N, N, device="cpu", BLOCK_SIZE=block)
    ours = mb.block_tables(mb.classify(dense, block, block), block, block)
    assert torch.equal(theirs.kv_num_blocks[0, 0], ours.kv_num_blocks)
    assert torch.equal(theirs.full_kv_num_blocks[0, 0], ours.full_kv_num_blocks)
    for m, (p, f) in enumerate(zip(ours.kv_num_blocks.tolist(), ours.full_kv_num_blocks.tolist(), strict=True)):
        assert sorted(theirs.kv_indices[0, 0, m, :p].tolist()) == ours.kv_indices[m, :p].tolist()
        assert sorted(theirs.full_kv_indices[0, 0, m, :f].tolist()) == ours.full_kv_indices[m, :f].tolist()
