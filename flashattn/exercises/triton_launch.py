"""Launching the learner's kernel for a check, as a GPU would run it, and saying what went wrong when it fails.

* ``launch``: runs ``kernel[grid](...)``; an exception becomes ``ExerciseFailed`` naming the case, the
  learner's own line and, for the usual Triton errors, what to change (a hint chosen from the error *and*
  the line it happened on: a shape mismatch in a ``tl.load`` mask is not one in a ``tl.dot``).
* In interpreter mode ``launch`` also compiles the kernel ahead of time for a GPU (sm_80 and sm_90, through
  ``flashattn.kernels.aot``: Triton compiles without a GPU) from the arguments of the launch, and reports what
  a GPU compiler refuses and the interpreter runs anyway (a float16 accumulator the loop turns into float32,
  a size that is not a constexpr, Python the compiler does not take) as the learner's mistake, with the line
  and a hint (``compile_for_gpu``).
* In interpreter mode the masked-off lanes of a ``tl.load`` written without ``other=`` read NaN
  (``masked_lanes_undefined``): on a GPU they hold whatever the registers held, so a kernel that uses them
  is wrong there; the interpreter alone would give 0 and hide it. ``loads_without_other`` lists such loads
  from the source, so that a check can name them once the NaN they bring is shown to come from them.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import re
import textwrap
import traceback

import numpy as np
import torch
import triton

from flashattn import runtime

from ._check import ExerciseFailed

SHAPE_ERRORS = ("incompatible dimensions", "not compatible for matmul", "reduction dimensions",
                "Cannot make_shape_compatible")
CONSTEXPR_HINT = ("shapes are fixed when the kernel is compiled: tl.arange, tl.zeros and tl.full take constexpr "
                  "sizes (the BLOCK parameters, declared `: tl.constexpr`), never N or another runtime argument; "
                  "the ragged end is handled with a mask. (The interpreter knows N's value and lets it pass; a "
                  "GPU compiler does not.)")
ACCUMULATOR_HINT = ("a variable updated in a loop keeps the type it starts with. The accumulator starts as one type "
                    "(e.g. tl.zeros(..., tl.float16)) and the loop assigns it another (tl.dot and the float32 "
                    "statistics give float32): start it as float32, tl.zeros([BLOCK_M, D], tl.float32), and convert "
                    "only when storing. (The interpreter converts silently; a GPU compiler refuses.)")
_HINTS = (  # (what the error says, any of them; the hint; the kind of line it is for: None for any)
    (("arange's range must be a power of 2",), "tl.arange(0, n) needs n to be a power of two and a constexpr: "
     "use the BLOCK size and a mask for the ragged end.", None),
    (("arange's arguments must be of type tl.constexpr", "must be of type `constexpr`", "must be constexpr",
      "shape element", "Shape element"), CONSTEXPR_HINT, None),
    (("must be >= 16",), "tl.dot needs at least 16 along every dimension.", None),
    (("unsupported AST node type: Break", "unsupported AST node type: Continue"), "a GPU kernel's loop has no break "
     "or continue: know the loop's bound before it starts (compute hi first, as the causal bound is) and let a "
     "mask hide what lies past the end.", None),
    (("Both operands must be same dtype",), "tl.dot multiplies two tiles of the same dtype: convert the "
     "float32 one, e.g. p.to(v.dtype), before the product.", None),
    (("Loop-carried variable",), ACCUMULATOR_HINT, None),
    (SHAPE_ERRORS, "the mask's shape does not fit the tile of pointers it guards: a mask on the rows of a K or V "
     "tile is built from offs_n (BLOCK_N rows), one on a Q or O tile from offs_m (BLOCK_M rows), and the mask "
     "of a (rows, D) tile is offs[:, None] < N.", "memory"),
    (SHAPE_ERRORS, "the shapes of the two tl.dot operands do not fit: (M, K) times (K, N).", "dot"),
    (SHAPE_ERRORS, "two tiles of different shapes were combined: check which offsets get [:, None] and which "
     "get [None, :].", None),
)


def _source(fn) -> str:
    return textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn)))


def _code(fn):
    return getattr(getattr(fn, "fn", fn), "__code__", None)


def learner_line(err: BaseException, functions) -> tuple[str, int, str] | None:
    """(function name, line of the function, the statement) where the learner's code raised ``err``: the
    innermost traceback frame in one of ``functions`` (interpreter mode), or the line a compile error points at
    (``at L:C`` counts from the def line, 1-based)."""
    chain = [err]
    while chain[-1].__cause__ is not None and chain[-1].__cause__ not in chain and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    codes = {(c.co_filename, c.co_name): fn for fn in functions if (c := _code(fn)) is not None}
    for e in reversed(chain):
        frames = [f for f in traceback.extract_tb(e.__traceback__) if (f.filename, f.name) in codes]
        if frames:
            frame = frames[-1]
            fn = codes[(frame.filename, frame.name)]
            line = frame.lineno - _code(fn).co_firstlineno + 1  # in the source as getsource gives it (decorators on)
            return frame.name, line - _def_line(fn), _statement(fn, line)
    for e in reversed(chain):  # a compile error: the innermost one in the learner's own source
        node, src = getattr(e, "node", None), getattr(e, "src", None)
        if node is None or not getattr(node, "lineno", None) or not isinstance(src, str):
            continue
        name = next((n for fn in functions if (n := getattr(fn, "__name__", "")) and f"def {n}(" in src), None)
        if name is not None:
            fn = next(f for f in functions if getattr(f, "__name__", "") == name)
            return name, node.lineno - 1, _statement(fn, _def_line(fn) + node.lineno - 1)
    return None


def _def_line(fn) -> int:
    """The line of ``def`` in fn's source (1-based; the decorators come before it)."""
    tree = ast.parse(_source(fn))
    return next(n.lineno for n in tree.body if isinstance(n, ast.FunctionDef))


