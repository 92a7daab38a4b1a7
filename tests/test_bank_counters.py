"""flashattn.bank_counters: reading the recorded Nsight Compute counters and compiled shared layouts."""

from __future__ import annotations

import json

import pytest

from flashattn import bank_counters, compiled, fma_loads, recorded

# --- recorded measurements -----------------------------------------------------------------------


def fake_bank_row(variant, D, wavefronts, instructions, conflicts, path="fp32_ieee", **extra):
    return {"variant": variant, "path": path, "dtype": "float32" if path == "fp32_ieee" else "float16",
            "D": D, "B": 1, "H": 2, "N": 256, "block_m": 64, "block_n": 64, **extra,
            "metrics": {bank_counters.NCU_INSTRUCTIONS: instructions, bank_counters.NCU_WAVEFRONTS: wavefronts,
                        bank_counters.NCU_CONFLICTS: conflicts, bank_counters.NCU_STORE_CONFLICTS: 0.0,
                        bank_counters.NCU_TIME_NS: 12345.0}}


def write_fake_recording(tmp_path, measurements):
    doc = {"provenance": {"gpu": "Fake GPU", "date": "2030-01-01", "torch": "t", "triton": "x", "cuda": "c",
                          "driver": "d"},
           "measurements": measurements}
    (tmp_path / "fake.json").write_text(json.dumps(doc))
    return tmp_path


def test_load_recorded_missing_and_present(tmp_path):
    assert recorded.find("bank_conflicts", data_dir=tmp_path) is None  # no file at all
    write_fake_recording(tmp_path, {"other": {"rows": []}})
    assert recorded.find("bank_conflicts", data_dir=tmp_path) is None
    write_fake_recording(tmp_path, {"bank_conflicts": {"rows": [], "ncu_version": "1"}})
    entry = recorded.find("bank_conflicts", data_dir=tmp_path)
    assert entry["ncu_version"] == "1" and entry["provenance"]["gpu"] == "Fake GPU"


def test_ncu_rows_derive_numbers_and_tolerate_gaps():
    entry = {"rows": [fake_bank_row("v2", 32, 2000.0, 250.0, 1100.0),
                      fake_bank_row("v2", 64, 0, 0, 0, path="fp16_tc"),
                      {"variant": "v2_kt", "path": "fp32_ieee", "D": 32},  # no metrics
                      "not a row"]}
    rows = bank_counters.ncu_rows(entry, "fp32_ieee")
    assert [r["variant"] for r in rows] == ["v2", "v2_kt"]
    assert rows[0]["wavefronts_per_instruction"] == 8.0 and rows[0]["conflict_share"] == 0.55
    assert rows[0]["time_ms"] == pytest.approx(0.012345)
    assert rows[1]["wavefronts"] is None and rows[1]["wavefronts_per_instruction"] is None
    tc = bank_counters.ncu_rows(entry, "fp16_tc")[0]
    assert tc["wavefronts_per_instruction"] is None and tc["conflict_share"] is None
    for empty in (None, {}, {"rows": None}):
        assert bank_counters.ncu_rows(empty) == []


def test_compare_with_ncu_in_words():
    per_warp = fma_loads.fma_loop_summary(32, num_warps=4)
    programs, iterations, warps = 4 * 1 * 2, 4, 4  # N=256, 64×64 blocks, B=1, H=2
    inst = programs * iterations * warps * per_warp["v2"]["instructions"]  # 224 loads per warp-iteration
    # the model: v2 8.0 wavefronts per load, v2_kt 4.0. "Measured": v2 7.0, v2_kt 3.0 (a cheaper baseline,
    # the same 4.0 extra per load for the conflicts): ratio 7/3
    entry = {"rows": [fake_bank_row("v2", 32, 7.0 * inst, inst, 900.0),
                      fake_bank_row("v2_kt", 32, 3.0 * inst, inst, 10.0),
                      fake_bank_row("v2", 64, 5000.0, 10.0, 1.0)]}  # D=64 without its v2_kt row
    out = bank_counters.compare_with_ncu(entry)
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
    far = bank_counters.compare_with_ncu({"rows": [fake_bank_row("v2", 32, 5000.0, 1000.0, 0.0, num_warps=2),
                                           fake_bank_row("v2_kt", 32, 1000.0, 2000.0, 0.0)]})[0]
    assert far["num_warps"] == 2 and "closest to the K-tile model" in far["text"] and "38% below" in far["text"]
    assert "different numbers" in far["text"] and "the model gets the conflicts right" not in far["text"]
    assert bank_counters.compare_with_ncu(None) == []


