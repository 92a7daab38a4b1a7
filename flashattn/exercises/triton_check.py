"""Machinery for the checks of kernels the learner writes in Triton.

* ``require_jit(kernel, what)``: the learner's object must be a ``@triton.jit`` function; one whose body
  is still only ``pass`` (the stub as the notebook gives it) is "not attempted yet".
* ``Buffer``: a tensor view in the middle of a larger buffer, with padding after the end of chosen
  dimensions and guard elements before and after. An output buffer starts filled with a sentinel, so
  that after the launch the check can find writes outside the tensor (``outside_writes``) and elements
  never written (``unwritten``). An input buffer has NaN around it, so that a read past the end of a
  row brings NaN into the result instead of a neighbour's numbers; or, for stride exercises, a
  different integer in every element (``numbered``), so that each output value says where it was read.
* ``launch`` (from ``triton_launch``): runs the kernel as a GPU would; an exception becomes
  ``ExerciseFailed`` naming the case, the learner's line and, for the usual Triton errors, what to change.
* ``unmasked_memory_ops``: the ``tl.load``/``tl.store`` calls written without a mask (a read past the end
  leaves no trace in the output, so the checks also read the source).
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap

import torch

from flashattn import runtime
from flashattn.kernels.triton_compat import KernelInterface

from ._check import ExerciseFailed, _NotAttempted
from .triton_launch import SHAPE_ERRORS, describe_error, launch, loads_without_other  # noqa: F401  (re-exported)

SENTINEL = -999.0  # what an output buffer holds before the kernel runs (exact in float16 and float32)

_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


def _source(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    return textwrap.dedent(inspect.getsource(fn))


def _function_node(kernel) -> ast.FunctionDef:
    tree = ast.parse(_source(kernel))
    return next(node for node in tree.body if isinstance(node, ast.FunctionDef))


def require_jit(kernel, what: str) -> None:
    """Raise 'not attempted' for an untouched stub, ExerciseFailed for anything but a @triton.jit function."""
    if not isinstance(kernel, KernelInterface):
        raise ExerciseFailed(f"{what} should be a @triton.jit function, got {type(kernel).__name__}: "
                             "put @triton.jit on the line above def.")
    body = [stmt for stmt in _function_node(kernel).body
            if not (isinstance(stmt, ast.Pass)
                    or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)))]
    if not body:
        raise _NotAttempted


def _is_triton_language(node) -> bool:
    """``tl`` or ``triton.language`` (not, e.g., a tensor descriptor's own .load)."""
    if isinstance(node, ast.Name):
        return node.id == "tl"
    return isinstance(node, ast.Attribute) and node.attr == "language" and isinstance(node.value, ast.Name) \
        and node.value.id == "triton"


def unmasked_memory_ops(kernel) -> list[str]:
    """'line N: source' for each tl.load / tl.store call that has no mask."""
    node = _function_node(kernel)
    lines = _source(kernel).splitlines()
    found = []
    for call in ast.walk(node):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("load", "store") and _is_triton_language(call.func.value)):
            continue
        mask_position = 1 if call.func.attr == "load" else 2
        has_mask = len(call.args) > mask_position or any(kw.arg in ("mask", "boundary_check")
                                                         for kw in call.keywords)
        if not has_mask:
            row = call.lineno - node.lineno
            found.append(f"line {row} of the function: {lines[call.lineno - 1].strip()}")
    return found


def require_masks(kernel, why: str) -> None:
    """ExerciseFailed if a tl.load or tl.store has no mask (checked after the numbers are right)."""
    missing = unmasked_memory_ops(kernel)
    if missing:
        raise ExerciseFailed(
            "the results are right on the check's inputs, but this memory access has no mask: "
            + "; ".join(missing) + f". {why} On a GPU an unmasked access past the end of a tensor reads or "
            "writes whatever memory lies there (or stops the program with an illegal address).")


def uses_call(kernel, name: str) -> bool:
    """Whether the kernel's source calls tl.<name> (e.g. 'trans')."""
    return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == name
               for c in ast.walk(_function_node(kernel)))


