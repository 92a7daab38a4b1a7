"""Bad input gets a clear ValueError/TypeError naming what was wrong."""

import pytest
import torch
from helpers import qkv

import flashattn
from flashattn import VARIANTS, reference, runtime

NAMES = list(VARIANTS)


def good(D=16, dtype=torch.float32):
    return qkv(1, 2, 8, D, dtype, seed=0)


@pytest.mark.parametrize("name", NAMES)
def test_wrong_rank(name):
    q, k, v = good()
    with pytest.raises(ValueError, match=r"q must have 4 dimensions \(B, H, N, D\), got shape \(2, 8, 16\)"):
        VARIANTS[name](q[0], k[0], v[0])


@pytest.mark.parametrize("name", NAMES)
def test_mismatched_shapes(name):
    q, k, v = good()
    with pytest.raises(ValueError, match=r"same shape .*k \(1, 2, 7, 16\)"):
        VARIANTS[name](q, k[:, :, :7], v)


@pytest.mark.parametrize("name", NAMES)
def test_mismatched_dtypes(name):
    q, k, v = good()
    with pytest.raises(TypeError, match="one dtype; got q torch.float32, k torch.float16"):
        VARIANTS[name](q, k.half(), v)


@pytest.mark.parametrize("name", NAMES)
def test_unsupported_dtype(name):
    q, k, v = (t.double() for t in good())
    with pytest.raises(TypeError, match="dtype torch.float64 is not supported; accepted: float16, bfloat16, float32"):
        VARIANTS[name](q, k, v)


@pytest.mark.parametrize("name", NAMES)
def test_integer_inputs(name):
    q, k, v = (torch.ones(1, 1, 4, 16, dtype=torch.int32) for _ in range(3))
    with pytest.raises(TypeError, match="floating point, got torch.int32"):
        VARIANTS[name](q, k, v)


@pytest.mark.parametrize("name", [n for n in NAMES if n not in ("v2_padded", "fast")])
def test_unsupported_head_dim_points_to_padded(name):
    q, k, v = good(D=40)
    accepted = "accepted: 16, 32, 64, 128, 256; .*v2_padded"
    with pytest.raises(ValueError, match=f"head dimension D=40 is not supported; {accepted}"):
        VARIANTS[name](q, k, v)


def test_padded_head_dim_limit():
    q, k, v = good(D=130)
    with pytest.raises(ValueError, match="D=130 is not supported; accepted: any D from 1 to 128$"):
        VARIANTS["v2_padded"](q, k, v)
    q, k, v = good(D=257)
    with pytest.raises(ValueError, match="D=257 is not supported; accepted: any D from 1 to 256$"):
        VARIANTS["fast"](q, k, v)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "fast"])
def test_decoder_shapes_need_fast(name):
    """Only fast takes L != S and grouped K/V heads; the teaching variants keep one shape for q, k and v."""
    q, k, v = good()
    with pytest.raises(ValueError, match=r"same shape .*k \(1, 2, 5, 16\)"):
        VARIANTS[name](q, k[:, :, :5], v[:, :, :5])
    with pytest.raises(ValueError, match=r"same shape .*k \(1, 1, 8, 16\)"):
        VARIANTS[name](q, k[:, :1], v[:, :1])


def test_decoder_shape_errors_name_what_is_wrong():
    q, k, v = qkv(2, 6, 8, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"multiple of the key/value heads .*Hq=6 .*Hkv=4 \(k \(2, 4, 8, 16\)\)"):
        VARIANTS["fast"](q, k[:, :4], v[:, :4])
    with pytest.raises(ValueError, match=r"same batch B and head dimension D; got q \(2, 6, 8, 16\), "
                                         r"k \(1, 6, 8, 16\)"):
        VARIANTS["fast"](q, k[:1], v[:1])
    with pytest.raises(ValueError, match=r"k and v must have the same shape \(B, Hkv, S, D\); got k \(2, 6, 8, 16\), "
                                         r"v \(2, 6, 7, 16\)"):
        VARIANTS["fast"](q, k, v[:, :, :7])
    with pytest.raises(TypeError, match="one dtype; got q torch.float32, k torch.float16"):
        VARIANTS["fast"](q, k[:, :2].half(), v[:, :2])