def _statement(fn, row: int) -> str:
    """The statement (all its lines, joined) that spans line ``row`` (1-based, of fn's source) of fn."""
    source = _source(fn)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.For, ast.While, ast.If)) \
                and node.lineno <= row <= (node.end_lineno or node.lineno):
            best = node
    if best is None:
        lines = source.splitlines()
        return lines[row - 1].strip() if 0 < row <= len(lines) else ""
    return " ".join(line.strip() for line in ast.get_source_segment(source, best).splitlines())


def _kind(statement: str) -> str:
    if "tl.load" in statement or "tl.store" in statement:
        return "memory"
    if "tl.dot" in statement:
        return "dot"
    return "other"


def describe_error(err: BaseException, functions=()) -> str:
    """What went wrong, for the learner: the error, the learner's line (where it can be found) and a hint.
    Compiled for a GPU, an error inside a ``@triton.jit`` function that another one calls (the learner's step
    inside the course's kernel) is reported at every call site, each raised from the one below: the innermost
    error names the learner's own line and the reason."""
    chain = [err]
    while chain[-1].__cause__ is not None and chain[-1].__cause__ not in chain and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    texts = [str(e).strip() or type(e).__name__ for e in chain]
    where = learner_line(err, functions) if functions else None
    kind = _kind(where[2]) if where else None
    hint = next((h for keys, h, for_kind in _HINTS if (for_kind is None or for_kind == kind)
                 and any(key in t for key in keys for t in texts)), "")
    shown = texts[-2:]  # the learner's line, then the reason (the innermost error alone where there is one)
    if len(shown) == 2 and shown[1] in shown[0]:  # Triton's message already quotes the reason
        shown = shown[:1]
    lines = "\n".join(shown).splitlines()
    short = "\n".join(lines[-12:])
    at = f"\nIn line {where[1]} of {where[0]}: {where[2]}" if where and where[2] else ""
    return f"your kernel raised {type(chain[-1]).__name__}:\n{short}{at}" + (f"\nHint: {hint}" if hint else "")


@contextlib.contextmanager
def masked_lanes_undefined(enabled: bool = True):
    """In interpreter mode, a masked ``tl.load`` without ``other=`` reads NaN (floats) in its masked-off lanes, as
    undefined as a GPU's registers; elsewhere (or ``enabled=False``) nothing changes."""
    if not enabled or runtime.MODE != "interpreter":
        yield
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    original = type(builder).create_masked_load

    def create_masked_load(ptrs, mask, other, *flags):  # flags: the cache and volatile flags, which differ by release
        if other is None:
            dtype_tt = ptrs.get_element_ty()
            np_dtype = interpreter._get_np_dtype(dtype_tt)
            if np.issubdtype(np_dtype, np.floating):
                other = interpreter.TensorHandle(np.full(ptrs.data.shape, np.nan, dtype=np_dtype), dtype_tt)
        return original(builder, ptrs, mask, other, *flags)

    builder.create_masked_load = create_masked_load
    try:
        yield
    finally:
        del builder.create_masked_load


def _is_tl(node) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "tl"
    return isinstance(node, ast.Attribute) and node.attr == "language" and isinstance(node.value, ast.Name) \
        and node.value.id == "triton"


