"""flashattn.banks: the wavefront model on hand-worked cases and against an independent brute force,
the tile layouts and warp access patterns, the FMA-path model, the recorded-data helpers, the pictures."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from flashattn import banks, runtime
from flashattn.kernels import v2 as v2_module

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


# --- layouts -------------------------------------------------------------------------------------


def test_row_major_padded_doubled_transposed_addresses():
    rm = banks.row_major(64, 32)
    assert rm.byte_address(0, 0) == 0 and rm.byte_address(1, 0) == 128 and rm.byte_address(2, 5) == 276
    assert rm.size_bytes == 64 * 32 * 4 and rm.padding == 0
    pd = banks.padded(64, 32, pad_words=1)
    assert pd.line_stride == 33 and pd.byte_address(3, 2) == (3 * 33 + 2) * 4 and pd.size_bytes == 64 * 33 * 4
    half = banks.padded(64, 64, element_bytes=2, pad_words=1)  # one word = two float16 elements
    assert half.line_stride == 66 and half.byte_address(1, 0) == 132
    db = banks.doubled(64, 32)
    assert db.line_stride == v2_module.compute_padded_headdim(32) == 64 and db.byte_address(1, 0) == 256
    assert banks.doubled(64, 40).line_stride == 64  # not a power of two: rounded up
    tr = banks.transposed(64, 32)
    assert tr.byte_address(0, 0) == 0 and tr.byte_address(1, 0) == 4 and tr.byte_address(0, 1) == 256
    assert banks.transposed(64, 32, pad_words=1).byte_address(0, 1) == 65 * 4
    assert "+1 word)" in pd.describe() and "+32 words" in db.describe() or "doubling" in db.describe()


def test_xor_swizzle_addresses_and_bijection():
    sw = banks.xor_swizzled(64, 32, period=8)
    # row 1: chunk j goes to j XOR 1; element 0 (chunk 0) -> chunk 1, element 4 (chunk 1) -> chunk 0
    assert sw.byte_address(1, 0) == 128 + 16 and sw.byte_address(1, 4) == 128 and sw.byte_address(1, 1) == 148
    assert sw.byte_address(9, 0) == 9 * 128 + 16  # period 8: row 9 behaves like row 1
    assert sw.byte_address(0, 7) == 28  # row 0 unchanged
    slow = banks.xor_swizzled(64, 32, period=8, per_phase=2)
    assert slow.byte_address(1, 0) == 128 and slow.byte_address(2, 0) == 256 + 16
    for layout in (sw, slow, banks.xor_swizzled(16, 64, 2, period=4), banks.xor_swizzled(8, 64, period=8, pad_words=4)):
        addresses = {layout.byte_address(r, c) for r in range(layout.rows) for c in range(layout.cols)}
        assert len(addresses) == layout.rows * layout.cols  # a permutation within each row
        assert max(addresses) < layout.size_bytes


@pytest.mark.parametrize("build, error, match", [
    (lambda: banks.TileLayout(0, 32), ValueError, "rows"),
    (lambda: banks.TileLayout(8, 32, element_bytes=3), ValueError, "element_bytes"),
    (lambda: banks.TileLayout(8, 32, order="diag"), ValueError, "order"),
    (lambda: banks.TileLayout(8, 32, line_stride=31), ValueError, "shorter than a line"),
    (lambda: banks.TileLayout(8, 32.0), TypeError, "cols"),
    (lambda: banks.xor_swizzled(8, 32, period=3), ValueError, "power of two"),
    (lambda: banks.xor_swizzled(8, 16, period=8), ValueError, "multiple of 8 16-byte chunks"),
    (lambda: banks.row_major(8, 32, 8, pad_words=1), ValueError, "whole number"),
    (lambda: banks.row_major(8, 32, pad_words=-1), ValueError, "pad_words"),
    (lambda: banks.row_major(8, 32).byte_address(8, 0), ValueError, "outside"),
])
def test_layout_rejects(build, error, match):
    with pytest.raises(error, match=match):
        build()


# --- warp access patterns ------------------------------------------------------------------------


def test_column_and_row_reads():
    col = banks.column_read(banks.row_major(64, 32), col=3)
    assert col.addresses == tuple(128 * i + 12 for i in LANES) and col.wavefronts == 32
    assert col.lane_elements[5] == ((5, 3),) and "lane i reads row i, column 3" in col.description
    assert banks.column_read(banks.row_major(64, 32), 0, first_row=32).addresses[0] == 32 * 128
    assert banks.column_read(banks.padded(64, 32, 4, 1)).addresses == tuple(132 * i for i in LANES)
    tr = banks.column_read(banks.transposed(64, 32), col=1)
    assert tr.addresses == tuple(256 + 4 * i for i in LANES) and tr.wavefronts == 1
    row = banks.row_read(banks.row_major(32, 64), row=2)
    assert row.addresses == tuple(2 * 256 + 4 * i for i in LANES) and row.wavefronts == 1
    assert banks.row_read(banks.transposed(64, 64), row=0).wavefronts == 32  # a stored column, read across


def test_vector_reads_follow_the_stored_lines():
    vec = banks.column_read(banks.row_major(64, 32), col=4, access_bytes=16)
    assert vec.lane_elements[2] == ((2, 4), (2, 5), (2, 6), (2, 7)) and vec.addresses[2] == 256 + 16
    assert vec.wavefronts == 32 and vec.conflict_ways == 8
    tr = banks.column_read(banks.transposed(64, 32), col=0, access_bytes=16)
    assert tr.lane_elements[1] == ((4, 0), (5, 0), (6, 0), (7, 0))
    assert tr.lane_elements[16] == ((0, 1), (1, 1), (2, 1), (3, 1))  # past row 63: the next column
    assert tr.wavefronts == 4
    wrap = banks.row_read(banks.row_major(32, 32), row=0, access_bytes=16)
    assert wrap.lane_elements[8][0] == (1, 0) and wrap.addresses == tuple(16 * i for i in LANES)
    half = banks.column_read(banks.row_major(64, 64, element_bytes=2))
    assert half.access_bytes == 4 and half.lane_elements[0] == ((0, 0), (0, 1)) and half.wavefronts == 32
    assert banks.row_read(banks.transposed(64, 64), row=4, access_bytes=16).lane_elements[0][-1] == (7, 0)


def test_reads_reject_impossible_patterns():
    with pytest.raises(ValueError, match="past the tile"):
        banks.column_read(banks.row_major(16, 32))  # 32 lanes, 16 rows
    with pytest.raises(ValueError, match="not aligned"):
        banks.column_read(banks.padded(64, 32, pad_words=1), access_bytes=16)
    with pytest.raises(ValueError, match="whole"):
        banks.column_read(banks.row_major(64, 32, element_bytes=8), access_bytes=4)
    with pytest.raises(ValueError, match="access_bytes"):
        banks.column_read(banks.row_major(64, 32), access_bytes=12)
    with pytest.raises(TypeError, match="col"):
        banks.column_read(banks.row_major(64, 32), col=1.5)

    @dataclass(frozen=True)
    class Scattered(banks.TileLayout):  # each element in its own 16-byte slot
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
        results = {title: banks.column_read(layout).wavefronts for title, layout in banks.comparison_layouts(D)}
        assert list(results.values()) == [32, 1, 32, 1, 4]  # row-major, +1, doubled, transposed, XOR (scalar)
        vec = {title: banks.column_read(layout, access_bytes=16).wavefronts
               for title, layout in banks.comparison_layouts(D, access_bytes=16)}
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


def test_fma_threads_per_warp_rule():
    assert banks.fma_threads_per_warp(64) == (2, 16)
    assert banks.fma_threads_per_warp(32) == (4, 8)
    assert banks.fma_threads_per_warp(128) == (1, 32)
    assert banks.fma_threads_per_warp(256) == (1, 32)


def test_fma_loop_loads_hand_counts():
    # D=32, 4 warps, 64×64 blocks. Q·Kᵀ: lanes 2×16, warp rows 8 per repetition, 2 repetitions;
    # Q: 2 reps × 4 rows × 8 k-chunks = 64 loads, lanes 0-15 / 16-31 share a row -> 1 per phase -> 4 each.
    # K (v2): 4 columns × 8 k-chunks = 32 loads; a phase's 8 lanes read 8 rows' chunk k -> 8 each, 32 a load.
    # K (v2_kt): 32 k × 1 = 32 loads of 16 consecutive floats per half-warp -> 4 each.
    # P·V (output 64×32): lanes 4×8; P: 4 rows × 16 chunks = 64 loads (8 lanes per row) -> 4; V: 64 loads -> 4.
    loads = {x.operand: x for x in banks.fma_loop_loads("v2", 32, num_warps=4)}
    assert {k: (x.instructions, x.wavefronts) for k, x in loads.items()} == {
        "Q": (64, 256), "K": (32, 1024), "P": (64, 256), "V": (64, 256)}
    assert loads["K"].conflict_ways == 8 and loads["Q"].conflict_ways == 1 and loads["K"].ideal == 128
    kt = {x.operand: (x.instructions, x.wavefronts) for x in banks.fma_loop_loads("v2_kt", 32, num_warps=4)}
    assert kt == {"Q": (64, 256), "K": (32, 128), "P": (64, 256), "V": (64, 256)}
    view = [(x.instructions, x.wavefronts) for x in banks.fma_loop_loads("v2_kt_view", 32, num_warps=4)]
    assert view == [(x.instructions, x.wavefronts) for x in banks.fma_loop_loads("v2", 32, num_warps=4)]
    s64 = banks.fma_loop_summary(64, num_warps=8, variants=("v2", "v2_kt", "v2_padded"))
    assert s64["v2"]["instructions"] == s64["v2_kt"]["instructions"] == 256
    assert (s64["v2"]["wavefronts"], s64["v2_kt"]["wavefronts"]) == (64 * 4 + 64 * 32 + 64 * 4 + 64 * 4, 256 * 4)
    assert s64["v2_padded"]["instructions"] == 448  # D_PAD=128: 128 + 128 + 2·64 + 64


def test_predicted_ratios():
    r32 = banks.predicted_ratios(32, num_warps=4)
    assert r32 == {"simple": 32.0, "k_tile_triton": 8.0, "loop_triton": 1792 / 896}
    r64 = banks.predicted_ratios(64, num_warps=8)
    assert r64 == {"simple": 32.0, "k_tile_triton": 8.0, "loop_triton": 2816 / 1024}


def test_fma_loop_loads_rejects():
    with pytest.raises(ValueError, match="unknown variant"):
        banks.fma_loop_loads("v1", 32)
    with pytest.raises(ValueError, match="multiples of 4"):
        banks.fma_loop_loads("v2", 30)
    with pytest.raises(ValueError, match="num_warps"):
        banks.fma_loop_loads("v2", 32, num_warps=0)


@pytest.mark.parametrize("D", [16, 32, 64, 128])
def test_fma_num_warps_mirrors_the_kernel_defaults(monkeypatch, D):
    import torch as _torch

    monkeypatch.setattr(runtime, "MODE", "gpu")
    assert banks.fma_num_warps(D) == v2_module.default_options(_torch.float32, D)["num_warps"]


# --- recorded measurements -----------------------------------------------------------------------


def fake_bank_row(variant, D, wavefronts, instructions, conflicts, path="fp32_ieee", **extra):
    return {"variant": variant, "path": path, "dtype": "float32" if path == "fp32_ieee" else "float16",
            "D": D, "B": 1, "H": 2, "N": 256, "block_m": 64, "block_n": 64, **extra,
            "metrics": {banks.NCU_INSTRUCTIONS: instructions, banks.NCU_WAVEFRONTS: wavefronts,
                        banks.NCU_CONFLICTS: conflicts, banks.NCU_STORE_CONFLICTS: 0.0,
                        banks.NCU_TIME_NS: 12345.0}}


def write_fake_recording(tmp_path, measurements):
    doc = {"provenance": {"gpu": "Fake GPU", "date": "2030-01-01", "torch": "t", "triton": "x", "cuda": "c",
                          "driver": "d"},
           "measurements": measurements}
    (tmp_path / "fake.json").write_text(json.dumps(doc))
    return tmp_path


def test_load_recorded_missing_and_present(tmp_path):
    assert banks.load_recorded("bank_conflicts", data_dir=tmp_path) is None  # no file at all
    write_fake_recording(tmp_path, {"other": {"rows": []}})
    assert banks.load_recorded("bank_conflicts", data_dir=tmp_path) is None
    write_fake_recording(tmp_path, {"bank_conflicts": {"rows": [], "ncu_version": "1"}})
    entry = banks.load_recorded("bank_conflicts", data_dir=tmp_path)
    assert entry["ncu_version"] == "1" and entry["provenance"]["gpu"] == "Fake GPU"


def test_ncu_rows_derive_numbers_and_tolerate_gaps():
    entry = {"rows": [fake_bank_row("v2", 32, 2000.0, 250.0, 1100.0),
                      fake_bank_row("v2", 64, 0, 0, 0, path="fp16_tc"),
                      {"variant": "v2_kt", "path": "fp32_ieee", "D": 32},  # no metrics
                      "not a row"]}
    rows = banks.ncu_rows(entry, "fp32_ieee")
    assert [r["variant"] for r in rows] == ["v2", "v2_kt"]
    assert rows[0]["wavefronts_per_instruction"] == 8.0 and rows[0]["conflict_share"] == 0.55
    assert rows[0]["time_ms"] == pytest.approx(0.012345)
    assert rows[1]["wavefronts"] is None and rows[1]["wavefronts_per_instruction"] is None
    tc = banks.ncu_rows(entry, "fp16_tc")[0]
    assert tc["wavefronts_per_instruction"] is None and tc["conflict_share"] is None
    assert banks.ncu_rows(None) == [] and banks.ncu_rows({}) == [] and banks.ncu_rows({"rows": None}) == []


def test_compare_with_ncu_in_words():
    per_warp = banks.fma_loop_summary(32, num_warps=4)
    programs, iterations, warps = 4 * 1 * 2, 4, 4  # N=256, 64×64 blocks, B=1, H=2
    inst = programs * iterations * warps * per_warp["v2"]["instructions"]  # 224 loads per warp-iteration
    # the model: v2 8.0 wavefronts per load, v2_kt 4.0. "Measured": v2 7.0, v2_kt 3.0 (a cheaper baseline,
    # the same 4.0 extra per load for the conflicts): ratio 7/3
    entry = {"rows": [fake_bank_row("v2", 32, 7.0 * inst, inst, 900.0),
                      fake_bank_row("v2_kt", 32, 3.0 * inst, inst, 10.0),
                      fake_bank_row("v2", 64, 5000.0, 10.0, 1.0)]}  # D=64 without its v2_kt row
    out = banks.compare_with_ncu(entry)
    assert [o["D"] for o in out] == [32, 64]
    d32, d64 = out
    assert d32["measured"] == pytest.approx(7 / 3) and d32["predicted"]["loop_triton"] == 2.0
    assert d32["predicted_instructions"] == inst and d32["num_warps"] == 4
    assert d32["per_instruction"] == {"v2": {"measured": 7.0, "model": 8.0}, "v2_kt": {"measured": 3.0, "model": 4.0}}
    text = d32["text"]
    assert "Nsight Compute measured 2.33×: within 17% of the whole-iteration model of Triton's loads" in text
    assert "the same number of shared-load instructions" in text and "(+0%)" in text
    assert "4.00 measured, 4.00 modelled (+0%)" in text and "the model gets the conflicts right" in text
    assert "upper bound" in text
    assert d64["measured"] is None and "not recorded for both v2 and v2_kt" in d64["text"] and d64["num_warps"] == 8
    far = banks.compare_with_ncu({"rows": [fake_bank_row("v2", 32, 5000.0, 1000.0, 0.0, num_warps=2),
                                           fake_bank_row("v2_kt", 32, 1000.0, 2000.0, 0.0)]})[0]
    assert far["num_warps"] == 2 and "closest to the K-tile model" in far["text"] and "38% below" in far["text"]
    assert "different numbers" in far["text"] and "the model gets the conflicts right" not in far["text"]
    assert banks.compare_with_ncu(None) == []


def test_launch_config_from_what_the_row_gives():
    assert banks.launch_config({"D": 32, "block_m": 128, "block_n": 32, "num_warps": 2}) == {
        "block_m": 128, "block_n": 32, "num_warps": 2}
    recorded_style = {"D": 64, "N": 2048, "grid": "(32, 64, 1)", "block": "(256, 1, 1)"}
    assert banks.launch_config(recorded_style) == {"block_m": 64, "block_n": 64, "num_warps": 8}
    assert banks.launch_config({"D": 64, "metrics": {"launch__block_size": 128.0}})["num_warps"] == 4
    assert banks.launch_config({"D": 64, "N": 100, "grid": "(2, 1, 1)"})["block_m"] == 64  # ceil to a power of two
    assert banks.launch_config({"D": 32}) == {"block_m": 64, "block_n": 64, "num_warps": 4}
    assert banks.launch_config({}) == {"block_m": 64, "block_n": 64, "num_warps": 4}


TTGIR_LINES = [
    "#shared = #ttg.swizzled_shared<{vec = 1, perPhase = 1, maxPhase = 1, order = [1, 0]}>",
    "#shared1 = #ttg.swizzled_shared<{vec = 4, perPhase = 2, maxPhase = 8, order = [0, 1]}>",
    "#shared = #ttg.nvmma_shared<{swizzlingByteWidth = 128, transposed = true, elementBitWidth = 16}>",
    "#shared2 = #ttg.nvmma_shared<{swizzlingByteWidth = 0, transposed = false, elementBitWidth = 32}>",
]


def test_parse_and_describe_shared_layouts():
    plain, swz, nvmma, flat = (banks.parse_shared_layout(line) for line in TTGIR_LINES)
    assert plain == {"alias": "shared", "kind": "swizzled_shared",
                     "params": {"vec": 1, "perPhase": 1, "maxPhase": 1, "order": [1, 0]}}
    assert banks.describe_shared_layout(plain) == "plain (no swizzle; order [1, 0])"
    assert swz["alias"] == "shared1" and "XOR ((row // 2) mod 8)" in banks.describe_shared_layout(swz)
    assert nvmma["params"] == {"swizzlingByteWidth": 128, "transposed": True, "elementBitWidth": 16}
    text = banks.describe_shared_layout(nvmma)
    assert "128-byte swizzle" in text and "row mod 8" in text and "transposed" in text
    assert "no swizzle" in banks.describe_shared_layout(flat)
    assert "mystery" in banks.describe_shared_layout({"kind": "mystery", "params": {}})
    with pytest.raises(ValueError, match="not a TTGIR layout"):
        banks.parse_shared_layout("%0 = tt.load %ptr")
    with pytest.raises(TypeError):
        banks.parse_shared_layout(None)


def test_compiled_layout_rows():
    entry = {"rows": [
        {"variant": "v2", "path": "fp32_ieee", "D": 32, "dtype": "float32",
         "shared_layouts": TTGIR_LINES[:1] + ["junk", "#smem = #ttg.shared_memory"],
         "sass_counts": {"LDS.128": 226, "LDS": 12, "LDS.64": 8, "FFMA": 2056, "STS.128": 20}},
        {"variant": "v2", "path": "fp16_tc", "D": 64, "dtype": "float16", "shared_layouts": TTGIR_LINES[2:3],
         "sass_counts": {"HGMMA.64x64x16.F32": 16, "LDSM.16.M88.4": 8}},
        {"variant": "v2_kt"},  # nothing recorded
    ]}
    fma, tc, empty = banks.compiled_layout_rows(entry)
    assert [p["text"] for p in fma["parsed_layouts"]] == ["plain (no swizzle; order [1, 0])"]
    assert fma["lds_counts"] == {"LDS.128": 226, "LDS": 12, "LDS.64": 8} and fma["ffma"] == 2056 and fma["hgmma"] == 0
    assert tc["hgmma"] == 16 and tc["lds_counts"] == {"LDSM.16.M88.4": 8} and tc["sass_recorded"]
    assert empty["parsed_layouts"] == [] and empty["lds_counts"] == {} and not empty["sass_recorded"]


def test_layout_signature_ignores_names_and_junk():
    a = {"shared_layouts": [TTGIR_LINES[0], TTGIR_LINES[1], "#smem = #ttg.shared_memory"]}
    renamed = {"shared_layouts": [TTGIR_LINES[1].replace("#shared1", "#shared7"), TTGIR_LINES[0]]}
    assert banks.layout_signature(a) == banks.layout_signature(renamed) and len(banks.layout_signature(a)) == 2
    assert banks.layout_signature({"shared_layouts": [TTGIR_LINES[0]]}) != banks.layout_signature(a)
    assert banks.layout_signature({}) == ()
    assert banks.compiled_layout_rows(None) == []


def test_post_derived_numbers():
    d = banks.post_derived()
    assert round(d["wavefronts_per_request"], 1) == 6.3  # the post's "6.3-way average"
    assert round(100 * d["conflict_share"], 2) == 63.64  # the post's "63.64 %"
    assert 1 < d["conflict_free_per_request"] < d["wavefronts_per_request"]


# --- pictures ------------------------------------------------------------------------------------


def test_plot_request_draws_banks_lanes_and_bars():
    read = banks.column_read(banks.padded(64, 32, pad_words=1))
    fig = banks.plot_request(read)
    try:
        assert isinstance(fig, Figure)
        ax, ax_bars, colorbar = fig.axes
        assert colorbar.get_ylabel() == "bank"
        image = ax.images[0].get_array()
        assert image.shape == (32, 33)  # 32 rows, 32 columns + the padding column
        assert image[5, 0] == banks.bank(read.layout.byte_address(5, 0)) == 5
        assert bool(np.ma.getmaskarray(image)[:, 32].all())  # padding drawn as "bad" (grey)
        outlined = [p for p in ax.patches if isinstance(p, Rectangle)]
        assert len(outlined) == 32 and {(p.get_x() + 0.5, p.get_y() + 0.5) for p in outlined} == {
            (0, r) for r in range(32)}
        heights = [bar.get_height() for bar in ax_bars.patches]
        assert heights == [1] * 32  # one word from every bank
        assert "1 wavefront, ideal 1: conflict-free" in ax_bars.get_title()
        assert read.description in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_plot_request_vector_phases():
    read = banks.column_read(banks.row_major(64, 32), access_bytes=16)
    fig = banks.plot_request(read)
    try:
        ax, ax_bars, _ = fig.axes
        assert len([p for p in ax.patches if isinstance(p, Rectangle)]) == 32 * 4
        assert len(ax_bars.containers) == 4  # one bar series per phase
        assert [b.get_height() for b in ax_bars.containers[0]][:5] == [8, 8, 8, 8, 0]
        assert "32 wavefronts (4 phases: 8 + 8 + 8 + 8)" in ax_bars.get_title()
    finally:
        plt.close(fig)


def test_plot_layouts_side_by_side():
    fig, results = banks.plot_layouts(32, 4, 4)
    try:
        assert len(fig.axes) == 5 and len(results) == 5
        for ax, (title, read, req) in zip(fig.axes, results, strict=True):
            assert title in ax.get_title() and f"{req.wavefronts} wavefront" in ax.get_title()
            assert req.wavefronts == read.wavefronts
        assert [r.wavefronts for _, _, r in results] == [32, 1, 32, 1, 4]
        assert "64×32 K tile" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
    fig, results = banks.plot_layouts(64, 2, 16)
    try:
        assert [r.wavefronts for _, _, r in results] == [32, 4, 32, 4, 4]
        assert "padded +4 words" == results[1][0]
    finally:
        plt.close(fig)


def test_bank_colors_are_distinct():
    colors = banks.bank_colors().colors
    assert len(colors) == 32 and len({tuple(c) for c in colors}) == 32
