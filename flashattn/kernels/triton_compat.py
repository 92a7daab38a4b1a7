"""Every name the course takes from Triton that moved between releases, or that is not public, in one place.

The course is run and timed on the H200 with Triton 3.6 and compiled (not run) for every target with the
Triton a fresh CPU install gets (3.9; README, "Versions"). Between those releases some names moved: Gluon's
TMA load was ``async_copy_global_to_shared`` and is ``async_load`` from Triton 3.8 on; the TMA engine's bulk
reduce-add into global memory is ``tma.async_atomic_add`` from 3.8 on, and before that only Triton's internals
build it (seen: 3.6 and 3.7.1 have neither public name, 3.8.0 and 3.9.0 both).

Each name below is looked up through :func:`_first`, which tries its places newest first and catches
``ImportError`` and ``AttributeError`` alike (a module that moved, or a name that left a module that stayed).
What it finds is written into :data:`CHOSEN` (name -> the place it came from); a name found nowhere is
``None`` and listed in :data:`MISSING`, with a warning, and the kernels that need it are not offered (the
Gluon kernels give way to the Triton ones). ``tests/test_triton_compat.py`` fails when the installed Triton
takes any place other than the one :data:`EXPECTED` names for its version, so a fallback never goes unseen.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
import warnings

import triton
import triton.language as tl

VERSION = tuple(int(x) for x in triton.__version__.split("+")[0].split(".")[:2])

PRIVATE = "private: triton.experimental.gluon.language._core.builtin over the builder's operation"
CHOSEN: dict[str, str] = {}  # name -> "module:attribute" it was found at
MISSING: dict[str, str] = {}  # name -> the places tried


def _first(name: str, *places: str, private=None):
    """The first of ``places`` ("module:attribute", newest first) that exists, else what ``private()`` builds from
    Triton's internals (recorded as "private"); None (warned) if there is none."""
    for place in places:
        module, _, attr = place.partition(":")
        try:
            value = importlib.import_module(module)
            for part in attr.split(".") if attr else ():
                value = getattr(value, part)
        except (ImportError, AttributeError):
            continue
        CHOSEN[name] = place
        return value
    value = private() if private is not None else None
    if value is not None:
        CHOSEN[name] = PRIVATE
        return value
    MISSING[name] = ", ".join(places) + (", Triton's internals" if private is not None else "")
    warnings.warn(f"flashattn: Triton {triton.__version__} has no {name} (tried {MISSING[name]}); the kernels that "
                  "need it are not used", stacklevel=2)
    return None


# --- the runtime and the compiler ---------------------------------------------------------------------------
JITFunction = _first("JITFunction", "triton.runtime.jit:JITFunction")
InterpretedFunction = _first("InterpretedFunction", "triton.runtime.interpreter:InterpretedFunction")
KernelInterface = _first("KernelInterface", "triton.runtime.jit:KernelInterface")
Autotuner = _first("Autotuner", "triton.runtime.autotuner:Autotuner")
Heuristics = _first("Heuristics", "triton.runtime.autotuner:Heuristics")
OutOfResources = _first("OutOfResources", "triton.runtime.errors:OutOfResources")
PTXASError = _first("PTXASError", "triton.runtime.errors:PTXASError")
CompilationError = _first("CompilationError", "triton.compiler.errors:CompilationError")
CompileTimeAssertionFailure = _first("CompileTimeAssertionFailure",
                                     "triton.compiler.errors:CompileTimeAssertionFailure")
GPUTarget = _first("GPUTarget", "triton.backends.compiler:GPUTarget")
ASTSource = _first("ASTSource", "triton.compiler:ASTSource", "triton.compiler.compiler:ASTSource")
knobs = _first("knobs", "triton:knobs")
TensorDescriptor = _first("TensorDescriptor", "triton.tools.tensor_descriptor:TensorDescriptor")

