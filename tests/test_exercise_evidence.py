"""The machinery the checks name mistakes with: layouts with no unit stride, what a wrong result shows, the stride
suspects and their models, masked lanes without other=, the learner's line in an error."""

import flashattn  # noqa: F401, I001  (first: it sets the mode before Triton is imported)

import math

import pytest
import torch
import triton
import triton.language as tl

from flashattn import runtime
from flashattn.exercises import ExerciseFailed
from flashattn.exercises.attention_cases import (
    MIXED,
    Case,
    first_bad_row,
    input_buffers,
    output_buffer,
    random_qkv,
)
from flashattn.exercises.evidence import Named, contiguous_strides, known, positions, ranges, read_as, stride_suspects
from flashattn.exercises.triton_check import Buffer
from flashattn.exercises.triton_launch import launch, loads_without_other, masked_lanes_undefined


@triton.jit
def masked_copy_kernel(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < N)  # no other=: the masked-off lanes are undefined on a GPU
    tl.store(Y + offs, x)


@triton.jit
def bad_shape_kernel(X, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    rows = tl.arange(0, 2 * BLOCK)
    x = tl.load(X + offs[:, None], mask=rows[:, None] < N, other=0.0)
    tl.store(X + offs[:, None], x)


def test_a_buffer_with_steps_and_noise_between_its_elements():
    values = torch.randn(2, 3, 4)
    b = Buffer((2, 3, 4), torch.float32, order=(0, 2, 1), pad=(0, 1, 1), step=(1, 1, 2), fill=float("nan"),
               gaps="noise", values=values)
    assert b.view.stride() == (40, 1, 8) and torch.equal(b.view.cpu(), values)
    gap = b.flat[b.guard:b.guard + math.prod(b.padded)][~b.inside[b.guard:b.guard + math.prod(b.padded)]]
    assert torch.isfinite(gap).all() and torch.isnan(b.flat[:b.guard]).all()  # noise between, NaN around
    assert "holds no element" in b.where(b.offset + 4)  # between two elements of dimension 2
    n = Buffer((2, 3), torch.float32, step=(1, 2), fill="numbered")
    assert n.index_of(n.view[1, 2].item()) == (1, 2) and n.index_of(n.view[1, 2].item() + 1) is None


@pytest.mark.parametrize("case", [Case("x", 2, 2, 17, 16, True, layout="mixed"),
                                  Case("y", 1, 2, 100, 16, True, torch.float16, "mixed")])
def test_the_mixed_layout_shares_no_stride_and_has_none_contiguous(case):
    q, k, v = input_buffers(case, random_qkv(case, 0))
    o = output_buffer(case, "o", (case.B, case.H, case.N, case.D), case.dtype, 32)
    strides = [t.view.stride() for t in (q, k, v, o)]
    contiguous = contiguous_strides((case.B, case.H, case.N, case.D))
    assert len({s for st in strides for s in st}) == 16  # no two tensors (or dimensions) share a stride
    assert all(st[d] != contiguous[d] for st in strides for d in range(4))  # the last dimension included
    assert set(MIXED) == {"q", "k", "v", "o", "s"}


def test_known_says_where_and_how_without_a_cause():
    ref = torch.randn(2, 8, 4, dtype=torch.float64)
    got = ref.clone()
    got[1, 3:6] *= 2.0
    text = known(got, ref, 1e-5)
    assert "wrong in 1 of 2 heads" in text and "rows 3-5" in text and "times a factor (2)" in text, text
    assert "off by the same 0.5" in known(ref + 0.5, ref, 1e-5)
    # off by half the threshold (10 * tol of the largest |ref|) everywhere: at the threshold itself rounding decides
    assert "no element stands out" in known(ref * (1 + 5e-7), ref, 1e-7)
    assert first_bad_row(ref * (1 + 1e-6), ref, 1e-4) is None  # a result off by a little everywhere: no crash
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"


def test_stride_suspects_and_their_models():
    case = Case("x", 2, 2, 17, 16, True, layout="mixed")
    q, k, v = input_buffers(case, random_qkv(case, 0))
    K, Q = Named("K", k, "bhnd"), Named("Q", q, "bhnd")
    suspects = dict((strides, text) for text, strides in stride_suspects(K, [Q]))
    assert K.strides not in suspects and len(suspects) == len(stride_suspects(K, [Q]))  # each once, never its own
    with_q_n = K.strides[:2] + (Q.strides[2],) + K.strides[3:]
    assert "stride_qn (= 64) where stride_kn (= 51) belongs" in suspects[with_q_n]
    assert torch.equal(read_as(k, K.strides), k.view.double().cpu())
    assert read_as(k, (10 ** 9, 1, 1, 1)) is None  # would leave the buffer
    index = torch.tensor([[0, 0, 0, 0], [1, 1, 16, 15]])
    last = k.offset + sum(i * s for i, s in zip((1, 1, 16, 15), K.strides, strict=True))
    assert positions(k, K.strides, index) == {k.offset, last}


def test_masked_lanes_without_other_read_nan_in_the_interpreter():
    x = torch.arange(8, dtype=torch.float32, device=runtime.DEVICE)
    y = torch.zeros(8, device=runtime.DEVICE)
    assert loads_without_other(masked_copy_kernel) == ["line 2 of the function: tl.load(X + offs, mask=offs < N)"]
    with masked_lanes_undefined():
        masked_copy_kernel[(1,)](x, y, 5, BLOCK=8)
    if runtime.MODE == "interpreter":
        assert torch.isnan(y[5:]).all() and torch.equal(y[:5], x[:5])
    with masked_lanes_undefined(enabled=False):
        masked_copy_kernel[(1,)](x, y, 5, BLOCK=8)
    assert torch.equal(y[:5], x[:5])


def test_a_shape_error_in_a_load_gets_the_mask_hint_with_the_line():
    x = torch.zeros(16, device=runtime.DEVICE)
    with pytest.raises(ExerciseFailed, match=r"(?s)In line 3 of bad_shape_kernel: x = tl.load\(X \+ offs\[:, None\], "
                       r"mask=rows\[:, None\] < N, other=0.0\).*Hint: the mask's shape does not fit"):
        launch(bad_shape_kernel, (1,), x, 16, BLOCK=16, where="here")
