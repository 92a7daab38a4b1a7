"""flashattn.banks: the wavefront model on hand-worked cases and against an independent brute force,
the warp access patterns over the tile layouts, and the K tile of v2 against v2_kt."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from flashattn import bank_plots, banks, layouts

LANES = range(32)


# --- bank ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("address, expected", [(0, 0), (3, 0), (4, 1), (124, 31), (128, 0), (132, 1),
                                               (4 * 33, 1), (4096 + 8, 2)])
def test_bank(address, expected):
    assert banks.bank(address) == expected


@pytest.mark.parametrize("bad, error", [(-4, ValueError), (4.0, TypeError), (True, TypeError), ("4", TypeError)])
def test_bank_rejects(bad, error):
    with pytest.raises(error, match="byte_address"):
        banks.bank(bad)


# --- wavefronts: hand-worked cases ----------------------------------------------------------------


@pytest.mark.parametrize("addresses, access, expected", [
    # 4-byte: one phase of 32 lanes
    ([4 * i for i in LANES], 4, 1),              # consecutive floats: 32 banks, one word each
    ([256] * 32, 4, 1),                           # all lanes read one word: broadcast
    ([8 * i for i in LANES], 4, 2),               # stride 2 words: banks 0,2,..,30 hold 2 words each
    ([128 * i for i in LANES], 4, 32),            # column of a 32-float-wide row-major tile: all in bank 0
    ([128 * (i % 16) for i in LANES], 4, 16),     # lanes i and i+16 share a word: 16 distinct words in bank 0
    ([132 * i for i in LANES], 4, 1),             # the same column with rows padded by one word
    ([160 * i for i in LANES], 4, 8),             # +8 words of padding: rows 8 banks apart, 4 banks used
    ([4 * (i // 2) for i in LANES], 4, 1),        # pairs of lanes share words
    # 8-byte: lanes 0-15, then 16-31
    ([8 * i for i in LANES], 8, 2),               # 256 consecutive bytes: each phase covers the 32 banks once
    ([8 * (i % 16) for i in LANES], 8, 2),        # both phases read the same 128 bytes: still 2 phases
    ([256 * i for i in LANES], 8, 32),            # each phase: 16 distinct words in bank 0 (and in bank 1)
    ([0] * 32, 8, 2),                             # broadcast within each phase
    # 16-byte: four phases of 8 lanes
    ([16 * i for i in LANES], 16, 4),             # 512 consecutive bytes
    ([0] * 32, 16, 4),                            # one chunk for everyone, but four phases
    ([128 * i for i in LANES], 16, 32),           # each phase: 8 rows' chunk 0, all in banks 0-3
    ([144 * i for i in LANES], 16, 4),            # rows padded by 4 words (one chunk): conflict-free
    ([160 * i for i in LANES], 16, 8),            # +8 words: rows two chunks apart: 2-way in each phase
    ([16 * (i % 8) for i in LANES], 16, 4),       # every phase reads the same 128 bytes
])
def test_wavefronts_hand_worked(addresses, access, expected):
    assert banks.wavefronts(addresses, access) == expected
    assert banks.conflict_ways(addresses, access) == expected / banks.ideal_wavefronts(access)


def test_inactive_lanes():
    only_lane_0 = [0] + [None] * 31
    assert banks.wavefronts(only_lane_0) == 1
    assert banks.wavefronts(only_lane_0, 16) == 1  # three phases have no active lane: they cost nothing
    assert banks.analyze(only_lane_0, 16).ideal == 1
    half = [128 * i if i < 16 else None for i in LANES]
    assert banks.wavefronts(half) == 16
    assert banks.wavefronts(half, 8) == 16  # phase 1 is empty
    assert banks.conflict_ways(half, 8) == 16


def test_analyze_reports_phases():
    req = banks.analyze([128 * i for i in LANES], 16)
    assert len(req.phases) == 4 and req.ideal == 4 and req.wavefronts == 32
    assert [p.lanes for p in req.phases] == [tuple(range(s, s + 8)) for s in (0, 8, 16, 24)]
    first = req.phases[0]
    assert first.words_per_bank[:4] == (8, 8, 8, 8) and sum(first.words_per_bank) == 32
    assert first.worst_bank == 0 and first.wavefronts == 8
    assert "32 wavefronts (4 phases: 8 + 8 + 8 + 8), ideal 4: 8-way conflict" == req.describe()
    assert banks.analyze([4 * i for i in LANES]).describe() == "1 wavefront, ideal 1: conflict-free"


@pytest.mark.parametrize("access, lanes, ideal", [(4, 32, 1), (8, 16, 2), (16, 8, 4)])
def test_phase_sizes(access, lanes, ideal):
    assert banks.lanes_per_phase(access) == lanes
    assert banks.ideal_wavefronts(access) == ideal
    assert banks.words_per_access(access) == ideal


# --- wavefronts against an independent brute force ---------------------------------------------


def brute_force_wavefronts(addresses, access_bytes):
    """Byte by byte: each phase's 128-byte budget; a bank serves one distinct word per wavefront."""
    group = {4: 32, 8: 16, 16: 8}[access_bytes]
    total = 0
    for phase_start in range(0, 32, group):
        words_in_bank = [set() for _ in range(32)]
        active = False
        for lane in range(phase_start, phase_start + group):
            if addresses[lane] is None:
                continue
            active = True
            for byte in range(addresses[lane], addresses[lane] + access_bytes):
                words_in_bank[(byte >> 2) & 31].add(byte >> 2)
        if active:
            total += max(len(s) for s in words_in_bank)
    return total


