"""flashattn.compiled: SASS opcode counts (the whole listing, past instruction 4096, and inside loops), resource
usage, shared layouts from TTGIR, the instruction summary (the compiled kernels themselves exist on a GPU only;
one test compiles a small kernel for sm_90 with Triton's own tools, without a GPU)."""

import os
import subprocess
import sys
import textwrap

import pytest

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
    counts.update({"LDL": 4, "STL.64": 2})
    s = compiled.instruction_summary(counts)
    assert s == {"exp2": 40, "rcp": 5, "mufu": 46, "mma": 18, "ffma": 103, "fmul": 7, "shared_loads": 11,
                 "local": 6, "total": sum(counts.values())}


def cuobjdump_listing(opcodes, branches=None):
    """A ``cuobjdump -sass`` listing: one instruction per 16 bytes, each followed by its encoding line;
    ``branches`` maps an instruction index to the index it branches to."""
    lines = ["\tcode for sm_90a", "\t\tFunction : kernel", "\t.headerflags\t@\"EF_CUDA_SM90\""]
    for i, op in enumerate(opcodes):
        operands = f" 0x{16 * branches[i]:x}" if branches and i in branches else " R0, R1"
        lines.append(f"        /*{16 * i:04x}*/                   {op}{operands} ;   /* 0x000000000000{i:04x} */")
        lines.append("                                                              /* 0x000fe20000000f00 */")
    return "\n".join(lines) + "\n"


def test_sass_opcode_counts_reads_every_instruction_past_offset_0x10000():
    # Triton 3.6's get_sass stopped at /*fff0*/ (instruction 4096); cuobjdump's listing goes on with 5 digits
    opcodes = ["FFMA"] * 5000 + ["MUFU.EX2"] * 20 + ["EXIT"]
    listing = cuobjdump_listing(opcodes)
    assert "/*10000*/" in listing
    assert compiled.sass_opcode_counts(listing) == {"EXIT": 1, "FFMA": 5000, "MUFU.EX2": 20}
    assert len(compiled.sass_instructions(listing)) == 5021


def test_loop_counts_are_the_instructions_between_a_backward_branch_and_its_target():
    # 0-2 prologue, 3-7 loop body ending in a branch back to 3, then EXIT and the trap branch to itself
    opcodes = ["LDC", "S2R", "MOV", "HGMMA.64x64x16.F32", "MUFU.EX2", "FMUL", "ISETP.GE.AND", "BRA", "STG.E.128",
               "EXIT", "BRA"]
    listing = cuobjdump_listing(opcodes, branches={7: 3, 10: 10})
    instructions = compiled.sass_instructions(listing)
    assert instructions[7] == (0x70, "BRA", "0x30")
    assert compiled.loop_ranges(instructions) == [(0x30, 0x70)]
    assert compiled.loop_opcode_counts(listing) == {"BRA": 1, "FMUL": 1, "HGMMA.64x64x16.F32": 1, "ISETP.GE.AND": 1,
                                                    "MUFU.EX2": 1}
    assert sum(compiled.sass_opcode_counts(listing).values()) == len(opcodes)


def test_loop_counts_count_nested_loops_once():
    opcodes = ["MOV", "FADD", "FMUL", "BRA", "FFMA", "BRA", "EXIT"]  # inner loop 2-3 inside outer loop 1-5
    listing = cuobjdump_listing(opcodes, branches={3: 2, 5: 1})
    assert compiled.loop_opcode_counts(listing) == {"BRA": 2, "FADD": 1, "FFMA": 1, "FMUL": 1}


def test_parse_resource_usage():
    text = ("\nResource usage:\n Common:\n  GLOBAL:0\n Function attn_kernel_v2:\n"
            "  REG:32 STACK:6072 SHARED:1024 LOCAL:0 CONSTANT[0]:640 TEXTURE:0 SURFACE:0 SAMPLER:0\n")
    assert compiled.parse_resource_usage(text) == {"registers": 32, "stack_bytes": 6072, "static_shared_bytes": 1024,
                                                   "local_bytes": 0}
    assert compiled.parse_resource_usage("no function here") == {}


def test_listing_truncated_flags_only_old_recordings_at_the_limit():
    at_limit = {"sass_counts": {"FFMA": 4000, "LDS": 96}}
    assert compiled.listing_truncated(at_limit)
    assert not compiled.listing_truncated({**at_limit, "sass_source": "cuobjdump -sass"})
    assert not compiled.listing_truncated({"sass_counts": {"FFMA": 4095}})


_LONG_KERNEL = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "0"
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def long_kernel(X, Y, REPEAT: tl.constexpr):
        offs = tl.arange(0, 1024)  # 8 elements per thread: every line below is 8 instructions or more
        x = tl.load(X + offs)
        for i in tl.static_range(REPEAT):
            x = tl.exp2(x * 0.5 + i)
        tl.store(Y + offs, x)

    src = ASTSource(long_kernel, {"X": "*fp32", "Y": "*fp32", "REPEAT": "constexpr"}, {"REPEAT": 300})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    open(sys.argv[1], "wb").write(kernel.asm["cubin"])
""")


def test_disassemble_a_real_kernel_longer_than_4096_instructions(tmp_path):
    # compiled for sm_90 by Triton's own tools (ptxas, cuobjdump: shipped with Triton's NVIDIA backend) in a
    # fresh process, without a GPU: the test process runs the interpreter
    try:
        compiled.cuobjdump_path()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    script, cubin = tmp_path / "long_kernel.py", tmp_path / "long.cubin"
    script.write_text(_LONG_KERNEL)
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, str(script), str(cubin)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sass = compiled.disassemble(cubin.read_bytes())
    counts = compiled.sass_opcode_counts(sass)
    assert sum(counts.values()) > 4096 and max(off for off, _, _ in compiled.sass_instructions(sass)) >= 0x10000
    assert counts["MUFU.EX2"] == 300 * 8  # every exponential, the last ones included
    assert compiled.loop_opcode_counts(sass) == {}  # fully unrolled: no loop
    usage = compiled.resource_usage(cubin.read_bytes())
    assert usage["registers"] > 0 and usage["stack_bytes"] == 0