def test_launch_config_from_what_the_row_gives():
    assert bank_counters.launch_config({"D": 32, "block_m": 128, "block_n": 32, "num_warps": 2}) == {
        "block_m": 128, "block_n": 32, "num_warps": 2}
    recorded_style = {"D": 64, "N": 2048, "grid": "(32, 64, 1)", "block": "(256, 1, 1)"}
    assert bank_counters.launch_config(recorded_style) == {"block_m": 64, "block_n": 64, "num_warps": 8}
    assert bank_counters.launch_config({"D": 64, "metrics": {"launch__block_size": 128.0}})["num_warps"] == 4
    ragged = {"D": 64, "N": 100, "grid": "(2, 1, 1)"}
    assert bank_counters.launch_config(ragged)["block_m"] == 64  # N / programs, up to a power of two
    assert bank_counters.launch_config({"D": 32}) == {"block_m": 64, "block_n": 64, "num_warps": 4}
    assert bank_counters.launch_config({}) == {"block_m": 64, "block_n": 64, "num_warps": 4}


TTGIR_LINES = [
    "#shared = #ttg.swizzled_shared<{vec = 1, perPhase = 1, maxPhase = 1, order = [1, 0]}>",
    "#shared1 = #ttg.swizzled_shared<{vec = 4, perPhase = 2, maxPhase = 8, order = [0, 1]}>",
    "#shared = #ttg.nvmma_shared<{swizzlingByteWidth = 128, transposed = true, elementBitWidth = 16}>",
    "#shared2 = #ttg.nvmma_shared<{swizzlingByteWidth = 0, transposed = false, elementBitWidth = 32}>",
]


def test_parse_and_describe_shared_layouts():
    plain, swz, nvmma, flat = (bank_counters.parse_shared_layout(line) for line in TTGIR_LINES)
    assert plain == {"alias": "shared", "kind": "swizzled_shared",
                     "params": {"vec": 1, "perPhase": 1, "maxPhase": 1, "order": [1, 0]}}
    assert bank_counters.describe_shared_layout(plain) == "plain (no swizzle; order [1, 0])"
    assert swz["alias"] == "shared1" and "XOR ((row // 2) mod 8)" in bank_counters.describe_shared_layout(swz)
    assert nvmma["params"] == {"swizzlingByteWidth": 128, "transposed": True, "elementBitWidth": 16}
    text = bank_counters.describe_shared_layout(nvmma)
    assert "128-byte swizzle" in text and "row mod 8" in text and "transposed" in text
    assert "no swizzle" in bank_counters.describe_shared_layout(flat)
    assert "mystery" in bank_counters.describe_shared_layout({"kind": "mystery", "params": {}})
    with pytest.raises(ValueError, match="not a TTGIR layout"):
        bank_counters.parse_shared_layout("%0 = tt.load %ptr")
    with pytest.raises(TypeError):
        bank_counters.parse_shared_layout(None)


