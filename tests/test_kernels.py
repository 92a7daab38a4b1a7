"""Every variant against the float64 reference: fixed odd sizes, then random problems (hypothesis)."""

import pytest
import torch
from helpers import DTYPES, TOL, qkv, rel_error
from hypothesis import given
from hypothesis import strategies as st

from flashattn import VARIANTS, reference, runtime

NAMES = list(VARIANTS)


@pytest.mark.parametrize("N", [1, 17, 100, 257])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_naive_odd_sizes(N, causal, dtype):
    q, k, v = qkv(2, 3, N, 32, dtype, seed=N)
    out = VARIANTS["naive"](q, k, v, causal=causal)
    assert rel_error(out, reference(q, k, v, causal=causal)) < TOL[dtype]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_variant_odd_size(name, causal, dtype):
    q, k, v = qkv(2, 2, 100, 32, dtype, seed=7)
    out = VARIANTS[name](q, k, v, causal=causal, block_m=32, block_n=32)
    assert out.dtype == dtype and out.device == q.device and out.shape == q.shape
    assert rel_error(out, reference(q, k, v, causal=causal)) < TOL[dtype]


@pytest.mark.parametrize("name", NAMES)
def test_single_token_returns_v(name):
    # N = 1: softmax over one key is 1, so the output is v itself.
    q, k, v = qkv(2, 2, 1, 16, torch.float32, seed=3)
    assert torch.allclose(VARIANTS[name](q, k, v), v, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["v1", "v2", "v2_kt", "v2_padded"])
def test_rows_fully_masked_inside_a_block(name):
    # causal with BLOCK_M > BLOCK_N: rows i < j0 of a diagonal tile see no key of it; no NaN allowed.
    q, k, v = qkv(1, 2, 80, 16, torch.float32, seed=11)
    out = VARIANTS[name](q, k, v, causal=True, block_m=64, block_n=16)
    assert rel_error(out, reference(q, k, v, causal=True)) < TOL[torch.float32]


@pytest.mark.parametrize(
    "opts", [{"use_exp2": True}, {"deferred_norm": False}, {"use_exp2": True, "deferred_norm": False}]
)
@pytest.mark.parametrize("causal", [False, True])
def test_v2_options(opts, causal):
    q, k, v = qkv(1, 2, 70, 32, torch.float16, seed=5)
    out = VARIANTS["v2"](q, k, v, causal=causal, **opts)
    assert rel_error(out, reference(q, k, v, causal=causal)) < TOL[torch.float16]


def test_explicit_scale():
    q, k, v = qkv(1, 1, 40, 16, torch.float32, seed=2)
    for name in NAMES:
        out = VARIANTS[name](q, k, v, scale=0.3)
        assert rel_error(out, reference(q, k, v, scale=0.3)) < TOL[torch.float32], name


@pytest.mark.parametrize("D", [40, 48, 80])
def test_padded_odd_head_dims(D):
    q, k, v = qkv(2, 1, 50, D, torch.float16, seed=D)
    for causal in (False, True):
        out = VARIANTS["v2_padded"](q, k, v, causal=causal)
        assert rel_error(out, reference(q, k, v, causal=causal)) < TOL[torch.float16]


problems = st.fixed_dictionaries({
    "B": st.integers(1, 3), "H": st.integers(1, 3), "N": st.integers(1, 300),
    "D": st.sampled_from([16, 32, 64]), "causal": st.booleans(),
    "dtype": st.sampled_from(DTYPES), "contiguous": st.booleans(),
    "block": st.sampled_from([16, 32, 64]), "seed": st.integers(0, 2**31 - 1),
})


def _check_random_problem(name, p):
    q, k, v = qkv(p["B"], p["H"], p["N"], p["D"], p["dtype"], p["seed"], p["contiguous"])
    block = p["block"]
    if p["B"] * p["H"] * (p["N"] / block) ** 2 > 150:  # the CPU interpreter is slow: cap the tile count
        block = 64
    out = VARIANTS[name](q, k, v, causal=p["causal"], block_m=block, block_n=block)
    err = rel_error(out, reference(q, k, v, causal=p["causal"]))
    assert err < TOL[p["dtype"]], f"{name}: relative error {err:.2e} on {p}"


@pytest.mark.parametrize("name", NAMES)
@given(p=problems)
def test_random_problems(name, p):
    _check_random_problem(name, p)


@given(p=problems, D=st.sampled_from([40, 48, 80]))
def test_random_problems_padded_odd_head_dims(p, D):
    _check_random_problem("v2_padded", {**p, "D": D})


@pytest.mark.skipif(runtime.MODE != "gpu", reason="full sizes run on a GPU")
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_full_size_on_gpu(name, dtype, causal):
    s = runtime.SIZES
    q, k, v = qkv(s.B, s.H, s.N, s.D, dtype, seed=1)
    opts = {"input_precision": "ieee"} if dtype == torch.float32 else {}
    out = VARIANTS[name](q, k, v, causal=causal, **opts)
    assert rel_error(out, reference(q, k, v, causal=causal)) < TOL[dtype]
