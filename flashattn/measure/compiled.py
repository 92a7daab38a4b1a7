"""What Triton compiled: registers, spills, shared memory, shared layouts (TTGIR) and SASS of each kernel.

* :func:`compiled_kernels` — every kernel Triton has compiled for a ``@triton.jit`` function in this
  process (GPU mode: the interpreter compiles nothing);
* :func:`kernel_facts` — one kernel's resources, shared layouts and SASS opcode counts (the whole kernel,
  and the instructions inside its loops: one iteration's worth);
* :func:`disassemble` — a cubin's full SASS listing, from ``cuobjdump -sass``;
* :func:`instruction_summary` — the instructions notebook 07 talks about, from those counts.

The listing is read from ``cuobjdump -sass`` directly, not through ``triton.tools.disasm.get_sass``: in
Triton 3.6 that function stops at code offset 0x10000 (instruction 4096), because its pattern for an
offset takes four hex digits only; a large kernel lost everything after it (for the padded float32
kernel, every exponential).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path


def compiled_kernels(jit_fn) -> list:
    """Every kernel Triton has compiled for ``jit_fn`` in this process (GPU mode only)."""
    caches = getattr(jit_fn, "device_caches", {})
    return [kernel for cache in caches.values() for kernel in cache[0].values()]


def kernel_name(jit_fn) -> str:
    """The Python name of a ``@triton.jit`` function (``"attn_kernel_v2"``)."""
    fn = getattr(jit_fn, "fn", None)
    return getattr(fn, "__name__", None) or getattr(jit_fn, "__name__", "?")


# --- reading SASS -------------------------------------------------------------------------------

_SASS_LINE = re.compile(
    r"^\s*(?:/\*[0-9a-f]{4,}\*/|[A-Z0-9-]+:[^\t]*\t)\s*(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)"
)
# a cuobjdump line: /*offset*/  [@predicate]  OPCODE.MODIFIERS operands ;
_OFFSET_LINE = re.compile(
    r"^\s*/\*([0-9a-f]{4,})\*/\s*(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)([^;]*);"
)
_BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")


def sass_opcode_counts(sass: str) -> dict[str, int]:
    """Count SASS instructions by opcode (with its modifiers, e.g. ``LDS.128``, ``HGMMA.64x64x16.F32``).

    Reads both ``cuobjdump -sass`` lines (``/*0040*/  LDS.128 R4, [R2] ;``, any number of offset digits)
    and the ``control<TAB>instruction`` lines of ``triton.tools.disasm.get_sass``.
    """
    counts: Counter = Counter()
    for line in sass.splitlines():
        m = _SASS_LINE.match(line)
        if m:
            counts[m.group(1)] += 1
    return dict(sorted(counts.items()))


def sass_instructions(sass: str) -> list[tuple[int, str, str]]:
    """The instructions of a ``cuobjdump -sass`` listing as ``(byte offset, opcode, operands)``."""
    out = []
    for line in sass.splitlines():
        m = _OFFSET_LINE.match(line)
        if m:
            out.append((int(m.group(1), 16), m.group(2), m.group(3).strip()))
    return out


def loop_ranges(instructions: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """``(first, last)`` byte offsets of every loop: a branch back to an earlier instruction.

    A branch to itself is not a loop: compilers end the code with ``EXIT`` then ``BRA`` to that same
    ``BRA`` (a trap no thread reaches).
    """
    loops = []
    for offset, opcode, operands in instructions:
        if opcode.split(".")[0] == "BRA":
            target = _BRANCH_TARGET.search(operands)
            if target and int(target.group(1), 16) < offset:
                loops.append((int(target.group(1), 16), offset))
    return loops


def loop_opcode_counts(sass: str) -> dict[str, int]:
    """Opcode counts of the instructions inside loops (each counted once, nested loops included).

    For a kernel with one loop, as the attention kernels have, these are the instructions one warp
    issues per iteration (predicated-off instructions are issued too); the rest of the kernel runs once.
    """
    instructions = sass_instructions(sass)
    loops = loop_ranges(instructions)
    counts = Counter(opcode for offset, opcode, _ in instructions
                     if any(first <= offset <= last for first, last in loops))
    return dict(sorted(counts.items()))


def parse_resource_usage(text: str) -> dict[str, int]:
    """``cuobjdump --dump-resource-usage``'s numbers for the first function in ``text``:
    ``{"registers", "stack_bytes", "local_bytes", "static_shared_bytes"}`` (those it prints)."""
    names = {"REG": "registers", "STACK": "stack_bytes", "LOCAL": "local_bytes", "SHARED": "static_shared_bytes"}
    for line in text.splitlines():
        found = dict(re.findall(r"\b(REG|STACK|LOCAL|SHARED):(\d+)", line))
        if "REG" in found:
            return {names[key]: int(value) for key, value in found.items()}
    return {}


def cuobjdump_path() -> str:
    """The ``cuobjdump`` Triton ships with its NVIDIA backend (or the one on PATH)."""
    from flashattn.kernels.triton_compat import cuobjdump_path as triton_cuobjdump

    path = triton_cuobjdump()
    if path and Path(path).exists():
        return path
    path = shutil.which("cuobjdump")
    if path is None:
        raise FileNotFoundError("cuobjdump not found: neither Triton's NVIDIA backend nor PATH has it")
    return path


def _cuobjdump(cubin: bytes, *args: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([cuobjdump_path(), *args, f.name], capture_output=True, text=True, check=True,
                              timeout=300).stdout


def disassemble(cubin: bytes) -> str:
    """The complete SASS listing of a cubin (``cuobjdump -sass``)."""
    return _cuobjdump(cubin, "-sass")


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers, stack, local and static shared bytes per thread of a cubin's kernel, from cuobjdump."""
    return parse_resource_usage(_cuobjdump(cubin, "--dump-resource-usage"))


