"""flashattn.exercises.intro: each check passes the right answer, says 'not attempted' for a stub,
and names the mistake for each wrong answer it is meant to catch."""

import math

import pytest
import torch

from flashattn.exercises import ExerciseFailed
from flashattn.exercises.intro import (
    check_attainable,
    check_attention,
    check_intermediate_bytes,
    check_matmul_intensity,
)


def stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("check", [check_matmul_intensity, check_attainable, check_attention,
                                   check_intermediate_bytes])
def test_stub_is_not_attempted(check, capsys):
    assert check(stub) is False
    assert "not attempted" in capsys.readouterr().out


# --- matmul intensity ----------------------------------------------------------------------------


def matmul_right(M, N, K, b):
    return 2 * M * N * K / ((M * K + K * N + M * N) * b)


def test_matmul_intensity_passes_the_right_answer(capsys):
    assert check_matmul_intensity(matmul_right) is True
    assert "passed" in capsys.readouterr().out
    assert check_matmul_intensity(lambda M, N, K, b: torch.tensor(matmul_right(M, N, K, b))) is True


@pytest.mark.parametrize("wrong, diagnosis", [
    (lambda M, N, K, b: 2 * M * N * K / ((M * K + K * N) * b), "left out the write of C"),
    (lambda M, N, K, b: 2 * M * N * K / (M * K + K * N + M * N), "elements, not bytes"),
    (lambda M, N, K, b: M * N * K / ((M * K + K * N + M * N) * b), "multiply-add"),
    (lambda M, N, K, b: matmul_right(M, N, K, b) / 8, "bits"),
    (lambda M, N, K, b: 1 / matmul_right(M, N, K, b), "bytes per FLOP"),
    (lambda M, N, K, b: 2 * M * N * K / (M * K + K * N), "left out the write of C and counted elements"),
    (lambda M, N, K, b: 2 * M * N * K / (3 * M * K * b), "for M=1024, N=256, K=4096"),  # square-only formula
    (lambda M, N, K, b: "lots", "one number"),
])
def test_matmul_intensity_diagnoses(wrong, diagnosis):
    with pytest.raises(ExerciseFailed, match=diagnosis):
        check_matmul_intensity(wrong)


# --- attainable throughput -----------------------------------------------------------------------


def test_attainable_passes_the_right_answer():
    assert check_attainable(lambda i, peak, gbps: min(peak, i * gbps / 1000)) is True


@pytest.mark.parametrize("wrong, diagnosis", [
    (lambda i, peak, gbps: max(peak, i * gbps / 1000), "min, not max"),
    (lambda i, peak, gbps: peak, "always return the compute peak"),
    (lambda i, peak, gbps: min(peak, i * gbps * 1000), "always return the compute peak"),
    (lambda i, peak, gbps: i * gbps / 1000, "even above the ridge point"),
    (lambda i, peak, gbps: min(peak, i * gbps), "1000× too big"),
    (lambda i, peak, gbps: min(peak, i * gbps / 1024), "for intensity=10.0"),
])
def test_attainable_diagnoses(wrong, diagnosis):
    with pytest.raises(ExerciseFailed, match=diagnosis):
        check_attainable(wrong)


# --- attention in PyTorch ------------------------------------------------------------------------


def make_attention(*, scale="right", dim=-1, mask="before", direction="lower", ignore_causal=False):
    """The 4-line attention, with one mistake switched on."""

    def attention(q, k, v, causal=False):
        N, D = q.shape[-2], q.shape[-1]
        s = q @ k.transpose(-1, -2) * {"right": 1 / math.sqrt(D), "none": 1.0, "1/D": 1 / D,
                                       "sqrt": math.sqrt(D)}[scale]
        hidden = torch.ones(N, N, dtype=torch.bool).triu(1)
        if direction == "upper":
            hidden = torch.ones(N, N, dtype=torch.bool).tril(-1)
        elif direction == "with diagonal":
            hidden = torch.ones(N, N, dtype=torch.bool).tril(0)
        if causal and not ignore_causal and mask == "before":
            s = s.masked_fill(hidden, float("-inf"))
        if causal and not ignore_causal and mask == "zero":
            s = s.masked_fill(hidden, 0.0)
        p = torch.softmax(s, dim=dim)
        if causal and not ignore_causal and mask == "after":
            p = p.masked_fill(hidden, 0.0)
        if causal and not ignore_causal and mask == "after -inf":
            p = p.masked_fill(hidden, float("-inf"))
        return p @ v

    return attention