class Buffer:
    """A tensor of ``shape`` inside a larger buffer: padding after dimensions, guards around it.

    ``order`` lists the dimensions from outermost to innermost in memory (default: as given), e.g.
    ``(0, 2, 1, 3)`` stores a (B, H, N, D) tensor as (B, N, H, D), the layout of a projection output.
    ``pad`` gives the extra elements after each dimension (in the order of ``shape``), ``step`` the memory
    positions from one index of a dimension to the next (in units of that dimension's padded stride): with
    ``step = (1, 1, 1, 2)`` the last dimension has stride 2, every other element of memory belonging to the
    tensor (so that a kernel that assumes a unit stride reads the elements between).
    ``fill``: a number for every element outside the tensor (and inside it, for an output), or
    ``"numbered"``: element i of the whole buffer holds the value i + 1 (then ``view`` holds those too,
    unless ``values`` are given). ``gaps``: what the memory between the tensor's elements (its padding)
    holds instead, a number or ``"noise"`` (random normal numbers, fixed by ``seed``), so that a read
    through the wrong strides brings in numbers that say which strides they came from, not NaN everywhere.
    """

    def __init__(self, shape, dtype, *, pad=None, order=None, step=None, fill=SENTINEL, values=None, device=None,
                 gaps=None, seed=0):
        shape = tuple(int(s) for s in shape)
        pad = tuple(pad) if pad is not None else (0,) * len(shape)
        order = tuple(order) if order is not None else tuple(range(len(shape)))
        step = tuple(step) if step is not None else (1,) * len(shape)
        device = runtime.DEVICE if device is None else device
        padded = [(shape[d] + pad[d]) * step[d] for d in order]
        span = math.prod(padded)
        # generous guards: a wrong stride can land far past the end, and the interpreter (like the GPU) would
        # then touch memory that is not the check's (or crash the process) instead of a guard element
        self.guard = max(8 * span, 1 << 16)
        total = 2 * self.guard + span
        self.numbered = fill == "numbered"
        if self.numbered:
            self.flat = torch.arange(1, total + 1, dtype=torch.float64).to(device=device, dtype=dtype)
        else:
            self.flat = torch.full((total,), float(fill), dtype=dtype, device=device)
        inner = self.flat[self.guard:self.guard + span].view(padded)
        tensor = tuple(slice(0, shape[d] * step[d], step[d]) for d in order)
        view = inner[tensor]
        inverse = [order.index(d) for d in range(len(shape))]
        self.view = view.permute(inverse)
        if values is not None:
            self.view.copy_(values.to(device=device, dtype=dtype))
        self.shape, self.order, self.padded, self.step = shape, order, padded, step
        self.inside = torch.zeros(total, dtype=torch.bool, device=device)
        self.inside[self.guard:self.guard + span].view(padded)[tensor] = True
        if gaps is not None:
            gap = torch.zeros(total, dtype=torch.bool, device=device)
            gap[self.guard:self.guard + span] = ~self.inside[self.guard:self.guard + span]
            if gaps == "noise":
                noise = torch.randn(int(gap.sum()), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
                self.flat[gap] = noise.to(device=device, dtype=dtype)
            else:
                self.flat[gap] = float(gaps)
        self.initial = self.flat.clone()

    @property
    def offset(self) -> int:
        """The flat position of the tensor's first element."""
        return self.view.storage_offset()

    def _memory_index(self, flat_index: int) -> list[int]:
        """The index into the padded memory (in the tensor's dimension order) of a flat position inside it."""
        inner = flat_index - self.guard
        index = [0] * len(self.shape)
        for size, d in zip(reversed(self.padded), reversed(self.order), strict=True):
            index[d] = inner % size
            inner //= size
        return index

    def _changed(self) -> torch.Tensor:
        int_dtype = _INT_VIEW[self.flat.dtype]
        return self.flat.view(int_dtype) != self.initial.view(int_dtype)

    def where(self, flat_index: int) -> str:
        """Where a flat position lies, in words: before/after the tensor, or its padded index."""
        if flat_index < self.guard:
            return f"{self.guard - flat_index} element(s) before the start of the tensor"
        inner = flat_index - self.guard
        if inner >= math.prod(self.padded):
            return f"{inner - math.prod(self.padded) + 1} element(s) past the end of the tensor's memory"
        memory = self._memory_index(flat_index)
        index = [m // s for m, s in zip(memory, self.step, strict=True)]
        past = [f"dimension {d} has size {self.shape[d]}" for d in range(len(self.shape)) if index[d] >= self.shape[d]]
        between = [f"between two elements of dimension {d} (stride {self.view.stride(d)})"
                   for d in range(len(self.shape)) if memory[d] % self.step[d]]
        if between and not past:
            return f"a position inside the tensor's memory that holds no element of it, {', '.join(between)}"
        if not past:
            return f"element {list(index)}"
        return f"element {list(index)} (outside the tensor: {', '.join(past + between)})"

    def written(self) -> tuple[list[int], list[float]]:
        """Flat positions (relative to the tensor's first element) the kernel changed, and their values."""
        changed = torch.nonzero(self._changed()).flatten()
        return (changed - self.guard).tolist(), self.flat[changed].double().tolist()

    def beyond(self, flat_index: int) -> bool:
        """Whether a flat position lies before the tensor's memory or after all of it (not in its padding)."""
        return not self.guard <= flat_index < self.guard + math.prod(self.padded)

    def outside_writes(self) -> list[int]:
        """Flat positions outside the tensor that the kernel changed."""
        return torch.nonzero(self._changed() & ~self.inside).flatten().tolist()

    def unwritten(self) -> torch.Tensor:
        """Boolean tensor shaped like the view: True where the kernel left the sentinel."""
        int_dtype = _INT_VIEW[self.flat.dtype]
        sentinel = torch.tensor(SENTINEL, dtype=self.flat.dtype, device=self.flat.device).view(int_dtype)
        return self.view.contiguous().view(int_dtype) == sentinel

    def origin(self, value: float) -> str:
        """For a 'numbered' buffer: where a value read from it came from, in words."""
        if not math.isfinite(value) or value != int(value) or not 1 <= value <= self.flat.numel():
            return f"{value:g}, which is no element of the buffer"
        return self.where(int(value) - 1)

    def index_of(self, value: float):
        """For a 'numbered' buffer: the tensor index a value was read from, or None (outside it)."""
        if not math.isfinite(value) or value != int(value):
            return None
        flat = int(value) - 1
        if not (0 <= flat < self.flat.numel()) or not bool(self.inside[flat]):
            return None
        return tuple(m // s for m, s in zip(self._memory_index(flat), self.step, strict=True))


def check_writes(out: Buffer, name: str, where: str, how: str, far: str | None = None) -> None:
    """ExerciseFailed if the kernel wrote outside ``out``: names the first such element. ``far`` is the advice
    when some writes land beyond the tensor's memory altogether (not just past the end of a row)."""
    outside = out.outside_writes()
    if outside:
        beyond = [i for i in outside if out.beyond(i)]
        first, advice = (beyond[0], far) if beyond and far else (outside[0], how)
        raise ExerciseFailed(
            f"{where}: your kernel wrote {len(outside)} element(s) outside {name}, e.g. at "
            f"{out.where(first)}. {advice}")


def close(out: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    """Same NaN/±inf positions, and the finite values within ``tol`` relative (Frobenius) error."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    if out.shape != ref.shape:
        return False
    special = ~torch.isfinite(ref)
    if not torch.equal(special, ~torch.isfinite(out)):
        return False
    if special.any() and not torch.equal(out[special].nan_to_num(), ref[special].nan_to_num()):
        return False
    a, b = out[~special], ref[~special]
    if b.numel() == 0:
        return True
    return bool((a - b).norm() <= tol * b.norm().clamp_min(1e-30) + 1e-30)


def tolerance(dtype: torch.dtype) -> float:
    """Relative error a right kernel stays within, against float64, for this input dtype."""
    return {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]


def near_miss_hint(err: float, dtype: torch.dtype) -> str:
    """For a float32 result that is close but not exact: on a GPU the usual cause is TF32."""
    if dtype == torch.float32 and err < 1e-2:
        if runtime.MODE == "gpu":
            return (" This is about the rounding of TF32 (10-bit mantissa): on a GPU a float32 tl.dot uses "
                    "TF32 unless you pass input_precision=PRECISION (the check passes 'ieee').")
        return " That is more than float32 rounding: did you convert to float16 somewhere?"
    return ""
