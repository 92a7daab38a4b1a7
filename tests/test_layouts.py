"""flashattn.layouts: where each element of a tile lives in shared memory."""

from __future__ import annotations

import pytest

from flashattn import layouts
from flashattn.kernels import v2 as v2_module

# --- layouts -------------------------------------------------------------------------------------


def test_row_major_padded_doubled_transposed_addresses():
    rm = layouts.row_major(64, 32)
    assert rm.byte_address(0, 0) == 0 and rm.byte_address(1, 0) == 128 and rm.byte_address(2, 5) == 276
    assert rm.size_bytes == 64 * 32 * 4 and rm.padding == 0
    pd = layouts.padded(64, 32, pad_words=1)
    assert pd.line_stride == 33 and pd.byte_address(3, 2) == (3 * 33 + 2) * 4 and pd.size_bytes == 64 * 33 * 4
    half = layouts.padded(64, 64, element_bytes=2, pad_words=1)  # one word = two float16 elements
    assert half.line_stride == 66 and half.byte_address(1, 0) == 132
    db = layouts.doubled(64, 32)
    assert db.line_stride == v2_module.compute_padded_headdim(32) == 64 and db.byte_address(1, 0) == 256
    assert layouts.doubled(64, 40).line_stride == 64  # not a power of two: rounded up
    tr = layouts.transposed(64, 32)
    assert tr.byte_address(0, 0) == 0 and tr.byte_address(1, 0) == 4 and tr.byte_address(0, 1) == 256
    assert layouts.transposed(64, 32, pad_words=1).byte_address(0, 1) == 65 * 4
    assert "+1 word)" in pd.describe() and "+32 words" in db.describe() or "doubling" in db.describe()


def test_xor_swizzle_addresses_and_bijection():
    sw = layouts.xor_swizzled(64, 32, period=8)
    # row 1: chunk j goes to j XOR 1; element 0 (chunk 0) -> chunk 1, element 4 (chunk 1) -> chunk 0
    assert sw.byte_address(1, 0) == 128 + 16 and sw.byte_address(1, 4) == 128 and sw.byte_address(1, 1) == 148
    assert sw.byte_address(9, 0) == 9 * 128 + 16  # period 8: row 9 behaves like row 1
    assert sw.byte_address(0, 7) == 28  # row 0 unchanged
    slow = layouts.xor_swizzled(64, 32, period=8, per_phase=2)
    assert slow.byte_address(1, 0) == 128 and slow.byte_address(2, 0) == 256 + 16
    padded_swizzle = layouts.xor_swizzled(8, 64, period=8, pad_words=4)
    for layout in (sw, slow, layouts.xor_swizzled(16, 64, 2, period=4), padded_swizzle):
        addresses = {layout.byte_address(r, c) for r in range(layout.rows) for c in range(layout.cols)}
        assert len(addresses) == layout.rows * layout.cols  # a permutation within each row
        assert max(addresses) < layout.size_bytes


@pytest.mark.parametrize("build, error, match", [
    (lambda: layouts.TileLayout(0, 32), ValueError, "rows"),
    (lambda: layouts.TileLayout(8, 32, element_bytes=3), ValueError, "element_bytes"),
    (lambda: layouts.TileLayout(8, 32, order="diag"), ValueError, "order"),
    (lambda: layouts.TileLayout(8, 32, line_stride=31), ValueError, "shorter than a line"),
    (lambda: layouts.TileLayout(8, 32.0), TypeError, "cols"),
    (lambda: layouts.xor_swizzled(8, 32, period=3), ValueError, "power of two"),
    (lambda: layouts.xor_swizzled(8, 16, period=8), ValueError, "multiple of 8 16-byte chunks"),
    (lambda: layouts.row_major(8, 32, 8, pad_words=1), ValueError, "whole number"),
    (lambda: layouts.row_major(8, 32, pad_words=-1), ValueError, "pad_words"),
    (lambda: layouts.row_major(8, 32).byte_address(8, 0), ValueError, "outside"),
])
def test_layout_rejects(build, error, match):
    with pytest.raises(error, match=match):
        build()