def test_compiled_layout_rows():
    entry = {"rows": [
        {"variant": "v2", "path": "fp32_ieee", "D": 32, "dtype": "float32",
         "shared_layouts": TTGIR_LINES[:1] + ["junk", "#smem = #ttg.shared_memory"],
         "sass_counts": {"LDS.128": 226, "LDS": 12, "LDS.64": 8, "FFMA": 2056, "STS.128": 20}},
        {"variant": "v2", "path": "fp16_tc", "D": 64, "dtype": "float16", "shared_layouts": TTGIR_LINES[2:3],
         "sass_counts": {"HGMMA.64x64x16.F32": 16, "LDSM.16.M88.4": 8}},
        {"variant": "v2_kt"},  # nothing recorded
    ]}
    fma, tc, empty = bank_counters.compiled_layout_rows(entry)
    assert [p["text"] for p in fma["parsed_layouts"]] == ["plain (no swizzle; order [1, 0])"]
    assert fma["lds_counts"] == {"LDS.128": 226, "LDS": 12, "LDS.64": 8} and fma["ffma"] == 2056 and fma["hgmma"] == 0
    assert tc["hgmma"] == 16 and tc["lds_counts"] == {"LDSM.16.M88.4": 8} and tc["sass_recorded"]
    assert empty["parsed_layouts"] == [] and empty["lds_counts"] == {} and not empty["sass_recorded"]


def test_layout_signature_ignores_names_and_junk():
    a = {"shared_layouts": [TTGIR_LINES[0], TTGIR_LINES[1], "#smem = #ttg.shared_memory"]}
    renamed = {"shared_layouts": [TTGIR_LINES[1].replace("#shared1", "#shared7"), TTGIR_LINES[0]]}
    signature = bank_counters.layout_signature(a)
    assert signature == bank_counters.layout_signature(renamed) and len(signature) == 2
    assert bank_counters.layout_signature({"shared_layouts": [TTGIR_LINES[0]]}) != bank_counters.layout_signature(a)
    assert bank_counters.layout_signature({}) == ()
    assert bank_counters.compiled_layout_rows(None) == []


def test_stall_metrics_are_profile_names_and_in_the_bank_run():
    from flashattn import profile

    for name in (bank_counters.NCU_WARP_CYCLES, bank_counters.NCU_MIO_THROTTLE):
        assert name in profile.WARP_METRICS and name in bank_counters.BANK_RUN_METRICS
    assert set(bank_counters.BANK_METRICS) <= set(bank_counters.BANK_RUN_METRICS)
    assert len(set(bank_counters.BANK_RUN_METRICS)) == len(bank_counters.BANK_RUN_METRICS)


def test_ncu_rows_mio_throttle_share():
    row = fake_bank_row("v2_kt", 32, 100.0, 50.0, 0.0)
    row["metrics"].update({bank_counters.NCU_WARP_CYCLES: 20.0, bank_counters.NCU_MIO_THROTTLE: 5.0})
    (with_stalls,) = bank_counters.ncu_rows({"rows": [row]})
    assert with_stalls["cycles_per_instruction"] == 20.0 and with_stalls["mio_throttle_cycles"] == 5.0
    assert with_stalls["mio_throttle_share"] == 0.25
    (without,) = bank_counters.ncu_rows({"rows": [fake_bank_row("v2", 32, 100.0, 50.0, 0.0)]})
    assert without["mio_throttle_share"] is None and without["cycles_per_instruction"] is None


def test_truncated_sass_listing_is_not_shown_as_counts():
    limit = compiled.OLD_LISTING_LIMIT  # what Triton 3.6's get_sass could list
    cut = {"variant": "v2_padded", "spills": 1518, "sass_counts": {"FFMA": limit - 100, "LDS.128": 100}}
    whole = {"variant": "v2", "spills": 0, "sass_counts": {"FFMA": 2000, "MUFU.EX2": 20}}
    # read from cuobjdump's full listing: believed even at exactly the old limit; its stack is recorded
    full = {"variant": "v2_padded", "spills": 1518, "stack_bytes": 6000, "sass_source": "cuobjdump -sass",
            "sass_counts": {"FFMA": limit}}
    rows = bank_counters.compiled_layout_rows({"rows": [cut, whole, full, {"variant": "v2_kt"}]})
    assert [(r["sass_truncated"], r["sass_recorded"]) for r in rows] == [(True, False), (False, True), (False, True),
                                                                         (False, False)]
    assert [r["local_bytes"] for r in rows] == [1518 * 4, 0, 6000, None]
