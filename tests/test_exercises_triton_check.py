"""flashattn.exercises.triton_check: the machinery behind the Triton exercises' checks."""

import flashattn  # noqa: F401, I001  (first: it sets the mode before Triton is imported)

import pytest
import torch
import triton
import triton.language as tl

from flashattn import runtime
from flashattn.exercises import ExerciseFailed
from flashattn.exercises._check import _NotAttempted
from flashattn.exercises.triton_check import (
    describe_error,
    SENTINEL,
    Buffer,
    check_writes,
    close,
    launch,
    require_jit,
    unmasked_memory_ops,
    uses_call,
)


@triton.jit
def stub_kernel(X, N, BLOCK: tl.constexpr):
    """A docstring does not count as an attempt."""
    # TODO
    pass


@triton.jit
def copy_kernel(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, offs < N)  # the mask given by position
    tl.store(Y + offs, tl.trans(x[None, :])[:, 0], mask=offs < N)


@triton.jit
def unmasked_kernel(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs))


@triton.jit
def arange_of_n_kernel(X, N):
    offs = tl.arange(0, N)
    tl.store(X + offs, 1.0)


def test_require_jit():
    with pytest.raises(_NotAttempted):
        require_jit(stub_kernel, "the kernel")
    require_jit(copy_kernel, "the kernel")  # an attempt: no exception
    with pytest.raises(ExerciseFailed, match="put @triton.jit"):
        require_jit(copy_kernel.fn, "the kernel")


def test_unmasked_memory_ops_and_uses_call():
    assert unmasked_memory_ops(copy_kernel) == []
    found = unmasked_memory_ops(unmasked_kernel)
    assert len(found) == 2 and all("line 2 of the function" in f for f in found)
    assert uses_call(copy_kernel, "trans") and not uses_call(unmasked_kernel, "trans")


def test_buffer_finds_writes_outside_and_unwritten_elements():
    out = Buffer((3, 5), torch.float32, pad=(2, 4))
    assert out.view.shape == (3, 5) and out.view.stride() == (9, 1) and bool((out.view == SENTINEL).all())
    assert out.outside_writes() == [] and bool(out.unwritten().all())
    out.view[:, :4] = 1.0
    out.flat[out.guard + 5] = 2.0  # row 0, column 5: in the padding after the row
    assert out.unwritten().sum() == 3
    assert out.outside_writes() == [out.guard + 5]
    assert out.where(out.guard + 5) == "element [0, 5] (outside the tensor: dimension 1 has size 5)"
    assert "before the start" in out.where(out.guard - 2)
    assert "past the end of the tensor's memory" in out.where(out.guard + 5 * 9)
    with pytest.raises(ExerciseFailed, match=r"here: your kernel wrote 1 element\(s\) outside Y, e.g. at element "
                       r"\[0, 5\] \(outside the tensor: dimension 1 has size 5\)\. mask it"):
        check_writes(out, "Y", "here", "mask it", far="offsets")
    out.flat[-1] = 3.0
    with pytest.raises(ExerciseFailed, match="offsets"):
        check_writes(out, "Y", "here", "mask it", far="offsets")


def test_buffer_layouts_and_numbered_memory():
    x = Buffer((2, 3, 4), torch.float32, order=(0, 2, 1), pad=(0, 0, 1), fill="numbered")
    assert x.view.shape == (2, 3, 4) and not x.view.is_contiguous()
    assert x.view.stride() == (15, 1, 3)  # memory is (2, 4 + 1, 3)
    for index in ((0, 0, 0), (1, 2, 3), (0, 1, 2)):
        assert x.index_of(x.view[index].item()) == index
    assert x.index_of(1.0) is None and "before the start" in x.origin(1.0)
    values = torch.randn(2, 3)
    y = Buffer((2, 3), torch.float16, fill=float("nan"), values=values)
    assert torch.equal(y.view.float().cpu(), values.half().float()) and torch.isnan(y.flat[: y.guard]).all()


def test_close_compares_nan_and_infinity_positions():
    ref = torch.tensor([1.0, float("-inf"), float("nan")])
    assert close(ref + 1e-9, ref, 1e-6)
    assert not close(torch.tensor([1.0, float("-inf"), 0.0]), ref, 1e-6)
    assert not close(torch.tensor([1.0, float("inf"), float("nan")]), ref, 1e-6)
    assert not close(torch.tensor([1.1, float("-inf"), float("nan")]), ref, 1e-6)


@pytest.mark.parametrize("compile_ahead", ["1", "0"])
def test_launch_names_the_case_and_gives_a_hint(compile_ahead, monkeypatch):
    """The same line and hint whether the compile for a GPU (interpreter mode) or the launch finds the mistake."""
    monkeypatch.setenv("FLASHATTN_COMPILE_AHEAD", compile_ahead)
    x = torch.zeros(8, device=runtime.DEVICE)
    first = "your kernel is refused" if compile_ahead == "1" and runtime.MODE == "interpreter" else "your kernel raised"
    with pytest.raises(ExerciseFailed, match=rf"(?s)case 7: .*{first}.*In line 1 of arange_of_n_kernel: "
                       r"offs = tl.arange\(0, N\).*Hint: .*tl.arange, tl.zeros and tl.full take constexpr sizes"):
        launch(arange_of_n_kernel, (1,), x, 8, where="case 7")


def test_an_error_inside_a_called_jit_function_is_reported_from_the_inside():
    """Compiled for a GPU, an error in the learner's step (a jit function the course's kernel calls) is raised at
    the call site, from the inner error: the report shows the inner line and reason, and the hint follows it."""
    try:
        try:
            raise AssertionError("Both operands must be same dtype. Got fp32 and fp16")
        except AssertionError as inner:
            raise RuntimeError("at 12:8:\n    dsij = DS_STEP(qi, kj, vj)\n           ^") from inner
    except RuntimeError as outer:
        text = describe_error(outer)
    assert "DS_STEP(qi, kj, vj)" in text and "same dtype" in text and "convert the float32 one" in text, text
    assert text.startswith("your kernel raised AssertionError")