def test_attention_passes_the_right_answer(capsys):
    assert check_attention(make_attention()) is True
    assert "passed" in capsys.readouterr().out


def test_attention_passes_sdpa():
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert check_attention(lambda q, k, v, causal=False: sdpa(q, k, v, is_causal=causal)) is True


@pytest.mark.parametrize("wrong, diagnosis", [
    (make_attention(scale="none"), "causal=False: the scale is missing"),
    (make_attention(scale="1/D"), "the scale is 1/D"),
    (make_attention(scale="sqrt"), "the scale is sqrt"),
    (make_attention(dim=-2), "causal=False: the softmax runs over the wrong dimension"),
    (make_attention(ignore_causal=True), "causal=True: there is no causal mask"),
    (make_attention(direction="upper"), "causal=True: the causal mask points the wrong way"),
    (make_attention(mask="after"), "causal=True: the mask is applied after the softmax"),
    (make_attention(mask="zero"), "set to 0, not -inf"),
    (make_attention(mask="after -inf"), "NaN or inf"),
    (make_attention(direction="with diagonal"), "NaN or inf"),
    (make_attention(direction="upper", scale="none"), "causal=False: the scale is missing"),
    (lambda q, k, v, causal=False: make_attention()(q, k, v, causal=not causal),
     "causal=False: you applied a causal mask"),
    (lambda q, k, v, causal=False: make_attention()(q, k, v, causal) * 1.01, "relative error"),
    (lambda q, k, v: make_attention()(q, k, v), "must accept a causal keyword"),
    (lambda q, k, v, causal=False: make_attention()(q, k, v, causal)[..., :-1], "shape"),
    (lambda q, k, v, causal=False: make_attention()(q, k, v, causal).tolist(), "return a tensor"),
])
def test_attention_diagnoses(wrong, diagnosis):
    with pytest.raises(ExerciseFailed, match=diagnosis):
        check_attention(wrong)


def test_attention_lets_other_errors_through():
    def broken(q, k, v, causal=False):
        return q @ k  # (B, H, N, D) @ (B, H, N, D): a shape error of the learner's own
    with pytest.raises(RuntimeError):
        check_attention(broken)


# --- the bytes of S and P ------------------------------------------------------------------------


def bytes_right(B, H, N, D, b):
    return B * H * N * N * 4, B * H * N * N * b


def test_intermediate_bytes_passes_the_right_answer(capsys):
    assert check_intermediate_bytes(bytes_right) is True
    assert "GiB" in capsys.readouterr().out
    assert check_intermediate_bytes(lambda *a: list(bytes_right(*a))) is True


@pytest.mark.parametrize("wrong, diagnosis", [
    (lambda B, H, N, D, b: (B * H * N * N, B * H * N * N), "elements, not bytes"),
    (lambda B, H, N, D, b: (N * N * 4, N * N * b), "left out B·H"),
    (lambda B, H, N, D, b: (H * N * N * 4, H * N * N * b), "left out B:"),
    (lambda B, H, N, D, b: (B * N * N * 4, B * N * N * b), "left out H:"),
    (lambda B, H, N, D, b: (B * H * N * N * D * 4, B * H * N * N * D * b), "multiplied by D"),
    (lambda B, H, N, D, b: (B * H * N * D * 4, B * H * N * D * b), "N·D"),
    (lambda B, H, N, D, b: (B * H * N * N * b, B * H * N * N * b), "S is stored in float32"),
    (lambda B, H, N, D, b: (B * H * N * N * 4, B * H * N * N * 4), "P is stored in the input dtype"),
    (lambda B, H, N, D, b: bytes_right(B, H, N, D, b)[::-1], r"returned \(P, S\)"),
    (lambda B, H, N, D, b: tuple(8 * x for x in bytes_right(B, H, N, D, b)), "bits"),
    (lambda B, H, N, D, b: (bytes_right(B, H, N, D, b)[0], 3), "for B=4, H=16, N=4096, D=64, dtype_bytes=2: P should"),
    (lambda B, H, N, D, b: bytes_right(B, H, N, D, b) if N < 1000 else (1, 2), "N=4096.*S should take"),
    (lambda B, H, N, D, b: (B * H * N * (N + 1) * 4, B * H * N * N * b), "S should take"),
    (lambda B, H, N, D, b: B * H * N * N * (4 + b), "return a pair"),
])
def test_intermediate_bytes_diagnoses(wrong, diagnosis):
    with pytest.raises(ExerciseFailed, match=diagnosis):
        check_intermediate_bytes(wrong)
