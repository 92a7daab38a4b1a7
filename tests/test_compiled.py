"""flashattn.compiled: SASS opcode counts, shared layouts from TTGIR, the instruction summary (the compiled kernels
themselves exist on a GPU only)."""

from flashattn import compiled


def test_sass_opcode_counts():
    sass = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDS.128 R4, [R2] ;
        /*0020*/              @P0  LDS.128 R8, [R2+0x10] ;
        /*0030*/              @!P1 FFMA R3, R4, R5, R3 ;
        /*0040*/                   HGMMA.64x64x16.F32 R24, gdesc[UR4], RZ ;
        /*0050*/                   MUFU.EX2 R7, R7 ;
    """
    assert compiled.sass_opcode_counts(sass) == {
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
    assert compiled.sass_opcode_counts(sass) == {"HGMMA.64x64x16.F32": 1, "LDC": 1, "LDS.64": 1}


def test_shared_layouts_from_ttgir():
    ttgir = (
        "#blocked = #ttg.blocked<{sizePerThread = [1, 4]}>\n"
        "#shared = #ttg.swizzled_shared<{vec = 4, perPhase = 1, maxPhase = 8, order = [1, 0]}>\n"
        "#shared1 = #ttg.nvmma_shared<{swizzlingByteWidth = 128, transposed = false}>\n"
        "module {\n  %0 = ttg.local_alloc : !ttg.memdesc<64x64xf16, #shared>\n}\n"
    )
    assert compiled.shared_layouts(ttgir) == [
        "#shared = #ttg.swizzled_shared<{vec = 4, perPhase = 1, maxPhase = 8, order = [1, 0]}>",
        "#shared1 = #ttg.nvmma_shared<{swizzlingByteWidth = 128, transposed = false}>",
    ]


def test_instruction_summary():
    counts = {"MUFU.EX2": 40, "MUFU.RCP": 5, "MUFU.LG2": 1, "HGMMA.64x64x16.F32": 16, "HMMA.16816.F32": 2,
              "FFMA": 100, "FFMA.FTZ": 3, "FMUL": 7, "LDS.128": 9, "LDSM.16.M88.4": 2}
    s = compiled.instruction_summary(counts)
    assert s == {"exp2": 40, "rcp": 5, "mufu": 46, "mma": 18, "ffma": 103, "fmul": 7, "shared_loads": 11,
                 "total": sum(counts.values())}