def loads_without_other(fn) -> list[str]:
    """'line N of the function: source' for each ``tl.load`` with a mask but no ``other=``."""
    source = _source(fn)
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    found = []
    for call in ast.walk(node):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "load"
                and _is_tl(call.func.value)):
            continue
        masked = len(call.args) > 1 or any(kw.arg == "mask" for kw in call.keywords)
        other = len(call.args) > 2 or any(kw.arg == "other" for kw in call.keywords)
        if masked and not other:
            text = " ".join(line.strip() for line in ast.get_source_segment(source, call).splitlines())
            found.append(f"line {call.lineno - node.lineno} of the function: {text}")
    return found


def undefined_lanes_message(where: str, loads: list[str]) -> str:
    return (f"{where}: the result has NaN, and it goes away when the masked-off lanes of these loads read 0 "
            "instead of NaN: " + "; ".join(loads) + ". A masked tl.load without other= leaves those lanes "
            "undefined (on a GPU they hold whatever the registers held; the check fills them with NaN to show it), "
            "and your kernel uses them. Give each load the value its masked lanes must have: other=0.0 before a "
            "sum or a tl.dot, other=float('-inf') before a max or a softmax.")


def check_undefined_lanes(fn, rerun, where: str) -> None:
    """ExerciseFailed when ``fn`` has masked loads without other= and the NaN in its result goes away when their
    masked-off lanes read 0 (``rerun()`` runs the case so and returns the result)."""
    loads = loads_without_other(fn)
    if loads and bool(torch.isfinite(rerun()).all()):
        raise ExerciseFailed(undefined_lanes_message(where, loads))


GPU_TARGETS = ((8, 0), (9, 0))  # an A100's and an H100's: the first specialization of a kernel is compiled for both
MORE_SPECIALIZATIONS = 1  # a later one (another dtype, CAUSAL), for the last target only: the 10-second budget
_compiled: dict = {}  # (the learner's sources, the specialization) -> None (compiles) or the failure's message
_specializations: dict = {}  # the learner's sources -> how many specializations were compiled


def compile_for_gpu(kernel, args: tuple, constexprs: dict, target: tuple[int, int]):
    """Compile ``kernel`` as ``kernel[grid](*args, **constexprs)`` would for ``target``, without a GPU. Returns
    None when it compiles and fits, else (the exception, or the compiler's message when there is none; the
    verdict). The one place the checks compile: it goes through ``flashattn.kernels.aot.compile_for``."""
    from flashattn.kernels import aot

    raised = []
    compile_target = aot._compile

    def keep(*a, **k):  # compile_for returns the compiler's message: keep its exception, for the line and reason
        try:
            return compile_target(*a, **k)
        except Exception as err:
            raised.append(err)
            raise

    aot._compile = keep
    try:
        result = aot.compile_for(kernel, args, constexprs, target)
    finally:
        aot._compile = compile_target
    if result.error is None and result.fits:
        return None
    return (raised[-1] if raised else result.error or ""), result.verdict()


def _key(value):
    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return type(value).__name__ + ("=1" if value == 1 else "")  # a launch specializes the integer 1
    if hasattr(value, "fn") or callable(value):
        return _source(value)
    return repr(value)


def _compile_ahead(kernel, functions, args, kwargs, where: str) -> None:
    """In interpreter mode: compile this launch's specialization for a GPU (see GPU_TARGETS), once, and raise
    ExerciseFailed with the learner's line and a hint when a GPU compiler refuses it."""
    if runtime.MODE != "interpreter" or os.environ.get("FLASHATTN_COMPILE_AHEAD", "1") == "0":
        return  # on a GPU the launch itself compiles; FLASHATTN_COMPILE_AHEAD=0 turns it off (the mutant tests)
    try:
        learner = tuple(_source(fn) for fn in functions)
    except (OSError, TypeError):
        return
    spec = (learner, _source(kernel), tuple(_key(a) for a in args),
            tuple(sorted((k, _key(v)) for k, v in kwargs.items())))
    if spec not in _compiled:
        done = _specializations.get(learner, 0)
        if done > MORE_SPECIALIZATIONS:
            return
        targets = GPU_TARGETS if done == 0 else GPU_TARGETS[-1:]
        _specializations[learner] = done + 1
        failure = None
        for target in targets:
            try:
                found = compile_for_gpu(kernel, args, kwargs, target)
            except Exception:  # noqa: BLE001  (the call itself is wrong: the interpreter's launch says how)
                return
            if found is not None:
                failure = describe_compile_error(found, functions, f"sm_{target[0]}{target[1]}")
                break
        if len(_compiled) > 256:
            _compiled.clear()
        _compiled[spec] = failure
    if _compiled[spec] is not None:
        raise ExerciseFailed(f"{where}: {_compiled[spec]}")


