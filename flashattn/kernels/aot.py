"""Compiling a kernel for a GPU without one: what the driver would say before it launched it.

Triton compiles for any NVIDIA target on any machine (its wheel carries ``ptxas``); only loading the result
needs the GPU. :func:`compile_for` compiles a ``@triton.jit`` (or Gluon) kernel for a :class:`device.Target`
from example arguments, as a launch would, and reports what the driver checks when it loads a kernel: the
shared memory it needs against the target's limit, its registers per thread against the register file, and
the local memory its spills take. The compile checks of ``tests/test_compile_targets.py`` run it over every
kernel and configuration the course can launch, for sm_75 to sm_90, and the exercise checks compile a
learner's kernel for sm_80 and sm_90 so that a mistake only a GPU would reject is caught in the interpreter.

In interpreter mode ``@triton.jit`` returns interpreter functions: :func:`as_jit` rebuilds a compilable
kernel from one (and from every jit function it calls).
"""

from __future__ import annotations

import functools
import inspect
import re
import subprocess
import tempfile
from dataclasses import dataclass

from . import triton_compat as tc
from .device import TARGETS, Target


@dataclass(frozen=True)
class Compiled:
    """What compiling one kernel for one target gave: resources, or the error."""

    kernel: str
    target: str
    num_warps: int
    shared_bytes: int | None = None  # dynamic shared memory the launch needs
    registers: int | None = None  # per thread
    spill_bytes: int | None = None  # local memory per thread (spilled registers, stack)
    error: str | None = None  # the compiler's message when it could not compile
    limit_shared: int = 0

    @property
    def fits(self) -> bool:
        """Compiled, and the driver would load it: shared memory and the register file within the target's limits."""
        if self.error is not None or self.shared_bytes is None:
            return False
        regs_ok = self.registers is None or self.registers * 32 * self.num_warps <= 65536
        return self.shared_bytes <= self.limit_shared and regs_ok

    def verdict(self) -> str:
        if self.error is not None:
            return "does not compile"
        if self.shared_bytes > self.limit_shared:
            return f"out of shared memory ({self.shared_bytes} > {self.limit_shared})"
        if not self.fits:
            return f"out of registers ({self.registers} x {32 * self.num_warps} threads)"
        return "fits" + (f", spills {self.spill_bytes} B" if self.spill_bytes else "")


def as_jit(kernel):
    """A compilable ``JITFunction`` for ``kernel``: itself on a GPU; in interpreter mode a new ``JITFunction`` of
    its Python function whose globals point at compilable versions of the jit functions it calls (compile it
    inside ``triton_compat.pristine_language()``)."""
    return tc.compilable(kernel)


def _specialize(arg) -> tuple[str, bool]:
    """(Triton's type string for ``arg``, whether a launch would mark it divisible by 16). As in a launch, the
    integer 1 and None become constants ("constexpr")."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    kind, key = native_specialize_impl(BaseBackend, arg, False, True, True)[:2]
    return kind, isinstance(key, str) and "D" in key


def compile_for(kernel, args: tuple, constexprs: dict, target: Target | tuple[int, int], *, num_warps: int = 4,
                num_stages: int = 3, maxnreg: int | None = None, name: str | None = None) -> Compiled:
    """Compile ``kernel`` as ``kernel[grid](*args, **constexprs, num_warps=..., ...)`` would, for ``target``.

    ``args``: the kernel's first parameters in order (tensors on any device, integers, floats, TMA
    descriptors); ``constexprs``: its remaining parameters by name (parameters with defaults may be left out).
    Compile errors are returned, not raised."""
    where = TARGETS.get(tuple(target)) if not isinstance(target, Target) else target
    if where is None:
        raise ValueError(f"compile_for: unknown target {target!r}; known: {', '.join(t.name for t in TARGETS.values())}")
    jit = as_jit(kernel)
    label = name or jit.fn.__name__
    names = list(jit.arg_names)
    values = dict(zip(names, args, strict=False))
    values.update(constexprs)
    missing = [p.name for p in jit.params if p.name not in values and p.default is inspect.Parameter.empty]
    if len(args) > len(names) or missing or set(values) - set(names):
        raise TypeError(f"compile_for({label}): the kernel takes {', '.join(names)}; got {len(args)} positional "
                        f"arguments and {', '.join(constexprs) or 'no others'}")
    signature, attrs, constants = {}, {}, {}
    for i, param in enumerate(jit.params):
        value = values.get(param.name, param.default)
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constants[(i,)] = tc.compilable(value)  # a jit function passed in, too
            continue
        kind, aligned = _specialize(value)
        signature[param.name] = kind
        if kind == "constexpr":  # the integer 1 and None specialize to constants, as in a launch
            constants[(i,)] = value
        elif aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    source_type = getattr(jit, "ASTSource", None) or _source_type(jit)
    options = dict(num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    common = dict(kernel=label, target=where.name, num_warps=num_warps, limit_shared=where.shared_bytes)
    try:
        with tc.pristine_language():
            compiled = _compile(source_type(jit, signature, constants, attrs), where, options)
    except Exception as err:  # the compiler's own error is the finding (CompilationError, PTXASError, ...)
        return Compiled(**common, error=f"{type(err).__name__}: {_first_lines(str(err))}")
    registers, spills = resources(compiled.asm["cubin"], label)
    return Compiled(**common, shared_bytes=compiled.metadata.shared, registers=registers, spill_bytes=spills)


def _source_type(jit):
    if tc.gluon is not None and type(jit).__name__ == "GluonJITFunction":
        from triton.experimental.gluon._runtime import GluonASTSource
        return GluonASTSource
    return tc.ASTSource


def _compile(source, where: Target, options: dict):
    import triton

    return triton.compile(source, target=tc.GPUTarget("cuda", where.capability[0] * 10 + where.capability[1], 32),
                          options=options)


def _first_lines(text: str, n: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[:n])


@functools.lru_cache(maxsize=1)
def _cuobjdump() -> str | None:
    return tc.cuobjdump_path()


def resources(cubin: bytes, name: str) -> tuple[int | None, int | None]:
    """(registers per thread, local memory bytes per thread) of the kernel ``name`` in ``cubin``, as
    ``cuobjdump --dump-resource-usage`` reads them (None, None where that tool is missing)."""
    tool = _cuobjdump()
    if tool is None:
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:\d+\s+LOCAL:(\d+)", out)
    if not match:
        return None, None
    reg, stack, local = map(int, match.groups())
    return reg, max(stack, local)