# --- facts of a compiled kernel -----------------------------------------------------------------

def shared_layouts(ttgir: str) -> list[str]:
    """The TTGIR lines that define shared-memory encodings (swizzled_shared, nvmma_shared, ...)."""
    return [line.strip() for line in ttgir.splitlines() if line.startswith("#") and "shared" in line]


def kernel_resources(kernel) -> dict:
    """Registers, spills, shared memory, warps and stages of one compiled kernel (no SASS: quick).

    ``spills`` is Triton's ``n_spills``: the kernel's local memory per thread (its stack, where spilled
    values live) in 4-byte words, as Triton's driver reports it (local bytes ÷ 4)."""
    return {"registers_per_thread": kernel.n_regs, "spills": kernel.n_spills, "shared_bytes": kernel.metadata.shared,
            "num_warps": kernel.metadata.num_warps, "num_stages": getattr(kernel.metadata, "num_stages", None)}


def kernel_facts(kernel) -> dict:
    """Registers, spills, stack, shared memory, warps, shared layouts and SASS opcode counts of one kernel.

    ``sass_counts`` counts every instruction of the binary; ``loop_sass_counts`` those inside its loops;
    ``stack_bytes`` is the per-thread stack (local memory) ptxas set aside, where spilled values live.
    """
    facts = {**kernel_resources(kernel), "shared_layouts": shared_layouts(kernel.asm.get("ttgir", ""))}
    try:
        cubin = kernel.asm["cubin"]
        sass = disassemble(cubin)
        facts["sass_counts"] = sass_opcode_counts(sass)
        facts["loop_sass_counts"] = loop_opcode_counts(sass)
        facts["sass_source"] = "cuobjdump -sass"
        facts["stack_bytes"] = resource_usage(cubin).get("stack_bytes")
    except Exception as err:  # noqa: BLE001 - cuobjdump may be missing; say so in the data
        facts["sass_error"] = f"{type(err).__name__}: {err}"
    return facts


OLD_LISTING_LIMIT = 4096  # instructions Triton 3.6's get_sass could list (code offsets below 0x10000)


def listing_truncated(facts: dict) -> bool:
    """Whether recorded facts came from a truncated listing: recorded before the course read
    ``cuobjdump -sass`` itself (no ``sass_source``) and exactly at the old limit of 4096 instructions."""
    counts = facts.get("sass_counts") or {}
    return "sass_source" not in facts and sum(counts.values()) == OLD_LISTING_LIMIT


def instruction_summary(sass_counts: dict[str, int]) -> dict[str, int]:
    """Static counts of the instructions notebook 07 talks about, summed over their modifiers.

    ``exp2`` = MUFU.EX2 (every exponential: ``tl.exp`` becomes a multiply by log2 e, then EX2),
    ``rcp`` = MUFU.RCP (a division is a reciprocal and multiplies, plus a slow-path check),
    ``mma`` = HMMA/HGMMA (tensor cores), ``ffma`` = FFMA (CUDA-core fused multiply-add), ``fmul``,
    ``local`` = LDL/STL (loads and stores of local memory: spilled values).
    """
    def total(*prefixes):
        return sum(n for op, n in sass_counts.items() if op.split(".")[0] in prefixes)

    return {"exp2": sum(n for op, n in sass_counts.items() if op.startswith("MUFU.EX2")),
            "rcp": sum(n for op, n in sass_counts.items() if op.startswith("MUFU.RCP")),
            "mufu": total("MUFU"), "mma": total("HMMA", "HGMMA"), "ffma": total("FFMA"),
            "fmul": total("FMUL"), "shared_loads": total("LDS", "LDSM"), "local": total("LDL", "STL"),
            "total": sum(sass_counts.values())}