@pytest.mark.parametrize("name", NAMES)
def test_empty_dimension(name):
    q, k, v = (torch.randn(1, 2, 0, 16) for _ in range(3))
    with pytest.raises(ValueError, match=r"must be >= 1, got \(1, 2, 0, 16\)"):
        VARIANTS[name](q, k, v)


@pytest.mark.parametrize("name", NAMES)
def test_not_a_tensor(name):
    _, k, v = good()
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        VARIANTS[name]([[1.0]], k, v)


@pytest.mark.parametrize("name", NAMES)
def test_bad_scale_and_causal(name):
    q, k, v = good()
    with pytest.raises(TypeError, match="scale must be a Python float or None, got str"):
        VARIANTS[name](q, k, v, scale="0.1")
    with pytest.raises(ValueError, match="scale must be finite and non-zero, got nan"):
        VARIANTS[name](q, k, v, scale=float("nan"))
    with pytest.raises(TypeError, match="causal must be True or False, got 1"):
        VARIANTS[name](q, k, v, causal=1)


@pytest.mark.parametrize("name", NAMES)
def test_bad_options(name):
    q, k, v = good()
    with pytest.raises(TypeError, match="unknown option\\(s\\) block_k; accepted:"):
        VARIANTS[name](q, k, v, block_k=32)
    with pytest.raises(ValueError, match="block_m must be a power of two >= 16, got 48"):
        VARIANTS[name](q, k, v, block_m=48)
    with pytest.raises(ValueError, match="num_warps must be a power of two <= 32, got 3"):
        VARIANTS[name](q, k, v, num_warps=3)
    with pytest.raises(ValueError, match="num_stages must be an integer >= 1, got 0"):
        VARIANTS[name](q, k, v, num_stages=0)
    with pytest.raises(ValueError, match="input_precision must be one of ieee, tf32, tf32x3, got 'fp64'"):
        VARIANTS[name](q, k, v, input_precision="fp64")
    with pytest.raises(ValueError, match="input_precision applies to float32 inputs only"):
        VARIANTS[name](*good(dtype=torch.float16), input_precision="ieee")


def test_bool_options_are_checked():
    q, k, v = good()
    with pytest.raises(TypeError, match="option use_exp2 must be True or False, got 1"):
        VARIANTS["v2"](q, k, v, use_exp2=1)


@pytest.mark.skipif(runtime.MODE != "interpreter", reason="the interpreter's bf16 dot is the problem")
@pytest.mark.parametrize("name", NAMES)
def test_bf16_refused_in_interpreter(name):
    q, k, v = good(dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 is refused in interpreter mode.*incorrectly"):
        VARIANTS[name](q, k, v)


@pytest.mark.skipif(runtime.MODE != "gpu", reason="needs a GPU run")
@pytest.mark.parametrize("name", NAMES)
def test_cpu_tensors_refused_on_gpu(name):
    q, k, v = (torch.randn(1, 1, 8, 16) for _ in range(3))
    with pytest.raises(ValueError, match="GPU mode needs CUDA tensors, got tensors on cpu"):
        VARIANTS[name](q, k, v)


@pytest.mark.skipif(not runtime.HAS_GPU, reason="needs two devices")
def test_mismatched_devices():
    q, k, v = (torch.randn(1, 1, 8, 16) for _ in range(3))
    with pytest.raises(ValueError, match="one device; got q on cpu, k on cuda"):
        VARIANTS["v2"](q, k.cuda(), v)


def test_unknown_variant():
    q, k, v = good()
    with pytest.raises(ValueError, match="unknown variant 'v3'; accepted: naive, v1, v2"):
        flashattn.attention(q, k, v, variant="v3")


def test_reference_validates_too():
    q, k, v = good()
    with pytest.raises(ValueError, match="same shape"):
        reference(q, k[:, :1], v)
