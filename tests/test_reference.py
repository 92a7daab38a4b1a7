"""The float64 reference against PyTorch's own attention on random inputs."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import qkv

from flashattn import reference


@pytest.mark.parametrize("N", [1, 17, 100])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_sdpa(N, causal):
    q, k, v = (t.double().cpu() for t in qkv(2, 3, N, 32, torch.float32, seed=N))
    ref = reference(q, k, v, causal=causal)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert ref.dtype == torch.float64
    assert torch.allclose(ref, sdpa, rtol=1e-10, atol=1e-12)


def test_scale_and_return_dtype():
    q, k, v = (t.cpu() for t in qkv(1, 2, 9, 16, torch.float16, seed=4))
    out = reference(q, k, v, scale=0.5)
    assert out.dtype == torch.float16 and out.device == q.device
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.5)
    assert torch.allclose(out.double(), expected, rtol=2e-3, atol=2e-3)
    default = reference(q, k, v)
    explicit = reference(q, k, v, scale=1 / math.sqrt(16))
    assert torch.equal(default, explicit)


def test_causal_first_row_is_v0():
    q, k, v = (t.cpu() for t in qkv(1, 1, 5, 16, torch.float32, seed=1))
    out = reference(q, k, v, causal=True)
    assert torch.allclose(out[0, 0, 0], v[0, 0, 0])
