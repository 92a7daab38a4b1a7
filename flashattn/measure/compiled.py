"""What Triton compiled: registers, spills, shared memory, shared layouts (TTGIR) and SASS of each kernel.

* :func:`compiled_kernels` — every kernel Triton has compiled for a ``@triton.jit`` function in this
  process (GPU mode: the interpreter compiles nothing);
* :func:`kernel_facts` — one kernel's resources, shared layouts and SASS opcode counts;
* :func:`instruction_summary` — the instructions notebook 07 talks about, from those counts.
"""

from __future__ import annotations

import re
from collections import Counter


def compiled_kernels(jit_fn) -> list:
    """Every kernel Triton has compiled for ``jit_fn`` in this process (GPU mode only)."""
    caches = getattr(jit_fn, "device_caches", {})
    return [kernel for cache in caches.values() for kernel in cache[0].values()]


def kernel_name(jit_fn) -> str:
    """The Python name of a ``@triton.jit`` function (``"attn_kernel_v2"``)."""
    fn = getattr(jit_fn, "fn", None)
    return getattr(fn, "__name__", None) or getattr(jit_fn, "__name__", "?")


_SASS_LINE = re.compile(
    r"^\s*(?:/\*[0-9a-f]{4,}\*/|[A-Z0-9-]+:[^\t]*\t)\s*(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)"
)


def sass_opcode_counts(sass: str) -> dict[str, int]:
    """Count SASS instructions by opcode (with its modifiers, e.g. ``LDS.128``, ``HGMMA.64x64x16.F32``).

    Reads both ``cuobjdump -sass`` lines (``/*0040*/  LDS.128 R4, [R2] ;``) and the
    ``control<TAB>instruction`` lines of ``triton.tools.disasm.get_sass``.
    """
    counts: Counter = Counter()
    for line in sass.splitlines():
        m = _SASS_LINE.match(line)
        if m:
            counts[m.group(1)] += 1
    return dict(sorted(counts.items()))


def shared_layouts(ttgir: str) -> list[str]:
    """The TTGIR lines that define shared-memory encodings (swizzled_shared, nvmma_shared, ...)."""
    return [line.strip() for line in ttgir.splitlines() if line.startswith("#") and "shared" in line]


def kernel_resources(kernel) -> dict:
    """Registers, spills, shared memory, warps and stages of one compiled kernel (no SASS: quick)."""
    return {"registers_per_thread": kernel.n_regs, "spills": kernel.n_spills, "shared_bytes": kernel.metadata.shared,
            "num_warps": kernel.metadata.num_warps, "num_stages": getattr(kernel.metadata, "num_stages", None)}


def kernel_facts(kernel) -> dict:
    """Registers, spills, shared memory, warps, shared layouts and SASS opcode counts of one kernel."""
    facts = {**kernel_resources(kernel), "shared_layouts": shared_layouts(kernel.asm.get("ttgir", ""))}
    try:
        from triton.tools.disasm import get_sass

        facts["sass_counts"] = sass_opcode_counts(get_sass(kernel.asm["cubin"]))
    except Exception as err:  # noqa: BLE001 - cuobjdump may be missing; say so in the data
        facts["sass_error"] = f"{type(err).__name__}: {err}"
    return facts


def instruction_summary(sass_counts: dict[str, int]) -> dict[str, int]:
    """Static counts of the instructions notebook 07 talks about, summed over their modifiers.

    ``exp2`` = MUFU.EX2 (every exponential: ``tl.exp`` becomes a multiply by log2 e, then EX2),
    ``rcp`` = MUFU.RCP (a division is a reciprocal and multiplies, plus a slow-path check),
    ``mma`` = HMMA/HGMMA (tensor cores), ``ffma`` = FFMA (CUDA-core fused multiply-add), ``fmul``.
    """
    def total(*prefixes):
        return sum(n for op, n in sass_counts.items() if op.split(".")[0] in prefixes)

    return {"exp2": sum(n for op, n in sass_counts.items() if op.startswith("MUFU.EX2")),
            "rcp": sum(n for op, n in sass_counts.items() if op.startswith("MUFU.RCP")),
            "mufu": total("MUFU"), "mma": total("HMMA", "HGMMA"), "ffma": total("FFMA"),
            "fmul": total("FMUL"), "shared_loads": total("LDS", "LDSM"), "total": sum(sass_counts.values())}