_SHORT_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int32": "int32", "int64": "int64"}


def _first_assignment(name: str, functions) -> tuple[str, int, str] | None:
    """(function, line, statement) where ``name`` gets its first value in one of the learner's functions."""
    for fn in functions:
        source = _source(fn)
        node = next((n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)), None)
        for stmt in ast.walk(node) if node else ():
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                text = " ".join(line.strip() for line in ast.get_source_segment(source, stmt).splitlines())
                return node.name, stmt.lineno - node.lineno, text
    return None


def _dot_accumulator(statement: str) -> str | None:
    """The name a ``tl.dot`` in this statement adds into (its third argument, or ``acc=``), if there is one."""
    try:
        tree = ast.parse(statement.strip())
    except SyntaxError:
        return None
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "dot":
            acc = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "acc"), None)
            return acc.id if isinstance(acc, ast.Name) else None
    return None


def _accumulator_line(reason: str, where, functions) -> str:
    """Where the accumulator gets its first value, when the compile error is about its type. Triton 3.8 and later
    say so ("Loop-carried variable acc has initial type fp16 ..."); 3.6 and 3.7 stop with a bare assertion at the
    ``tl.dot(a, b, acc)`` that adds into it, so there the dtype is read off the accumulator's first assignment."""
    match = re.search(r"Loop-carried variable (\w+) has initial type .*?(fp16|bf16|fp32|int32|int64)\b", reason)
    if match:
        name, dtype = match.groups()
        first = _first_assignment(name, functions)
    else:
        name = _dot_accumulator(where[2]) if where and where[2] else None
        first = _first_assignment(name, functions) if name else None
        dtype = next((short for long, short in _SHORT_DTYPES.items() if first and f"tl.{long}" in first[2]), None)
        if dtype in (None, "fp32"):
            return ""
    return f"\n{name} starts as {dtype} in line {first[1]} of {first[0]}: {first[2]}" if first else ""


def describe_compile_error(found, functions, target: str) -> str:
    error, verdict = found
    if isinstance(error, BaseException):
        chain = [error]
        while chain[-1].__cause__ is not None and chain[-1].__cause__ not in chain and len(chain) < 10:
            chain.append(chain[-1].__cause__)
        texts = [str(e).strip() for e in chain]
        reason = next((t.splitlines()[-1] for t in reversed(texts) if t and not t.endswith("^")), texts[-1])
        reason = reason or f"{type(chain[-1]).__name__}, without a message (Triton {triton.__version__})"
        where = learner_line(error, functions)
    else:
        texts, reason, where = [error], (error.strip().splitlines() or [verdict])[-1], None
    kind = _kind(where[2]) if where else None
    hint = next((h for keys, h, for_kind in _HINTS if (for_kind is None or for_kind == kind)
                 and any(key in t for key in keys for t in texts)), "")
    if not hint and "not compile" not in verdict:
        hint = f"the compiled kernel does not fit the GPU: {verdict}."
    accumulator = _accumulator_line(reason, where, functions)
    if accumulator and not hint:
        hint = ACCUMULATOR_HINT
    at = f"\nIn line {where[1]} of {where[0]}: {where[2]}" if where and where[2] else ""
    return (f"compiled for a GPU ({target}), your kernel is refused: {verdict}. The interpreter ran it, but a GPU "
            f"would stop at the first launch, before any result.\n{reason}{at}"
            + accumulator + (f"\nHint: {hint}" if hint else ""))


def launch(kernel, grid, *args, where: str, source=None, undefined_lanes: bool = True, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``; an error becomes ExerciseFailed that names the case and the learner's
    line (``source``: the learner's function(s), the kernel itself by default). In interpreter mode the launch is
    first compiled for a GPU (``_compile_ahead``), and masked-off lanes of loads without other= read NaN unless
    ``undefined_lanes=False``."""
    functions = (source if isinstance(source, (tuple, list)) else (source,)) if source is not None else (kernel,)
    _compile_ahead(kernel, functions, args, kwargs, where)
    try:
        with masked_lanes_undefined(undefined_lanes):
            kernel[grid](*args, **kwargs)
        if runtime.DEVICE.type == "cuda":
            torch.cuda.synchronize()
    except Exception as err:  # the learner's kernel may fail in any way: report it with the case
        raise ExerciseFailed(f"{where}: {describe_error(err, functions)}") from err