# errors a kernel configuration can meet when it is compiled or loaded for a GPU (too much shared memory, too
# many registers, a static assertion on its tiles): the tuner drops such a candidate, as triton.autotune does
RESOURCE_ERRORS = tuple(e for e in (OutOfResources, PTXASError, CompileTimeAssertionFailure) if e is not None)


def cuobjdump_path() -> str | None:
    """The ``cuobjdump`` that Triton's wheel carries (registers, spills and SASS of a cubin), or None."""
    try:
        return knobs.nvidia.cuobjdump.path
    except AttributeError:
        return None


# --- Gluon (the Hopper kernels) -----------------------------------------------------------------------------
gluon = _first("gluon", "triton.experimental.gluon")
gl = _first("gl", "triton.experimental.gluon.language")
_HOPPER = "triton.experimental.gluon.language.nvidia.hopper"
mbarrier = _first("mbarrier", f"{_HOPPER}:mbarrier")
tma = _first("tma", f"{_HOPPER}:tma")
warpgroup_mma = _first("warpgroup_mma", f"{_HOPPER}:warpgroup_mma")
warpgroup_mma_wait = _first("warpgroup_mma_wait", f"{_HOPPER}:warpgroup_mma_wait")
fence_async_shared = _first("fence_async_shared", f"{_HOPPER}:fence_async_shared")
GluonTensorDescriptor = _first("GluonTensorDescriptor", "triton.experimental.gluon.nvidia.hopper:TensorDescriptor")
# the TMA load: async_copy_global_to_shared up to Triton 3.7, async_load from 3.8
tma_load = _first("tma_load", f"{_HOPPER}:tma.async_load", f"{_HOPPER}:tma.async_copy_global_to_shared")


