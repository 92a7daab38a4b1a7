"""Parsing Nsight Compute CSV and SASS; the profile helpers degrade clearly without ncu."""

from pathlib import Path

import pytest

from flashattn import profile

FIXTURES = Path(__file__).parent / "fixtures"


def test_parse_captured_ncu_csv():
    text = (FIXTURES / "ncu_v2_small.csv").read_text()
    rows = profile.parse_ncu_csv(text)
    assert len(rows) == 2  # warm-up launch and measured launch of one configuration
    for row in rows:
        assert "attn_kernel_v2" in row["kernel"]
        for name in profile.BANK_METRICS:
            assert isinstance(row["metrics"][name], float), name
        assert row["metrics"]["gpu__time_duration.sum"] > 0
        assert row["units"]["gpu__time_duration.sum"] == "ns"


def test_parse_handles_thousands_separators_and_noise():
    text = (
        "==PROF== Connected to process 1\nsome program output\n"
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","dram__bytes_read.sum","gpu__time_duration.sum"\n'
        '"","","","","","","","","","","","byte","ns"\n'
        '"0","7","python3","127.0.0.1","attn_kernel_v2","1","7","(128, 1, 1)","(32, 64, 1)","0","9.0",'
        '"1,234,567","2,048"\n'
    )
    (row,) = profile.parse_ncu_csv(text)
    assert row["metrics"] == {"dram__bytes_read.sum": 1234567.0, "gpu__time_duration.sum": 2048.0}
    assert row["grid"] == "(32, 64, 1)" and row["units"]["dram__bytes_read.sum"] == "byte"


def test_parse_without_table():
    with pytest.raises(ValueError, match="no Nsight Compute CSV table"):
        profile.parse_ncu_csv("==ERROR== something went wrong\n")


def test_ncu_missing_is_explained(monkeypatch):
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    with pytest.raises(profile.NcuUnavailable, match="not installed"):
        profile.ncu_profile([{"variant": "v2"}])


def test_ncu_command_line():
    cmd = profile.ncu_command("/x/ncu", [{"variant": "v2"}], ["a.sum", "b.sum"], "attn_kernel_v2")
    assert cmd[:3] == ["/x/ncu", "--clock-control", "none"]
    assert "--csv" in cmd and "a.sum,b.sum" in cmd and "regex:attn_kernel_v2" in cmd
    assert cmd[-3:-1] == ["-m", "flashattn.profile"]


def test_sass_opcode_counts():
    sass = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDS.128 R4, [R2] ;
        /*0020*/              @P0  LDS.128 R8, [R2+0x10] ;
        /*0030*/              @!P1 FFMA R3, R4, R5, R3 ;
        /*0040*/                   HGMMA.64x64x16.F32 R24, gdesc[UR4], RZ ;
        /*0050*/                   MUFU.EX2 R7, R7 ;
    """
    assert profile.sass_opcode_counts(sass) == {
        "FFMA": 1, "HGMMA.64x64x16.F32": 1, "LDC": 1, "LDS.128": 2, "MUFU.EX2": 1,
    }


def test_sass_opcode_counts_of_tritons_disassembler_format():
    sass = (
        "Function:attn_kernel_v2\n"
        "B------:R-:W-:-:S02\tLDC R1, c[0x0][0x28] ;\n"
        "B------:R-:W-:Y:S04\t@P0 LDS.64 R4, [R2] ;\n"
        "B------:R-:W0:-:S01\tHGMMA.64x64x16.F32 R24, gdesc[UR4], RZ ;\n"
        "LBB0:\n"
    )
    assert profile.sass_opcode_counts(sass) == {"HGMMA.64x64x16.F32": 1, "LDC": 1, "LDS.64": 1}


def test_shared_layouts_from_ttgir():
    ttgir = (
        "#blocked = #ttg.blocked<{sizePerThread = [1, 4]}>\n"
        "#shared = #ttg.swizzled_shared<{vec = 4, perPhase = 1, maxPhase = 8, order = [1, 0]}>\n"
        "#shared1 = #ttg.nvmma_shared<{swizzlingByteWidth = 128, transposed = false}>\n"
        "module {\n  %0 = ttg.local_alloc : !ttg.memdesc<64x64xf16, #shared>\n}\n"
    )
    assert profile.shared_layouts(ttgir) == [
        "#shared = #ttg.swizzled_shared<{vec = 4, perPhase = 1, maxPhase = 8, order = [1, 0]}>",
        "#shared1 = #ttg.nvmma_shared<{swizzlingByteWidth = 128, transposed = false}>",
    ]
