"""Checks for notebooks 00 (memory hierarchy, roofline) and 01 (naive attention).

Each check runs the learner's function on several problems and compares it with the right answer
and with deliberately wrong "mistake models"; when a mistake model matches, the message names it.
"""

from __future__ import annotations

import math

import torch

from flashattn.reference import reference

from ._check import ExerciseFailed, call, exercise, rel_error

# --- notebook 00: arithmetic intensity and the roofline ----------------------------------------

# (M, N, K, dtype_bytes): non-square shapes so that each mistake gives a different number.
_MATMUL_CASES = ((4096, 4096, 4096, 2), (1024, 256, 4096, 4), (37, 129, 64, 2), (8192, 64, 512, 2))


def _matmul_models(M, N, K, b):
    flops, reads, writes = 2 * M * N * K, (M * K + K * N) * b, M * N * b
    right = flops / (reads + writes)
    mistakes = {
        "you left out the write of C (M·N elements): count every byte that crosses HBM, both ways":
            flops / reads,
        "you counted elements, not bytes: multiply the element counts by dtype_bytes":
            flops / (M * K + K * N + M * N),
        "you counted one FLOP per multiply-add: each of the M·N·K multiply-adds is 2 FLOP":
            right / 2,
        "you counted bits, not bytes": right / 8,
        "you returned bytes per FLOP: intensity is FLOP divided by bytes": 1 / right,
        "you left out the write of C and counted elements, not bytes": flops / (M * K + K * N),
    }
    return right, mistakes