def _private_tma_reduce_add():
    """Triton 3.6: the reduce-add is built (``tl`` descriptors' ``atomic_add`` use it) but Gluon's ``tma`` module
    does not export it; this wraps the builder's operation the way that module wraps its copies."""
    try:
        from triton._C.libtriton import ir
        from triton.experimental.gluon.language._core import builtin
        kind = ir.DESCRIPTOR_REDUCE_KIND.ADD
    except (ImportError, AttributeError):
        return None

    @builtin
    def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """``global[coord] += src`` for a shared tile, by the TMA engine (``cp.reduce.async.bulk.tensor ... add``);
        it completes asynchronously: ``tma.store_wait`` before the tile is written again."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(kind, tensor_desc.handle, coord, src.handle)

    return tma_reduce_add


# the TMA engine's bulk reduce-add (dQ of the Gluon backward): public from Triton 3.8 on, built from Triton's
# internals before
tma_reduce_add = _first("tma_reduce_add", f"{_HOPPER}:tma.async_atomic_add", private=_private_tma_reduce_add)

GLUON_NAMES = ("gluon", "gl", "mbarrier", "tma", "warpgroup_mma", "warpgroup_mma_wait", "fence_async_shared",
               "GluonTensorDescriptor", "tma_load")
HAS_GLUON = not any(name in MISSING for name in GLUON_NAMES)  # the forward's Gluon kernel can be built
HAS_GLUON_BACKWARD = HAS_GLUON and "tma_reduce_add" not in MISSING

# where each name is expected under a Triton version (the releases this course states it supports); the test
# compares CHOSEN with this, so that a name found somewhere else (a silent fallback) fails it
EXPECTED = {
    "tma_load": lambda v: f"{_HOPPER}:tma.async_load" if v >= (3, 8) else f"{_HOPPER}:tma.async_copy_global_to_shared",
    "tma_reduce_add": lambda v: f"{_HOPPER}:tma.async_atomic_add" if v >= (3, 8) else PRIVATE,
}


# --- the interpreter --------------------------------------------------------------------------------------
def _interpreter_index_fix():
    """Triton 3.6's interpreter turns a one-element array into an index with ``int(array)``, which NumPy 2.5
    refuses ("only 0-dimensional arrays can be converted to Python scalars": every ``range(0, hi, BLOCK)`` over a
    computed bound fails); Triton 3.7 and later squeeze the array first. The same for 3.6 (seen on the H200's
    image: Triton 3.6.0 with NumPy 2.5.2, in the interpreted processes of notebook 16)."""
    if VERSION >= (3, 7):
        return None
    try:
        from triton.runtime import interpreter
        original = interpreter._patch_lang_tensor
    except (ImportError, AttributeError):
        return None

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patched
    return patched


INTERPRETER_INDEX_FIX = _interpreter_index_fix()  # None where the installed Triton needs none


# --- compiling from interpreter mode ------------------------------------------------------------------------
# The interpreter runs a kernel by patching ``triton.language`` (its operations computed with NumPy), and in
# Triton 3.6 to 3.9 a jit function called from inside a kernel patches it again without undoing it, so after the
# first interpreted kernel ``triton.language`` stays patched. Compiling for a GPU from interpreter mode
# (``aot.compile_for``) must see the language as it was: these are the objects the interpreter patches, as they
# were when this module was imported (``flashattn`` imports it before any kernel can run).
_PATCHED_BY_THE_INTERPRETER = (tl, tl.core, tl.core.tensor, tl.math, tl.core.dtype, tl.core.condition,
                               getattr(tl.core, "tensor_descriptor_base", tl.core.tensor))
_PRISTINE = [(obj, dict(vars(obj))) for obj in dict.fromkeys(_PATCHED_BY_THE_INTERPRETER)]


@contextlib.contextmanager
def pristine_language():
    """``triton.language`` as it was before any interpreted kernel ran, and its own jit functions (``tl.zeros``
    is one) as compilable ``JITFunction`` s, for the duration of a compile; then back as it was."""
    saved = [(obj, dict(vars(obj))) for obj, _ in _PRISTINE]
    interpreted = []
    for name, module in list(sys.modules.items()):
        if name.startswith("triton.language") and module is not None and InterpretedFunction is not None:
            interpreted += [(module, attr, value) for attr, value in vars(module).items()
                            if isinstance(value, InterpretedFunction)]
    try:
        for obj, pristine in _PRISTINE:
            _set_attributes(obj, pristine)
        memo = {}
        for module, attr, value in interpreted:
            setattr(module, attr, compilable(value, memo))
        yield
    finally:
        for module, attr, value in interpreted:
            setattr(module, attr, value)
        for obj, state in saved:
            _set_attributes(obj, state)


def _set_attributes(obj, state: dict) -> None:
    for name in [n for n in vars(obj) if n not in state]:
        delattr(obj, name)
    for name, value in state.items():
        if vars(obj).get(name, _ABSENT) is not value and name not in ("__dict__", "__weakref__", "__doc__"):
            try:
                setattr(obj, name, value)
            except (AttributeError, TypeError):  # read-only slots of a class
                pass


_ABSENT = object()


def compilable(fn, memo: dict | None = None):
    """A ``JITFunction`` of an interpreter function's Python function, whose globals point at compilable versions
    of the jit functions it calls (itself if it is not an interpreter function)."""
    memo = {} if memo is None else memo
    if InterpretedFunction is None or not isinstance(fn, InterpretedFunction):
        return fn
    raw = fn.fn
    if id(raw) in memo:
        return memo[id(raw)]
    scope = dict(raw.__globals__)
    clone = types.FunctionType(raw.__code__, scope, raw.__name__, raw.__defaults__, raw.__closure__)
    clone.__qualname__, clone.__module__, clone.__doc__ = raw.__qualname__, raw.__module__, raw.__doc__
    clone.__kwdefaults__, clone.__annotations__ = raw.__kwdefaults__, dict(raw.__annotations__)
    jit = JITFunction(clone)
    memo[id(raw)] = jit
    for name, value in list(scope.items()):
        if isinstance(value, InterpretedFunction):
            scope[name] = compilable(value, memo)
    return jit