@pytest.mark.parametrize("access", [4, 8, 16])
@pytest.mark.parametrize("span", [128, 1024, 65536])
def test_wavefronts_match_brute_force_on_random_requests(access, span):
    rng = random.Random(1000 * access + span)
    for _ in range(200):
        addresses = [rng.randrange(0, span // access) * access for _ in LANES]
        if rng.random() < 0.3:  # some inactive lanes
            for lane in rng.sample(range(32), rng.randrange(1, 31)):
                addresses[lane] = None
        assert banks.wavefronts(addresses, access) == brute_force_wavefronts(addresses, access), addresses


def test_wavefronts_bounds_on_random_requests():
    rng = random.Random(7)
    for access in (4, 8, 16):
        for _ in range(100):
            addresses = [rng.randrange(0, 4096 // access) * access for _ in LANES]
            w = banks.wavefronts(addresses, access)
            assert banks.ideal_wavefronts(access) <= w <= 32


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("addresses, access, error, match", [
    ([0] * 31, 4, ValueError, "exactly 32 lanes"),
    ([0] * 33, 4, ValueError, "exactly 32 lanes"),
    (7, 4, TypeError, "sequence"),
    ("0" * 32, 4, TypeError, "sequence"),
    ([0.0] * 32, 4, TypeError, "lane 0"),
    ([0] * 31 + [True], 4, TypeError, "lane 31"),
    ([0] * 31 + ["4"], 4, TypeError, "lane 31"),
    ([0] * 5 + [-4] + [0] * 26, 4, ValueError, "lane 5: byte address -4 is negative"),
    ([0, 2] + [0] * 30, 4, ValueError, "lane 1: byte address 2 is not aligned"),
    ([0, 4] + [0] * 30, 8, ValueError, "not aligned to the 8-byte"),
    ([0, 8] + [0] * 30, 16, ValueError, "not aligned to the 16-byte"),
    ([None] * 32, 4, ValueError, "no active lane"),
    ([0] * 32, 2, ValueError, "access_bytes must be 4, 8 or 16"),
    ([0] * 32, 32, ValueError, "access_bytes must be 4, 8 or 16"),
    ([0] * 32, 4.0, TypeError, "access_bytes"),
    ([0] * 32, True, TypeError, "access_bytes"),
])
def test_wavefronts_rejects(addresses, access, error, match):
    with pytest.raises(error, match=match):
        banks.wavefronts(addresses, access)


def test_wavefronts_accepts_arrays_and_tensors():
    column = [128 * i for i in LANES]
    assert banks.wavefronts(np.array(column)) == 32
    assert banks.wavefronts(torch.tensor(column)) == 32
    assert banks.wavefronts(tuple(column)) == 32
    assert banks.wavefronts(range(0, 128, 4)) == 1


# --- warp access patterns ------------------------------------------------------------------------


def test_column_reads():
    col = banks.column_read(layouts.row_major(64, 32), col=3)
    assert col.addresses == tuple(128 * i + 12 for i in LANES) and col.wavefronts == 32
    assert col.lane_elements[5] == ((5, 3),) and "lane i reads row i, column 3" in col.description
    assert banks.column_read(layouts.row_major(64, 32), 0, first_row=32).addresses[0] == 32 * 128
    assert banks.column_read(layouts.padded(64, 32, 4, 1)).addresses == tuple(132 * i for i in LANES)
    tr = banks.column_read(layouts.transposed(64, 32), col=1)
    assert tr.addresses == tuple(256 + 4 * i for i in LANES) and tr.wavefronts == 1


def test_vector_reads_follow_the_stored_lines():
    vec = banks.column_read(layouts.row_major(64, 32), col=4, access_bytes=16)
    assert vec.lane_elements[2] == ((2, 4), (2, 5), (2, 6), (2, 7)) and vec.addresses[2] == 256 + 16
    assert vec.wavefronts == 32 and vec.conflict_ways == 8
    tr = banks.column_read(layouts.transposed(64, 32), col=0, access_bytes=16)
    assert tr.lane_elements[1] == ((4, 0), (5, 0), (6, 0), (7, 0))
    assert tr.lane_elements[16] == ((0, 1), (1, 1), (2, 1), (3, 1))  # past row 63: the next column
    assert tr.wavefronts == 4
    half = banks.column_read(layouts.row_major(64, 64, element_bytes=2))
    assert half.access_bytes == 4 and half.lane_elements[0] == ((0, 0), (0, 1)) and half.wavefronts == 32


def test_reads_reject_impossible_patterns():
    with pytest.raises(ValueError, match="past the tile"):
        banks.column_read(layouts.row_major(16, 32))  # 32 lanes, 16 rows
    with pytest.raises(ValueError, match="not aligned"):
        banks.column_read(layouts.padded(64, 32, pad_words=1), access_bytes=16)
    with pytest.raises(ValueError, match="whole"):
        banks.column_read(layouts.row_major(64, 32, element_bytes=8), access_bytes=4)
    with pytest.raises(ValueError, match="access_bytes"):
        banks.column_read(layouts.row_major(64, 32), access_bytes=12)
    with pytest.raises(TypeError, match="col"):
        banks.column_read(layouts.row_major(64, 32), col=1.5)

    @dataclass(frozen=True)
    class Scattered(layouts.TileLayout):  # each element in its own 16-byte slot
        def byte_address(self, row, col):
            return 16 * (row * self.cols + col)

    with pytest.raises(ValueError, match="not contiguous"):
        banks.column_read(Scattered(64, 32), access_bytes=8)


@pytest.mark.parametrize("D, pad, access, ways", [
    (32, 0, 4, 32), (64, 0, 4, 32), (128, 0, 4, 32), (16, 0, 4, 16), (48, 0, 4, 16), (40, 0, 4, 8), (33, 0, 4, 1),
    (32, 1, 4, 1), (32, 32, 4, 32), (32, 33, 4, 1), (32, 8, 4, 8), (32, 2, 8, 1), (32, 0, 8, 16),
    (32, 0, 16, 8), (32, 4, 16, 1), (32, 8, 16, 2), (36, 0, 16, 1), (36, 4, 16, 2), (64, 4, 16, 1),
])
def test_column_read_ways(D, pad, access, ways):
    assert banks.column_read_ways(D, pad, access) == ways


def test_patterns_the_course_discusses():
    """Section 2-5 of notebook 06: which layout fixes a column read of a 64×D float32 K tile."""
    for D in (32, 64):
        results = {title: banks.column_read(layout).wavefronts for title, layout in bank_plots.comparison_layouts(D)}
        assert list(results.values()) == [32, 1, 32, 1, 4]  # row-major, +1, doubled, transposed, XOR (scalar)
        vec = {title: banks.column_read(layout, access_bytes=16).wavefronts
               for title, layout in bank_plots.comparison_layouts(D, access_bytes=16)}
        assert list(vec.values()) == [32, 4, 32, 4, 4]  # with 16-byte loads the XOR swizzle is conflict-free


# --- the K tile, v2 against v2_kt ----------------------------------------------------------------


def test_k_tile_simple_model():
    # D=32: every column read costs 32 wavefronts (v2) or 1 (v2_kt); two warps' worth of rows per column
    assert banks.k_tile_wavefronts(32, "v2") == 32 * 2 * 32
    assert banks.k_tile_wavefronts(32, "v2_kt") == 32 * 2 * 1
    assert banks.k_tile_wavefronts(32, "v2_kt_view") == banks.k_tile_wavefronts(32, "v2")
    assert banks.k_tile_wavefronts(32, "v2_padded") == 64 * 2 * 32  # twice the columns, same conflict
    assert banks.k_tile_wavefronts(64, "v2_kt", element_bytes=2) == 32 * 2  # 2 float16 per 4-byte load
    with pytest.raises(ValueError, match="unknown variant"):
        banks.k_tile_wavefronts(32, "v3")
    with pytest.raises(ValueError, match="block_n"):
        banks.k_tile_wavefronts(32, "v2", block_n=48)