def _as_float(value, what: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExerciseFailed(f"{what} should return one number, got {type(value).__name__} {value!r}")
    return float(value)


def _close(a: float, b: float, tol: float = 1e-6) -> bool:
    return math.isfinite(a) and abs(a - b) <= tol * max(abs(b), 1e-300)


def _diagnose_numbers(got: list[float], models: list[tuple[float, dict]], describe_case) -> None:
    """Raise ExerciseFailed naming the mistake model that matches every case, or the first wrong case."""
    names = list(models[0][1])
    for name in names:
        if all(_close(g, m[name]) for g, (_, m) in zip(got, models, strict=True)):
            raise ExerciseFailed(name)
    for i, (g, (right, _)) in enumerate(zip(got, models, strict=True)):
        if not _close(g, right):
            ratio = f" ({g / right:.4g}× the right value)" if right and math.isfinite(g) else ""
            raise ExerciseFailed(f"for {describe_case(i)} you returned {g:.6g}, expected {right:.6g}{ratio}")


@exercise("matmul intensity")
def check_matmul_intensity(fn):
    """``fn(M, N, K, dtype_bytes)`` → FLOP per byte of C = A·B (A: M×K, B: K×N), A and B read once,
    C written once."""
    got, models = [], []
    for M, N, K, b in _MATMUL_CASES:
        got.append(_as_float(call(fn, M, N, K, b), "your function"))
        models.append(_matmul_models(M, N, K, b))
    _diagnose_numbers(got, models, lambda i: "M={}, N={}, K={}, dtype_bytes={}".format(*_MATMUL_CASES[i]))
    M, N, K, b = _MATMUL_CASES[0]
    return f"a {M}×{N}×{K} matmul in {8 * b}-bit elements does {got[0]:.0f} FLOP per byte"


# (intensity FLOP/B, peak TFLOP/s, bandwidth GB/s): points on both sides of the ridge.
_ATTAINABLE_CASES = ((10.0, 660.0, 4250.0), (2730.0, 660.0, 4250.0), (124.0, 51.0, 4250.0),
                     (124.0, 660.0, 4250.0), (0.25, 19.5, 1555.0))


def _attainable_models(i, peak, gbps):
    tbps = gbps / 1000
    right = min(peak, i * tbps)
    mistakes = {
        "you took the larger of the two roofs: the attainable rate is the *smaller* one (min, not max)":
            max(peak, i * tbps),
        "you always return the compute peak: below the ridge point the memory roof, intensity × "
        "bandwidth, is lower (or your memory term is 1000× too big: bandwidth is in GB/s, TFLOP/s "
        "needs TB/s)": peak,
        "you return intensity × bandwidth even above the ridge point: nothing runs faster than the "
        "compute peak, take the min": i * tbps,
    }
    return right, mistakes


@exercise("attainable throughput")
def check_attainable(fn):
    """``fn(intensity, peak_tflops, bandwidth_gbps)`` → attainable TFLOP/s on the roofline."""
    got, models = [], []
    for case in _ATTAINABLE_CASES:
        got.append(_as_float(call(fn, *case), "your function"))
        models.append(_attainable_models(*case))
    _diagnose_numbers(got, models, lambda i: "intensity={}, peak_tflops={}, bandwidth_gbps={}".format(
        *_ATTAINABLE_CASES[i]))
    return "the roofline is min(compute peak, intensity × bandwidth)"


# --- notebook 02: attention in PyTorch ---------------------------------------------------------

# Odd N so that nothing lines up with a block or a power of two.
_ATTN_SHAPE = (2, 3, 37, 16)


def _attention_model(q, k, v, *, scale, causal, softmax_dim=-1, mask="before", direction="lower"):
    """Attention in float64 with a choice of mistakes; ``mask`` in before/after/zero_score/none."""
    q, k, v = (t.double() for t in (q, k, v))
    N = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * scale
    ones = torch.ones(N, N, dtype=torch.bool)
    hidden = ones.triu(1) if direction == "lower" else ones.tril(-1)  # the entries a query must not see
    if causal and mask == "before":
        s = s.masked_fill(hidden, float("-inf"))
    elif causal and mask == "zero_score":
        s = s.masked_fill(hidden, 0.0)
    p = torch.softmax(s, dim=softmax_dim)
    if causal and mask == "after":
        p = p.masked_fill(hidden, 0.0)
    return p @ v


def _attention_mistakes(q, k, v, causal):
    D = q.shape[-1]
    right = 1 / math.sqrt(D)
    m = {
        "the scale is missing: multiply Q·Kᵀ by 1/sqrt(D) before the softmax":
            _attention_model(q, k, v, scale=1.0, causal=causal),
        "the scale is 1/D: it should be 1/sqrt(D)": _attention_model(q, k, v, scale=1 / D, causal=causal),
        "the scale is sqrt(D): it should be 1/sqrt(D) (divide, do not multiply)":
            _attention_model(q, k, v, scale=math.sqrt(D), causal=causal),
        "the softmax runs over the wrong dimension: each query's row of scores must sum to 1, so "
        "use softmax(dim=-1) (over the keys), not dim=-2":
            _attention_model(q, k, v, scale=right, causal=causal, softmax_dim=-2),
    }
    if causal:
        m.update({
            "there is no causal mask: with causal=True, query i may only see keys j <= i "
            "(fill the scores above the diagonal with -inf before the softmax)":
                _attention_model(q, k, v, scale=right, causal=False),
            "the causal mask points the wrong way: you hid the past (below the diagonal) instead of "
            "the future; mask where j > i, e.g. torch.ones(N, N).triu(1)":
                _attention_model(q, k, v, scale=right, causal=True, direction="upper"),
            "the mask is applied after the softmax: zeroing P's future entries leaves rows that no "
            "longer sum to 1; fill the *scores* with -inf before the softmax":
                _attention_model(q, k, v, scale=right, causal=True, mask="after"),
            "the masked scores are set to 0, not -inf: exp(0) = 1, so the future keys still get "
            "weight; use float('-inf')":
                _attention_model(q, k, v, scale=right, causal=True, mask="zero_score"),
        })
    else:
        m["you applied a causal mask although causal=False"] = _attention_model(q, k, v, scale=right, causal=True)
    return m


def _call_attention(fn, q, k, v, causal):
    try:
        out = call(fn, q.clone(), k.clone(), v.clone(), causal=causal)
    except TypeError as err:
        if "causal" in str(err):
            raise ExerciseFailed(f"your function must accept a causal keyword: fn(q, k, v, causal=False) "
                                 f"({err})") from err
        raise
    if not isinstance(out, torch.Tensor):
        raise ExerciseFailed(f"your function should return a tensor, got {type(out).__name__}")
    if out.shape != q.shape:
        raise ExerciseFailed(f"the output has shape {tuple(out.shape)}, expected {tuple(q.shape)} (B, H, N, D): "
                             "P (B, H, N, N) times V (B, H, N, D)")
    return out


@exercise("attention in PyTorch")
def check_attention(fn, tol: float = 1e-4):
    """``fn(q, k, v, causal=False)`` → softmax(Q·Kᵀ/sqrt(D), masked when causal)·V, for (B, H, N, D) inputs."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(*_ATTN_SHAPE, generator=gen) for _ in range(3))
    for causal in (False, True):
        out = _call_attention(fn, q, k, v, causal)
        ref = reference(q, k, v, causal=causal)
        err = rel_error(out, ref)
        if err <= tol:
            continue
        if not torch.isfinite(out).all():
            raise ExerciseFailed(f"causal={causal}: the output has NaN or inf. A softmax over a row that is all "
                                 "-inf gives NaN: did you fill -inf after the softmax, or hide the diagonal too "
                                 "(query i must see key i), or the whole lower triangle?")
        for name, model in _attention_mistakes(q, k, v, causal).items():
            if rel_error(out, model) <= tol:
                raise ExerciseFailed(f"causal={causal}: {name}")
        row_error = (out.double() - ref.double()).norm(dim=-1).amax(dim=(0, 1))  # worst over B, H
        raise ExerciseFailed(f"causal={causal}: relative error {err:.3g} against flashattn.reference "
                             f"(the worst query row is {int(row_error.argmax())}); none of the usual mistakes "
                             "matches: compare your steps with softmax(Q·Kᵀ·scale)·V")
    return f"matches flashattn.reference on B, H, N, D = {_ATTN_SHAPE}, with and without the causal mask"


# --- notebook 02: the bytes of S and P ---------------------------------------------------------

# (B, H, N, D, dtype_bytes)
_BYTES_CASES = ((4, 16, 4096, 64, 2), (1, 16, 32768, 64, 2), (2, 3, 100, 32, 4), (3, 5, 77, 128, 2))


def _bytes_models(B, H, N, D, b):
    s, p = B * H * N * N * 4, B * H * N * N * b
    return (s, p), {
        "you counted elements, not bytes: multiply by the bytes per element (4 for S, dtype_bytes for P)":
            (B * H * N * N, B * H * N * N),
        "you left out B·H: there is one N×N matrix per (batch, head) pair": (N * N * 4, N * N * b),
        "you left out B: there is one N×N matrix per (batch, head) pair": (H * N * N * 4, H * N * N * b),
        "you left out H: there is one N×N matrix per (batch, head) pair": (B * N * N * 4, B * N * N * b),
        "you multiplied by D: S = Q·Kᵀ is N×N per (batch, head); D is summed away": (s * D, p * D),
        "you used N·D (the size of Q), not N·N: S has one score per (query, key) pair":
            (B * H * N * D * 4, B * H * N * D * b),
        "S is stored in float32 (4 bytes) whatever the input dtype: the kernels keep the scores in float32":
            (p, p),
        "P is stored in the input dtype (dtype_bytes), not float32": (s, s),
        "you returned (P, S): the order is (S bytes, P bytes)": (p, s),
        "you counted bits, not bytes": (8 * s, 8 * p),
    }


@exercise("bytes of S and P")
def check_intermediate_bytes(fn):
    """``fn(B, H, N, D, dtype_bytes)`` → (bytes of S, bytes of P) of the naive kernels
    (S in float32, P in the input dtype)."""
    got = []
    for case in _BYTES_CASES:
        out = call(fn, *case)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ExerciseFailed(f"return a pair (S bytes, P bytes), got {out!r}")
        got.append(tuple(_as_float(x, "each of the two numbers") for x in out))
    models = [_bytes_models(*case) for case in _BYTES_CASES]
    if all(g == right for g, (right, _) in zip(got, models, strict=True)):
        B, H, N, D, b = _BYTES_CASES[0]
        s, p = models[0][0]
        return f"at B={B}, H={H}, N={N} in {8 * b}-bit, S and P take {(s + p) / 2**30:.1f} GiB together"
    # A mistake is named only when it explains every case (one case alone can match by coincidence).
    for name in models[0][1]:
        if all(g == m[name] for g, (_, m) in zip(got, models, strict=True)):
            raise ExerciseFailed(name)
    for case, g, (right, _) in zip(_BYTES_CASES, got, models, strict=True):
        where = "B={}, H={}, N={}, D={}, dtype_bytes={}".format(*case)
        for label, gi, ri in (("S", g[0], right[0]), ("P", g[1], right[1])):
            if gi != ri:
                raise ExerciseFailed(f"for {where}: {label} should take {ri:.0f} bytes, you returned {gi:.0f} "
                                     f"({gi / ri:.4g}× that)")
    raise AssertionError("unreachable")
