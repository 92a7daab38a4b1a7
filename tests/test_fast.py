"""The fast kernel: its log-sum-exp, its options and, on a GPU, every path it can take."""

import pytest
import torch
from helpers import TOL, qkv, rel_error

from flashattn import VARIANTS, reference, runtime
from flashattn.kernels.fast import (
    GLUON_SPACE,
    _gluon_conflicts,
    attention_fast,
    default_options,
    gluon_available,
    tuning_configs,
)

GPU = pytest.mark.skipif(runtime.MODE != "gpu", reason="needs a GPU")
HOPPER = pytest.mark.skipif(not gluon_available(torch.float16, 64), reason="needs a Hopper GPU and Triton's Gluon")
INTERPRETER = pytest.mark.skipif(runtime.MODE != "interpreter", reason="interpreter-mode behaviour")
TF32_TOL = 3e-3  # TF32 keeps 10 mantissa bits, like float16


def reference_lse(q, k, v, causal):
    D, N = q.shape[-1], q.shape[-2]
    s = (q.double() @ k.double().transpose(-1, -2)) / D**0.5
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("N", [1, 17, 100])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_output_and_log_sum_exp(N, causal, dtype):
    q, k, v = qkv(2, 3, N, 32, dtype, seed=N)
    out, lse = attention_fast(q, k, v, causal=causal, return_lse=True, block_m=32, block_n=16)
    assert rel_error(out, reference(q, k, v, causal=causal)) < TOL[dtype]
    assert lse.shape == (2, 3, N) and lse.dtype == torch.float32
    assert (lse.double() - reference_lse(q, k, v, causal)).abs().max().item() < 1e-4


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N", [100, 300])
def test_lazy_rescaling_gives_the_same_result(N, causal):
    q, k, v = qkv(2, 2, N, 32, torch.float32, seed=N)
    q = q * 4  # a wide spread of scores: row maxima keep growing from block to block
    eager, lse_eager = attention_fast(q, k, v, causal=causal, return_lse=True, block_m=32, block_n=16)
    lazy, lse_lazy = attention_fast(q, k, v, causal=causal, return_lse=True, block_m=32, block_n=16,
                                    lazy_rescale=True)
    ref = reference(q, k, v, causal=causal)
    assert rel_error(lazy, ref) < TOL[torch.float32]
    assert rel_error(lazy, eager.double()) < TOL[torch.float32]
    assert (lse_lazy.double() - reference_lse(q, k, v, causal)).abs().max().item() < 1e-4
    assert (lse_lazy - lse_eager).abs().max().item() < 1e-4


def test_bad_options_are_refused():
    q, k, v = qkv(1, 1, 8, 32, torch.float32, seed=0)
    with pytest.raises(TypeError, match="return_lse"):
        attention_fast(q, k, v, return_lse="yes")
    with pytest.raises(ValueError, match="fast_exp"):
        attention_fast(q, k, v, fast_exp=True)
    with pytest.raises(ValueError, match="block_n <= block_m"):
        attention_fast(q, k, v, causal=True, block_m=16, block_n=32)
    with pytest.raises(TypeError, match="unknown option"):
        attention_fast(q, k, v, block_k=32)
    for cap in (True, 8, 300, 128.0):
        with pytest.raises(ValueError, match="maxnreg"):
            attention_fast(q, k, v, maxnreg=cap)
    # checked options are remembered per call signature: a bad value must still fail the second time,
    # and True must not pass for the 1 it equals
    attention_fast(q, k, v, block_m=16, block_n=16, num_stages=1)
    for _ in range(2):
        with pytest.raises(ValueError, match="num_stages"):
            attention_fast(q, k, v, block_m=16, block_n=16, num_stages=True)


@INTERPRETER
@pytest.mark.parametrize("option", [{"use_tma": True}, {"warp_specialize": True}, {"autotune": True},
                                    {"maxnreg": 128}, {"gluon": True}], ids=str)
def test_gpu_only_options_are_refused_in_the_interpreter(option):
    q, k, v = qkv(1, 1, 8, 32, torch.float16, seed=0)
    with pytest.raises(ValueError, match="GPU"):
        attention_fast(q, k, v, **option)


def test_what_the_gluon_kernel_cannot_run_is_named():
    base = {**default_options(torch.float16, 64, mode="gpu"), "use_tma": True}
    assert _gluon_conflicts({**base, "block_m": 64, "block_n": 128, "num_warps": 4}) == []
    assert _gluon_conflicts({**base, "block_m": 128, "block_n": 64, "num_warps": 8}) == []
    assert any("block_m=32" in c for c in _gluon_conflicts({**base, "block_m": 32, "num_warps": 4}))
    assert any("num_warps=2" in c for c in _gluon_conflicts({**base, "block_m": 64, "num_warps": 2}))
    assert _gluon_conflicts({**base, "fast_exp": True, "maxnreg": 128}) == ["fast_exp", "maxnreg"]
    assert _gluon_conflicts({**base, "use_tma": False}) == ["use_tma=False"]


def test_bad_schedules_are_refused():
    q, k, v = qkv(1, 1, 8, 32, torch.float16, seed=0)
    with pytest.raises(ValueError, match="schedule must be one of"):
        attention_fast(q, k, v, schedule="pingpong")
    with pytest.raises(ValueError, match="schedule='persistent'.* options of the Gluon kernel"):
        attention_fast(q, k, v, schedule="persistent", gluon=False)
    with pytest.raises(ValueError, match="consumers=2: the schedules"):
        attention_fast(q, k, v, consumers=2, gluon=False)
    for consumers in (1, 4, True, "3"):
        with pytest.raises(ValueError, match="consumers must be None, 2 or 3"):
            attention_fast(q, k, v, consumers=consumers)
    q128 = torch.cat([q] * 4, dim=-1)
    with pytest.raises(ValueError, match="consumers=3 needs D=64"):
        attention_fast(q128, q128, q128, consumers=3, schedule="persistent")
    base = {**default_options(torch.float16, 64, mode="gpu"), "use_tma": True}
    assert any("schedule='specialized'" in c for c in _gluon_conflicts({**base, "block_m": 128, "num_warps": 8,
                                                                         "schedule": "specialized"}))
    for schedule in ("auto", "single"):
        assert any("consumers=3" in c for c in _gluon_conflicts({**base, "consumers": 3, "schedule": schedule}))
    assert _gluon_conflicts({**base, "consumers": 3, "schedule": "persistent"}) == []


@INTERPRETER
def test_overlap_belongs_to_the_gluon_kernel():
    q, k, v = qkv(1, 1, 8, 32, torch.float16, seed=0)
    with pytest.raises(ValueError, match="overlap"):
        attention_fast(q, k, v, overlap=False)


def test_tuning_space_is_valid():
    for D in (16, 32, 64, 128, 256):
        for dtype in (torch.float16, torch.float32):
            configs = tuning_configs(D, dtype)
            assert configs and all(c["block_m"] >= 16 and c["block_n"] >= 16 for c in configs)
            assert all(c["maxnreg"] is None or 24 <= c["maxnreg"] <= 255 for c in configs)
            assert any(c["block_n"] <= c["block_m"] for c in configs), "causal needs a config with block_n <= block_m"
    for D in GLUON_SPACE:
        for c in tuning_configs(D, torch.bfloat16, gluon=True):
            opts = {**default_options(torch.bfloat16, D, mode="gpu"), **c, "use_tma": True}
            assert _gluon_conflicts(opts) == [], c
    with pytest.raises(ValueError, match="Gluon"):
        tuning_configs(32, torch.float16, gluon=True)


@GPU
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_autotuned_on_gpu(D, causal, dtype):
    for N in (17, 1000):
        q, k, v = qkv(2, 3, N, D, dtype, seed=N)
        out, lse = VARIANTS["fast"](q, k, v, causal=causal, return_lse=True)
        assert rel_error(out, reference(q, k, v, causal=causal)) < TOL[dtype]
        assert (lse.double() - reference_lse(q, k, v, causal)).abs().max().item() < 1e-2


@GPU
@pytest.mark.parametrize("D", [16, 32, 256])
@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_float32_and_other_head_dims_on_gpu(D, precision):
    q, k, v = qkv(2, 2, 300, D, torch.float32, seed=D)
    opts = dict(block_m=64, block_n=32, num_warps=4, num_stages=2, input_precision=precision)
    for causal in (False, True):
        out = attention_fast(q, k, v, causal=causal, **opts)
        tol = TOL[torch.float32] if precision == "ieee" else TF32_TOL
        assert rel_error(out, reference(q, k, v, causal=causal)) < tol
    qh, kh, vh = (t.half() for t in (q, k, v))
    out = attention_fast(qh, kh, vh, causal=True, block_m=64, block_n=32, num_warps=4, num_stages=2)
    assert rel_error(out, reference(qh, kh, vh, causal=True)) < TOL[torch.float16]


@GPU
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_every_tuning_config_on_gpu(D, causal):
    """Each configuration autotuning may pick compiles, fits the SM and is right (odd N, bf16)."""
    q, k, v = qkv(2, 2, 300, D, torch.bfloat16, seed=D)
    ref = reference(q, k, v, causal=causal)
    for config in tuning_configs(D, torch.bfloat16):
        if causal and config["block_n"] > config["block_m"]:
            continue
        out = attention_fast(q, k, v, causal=causal, gluon=False, **config)
        assert rel_error(out, ref) < TOL[torch.bfloat16], config


@HOPPER
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_every_gluon_config_on_gpu(D, causal, dtype):
    """Each Gluon configuration, odd N (the ragged tail and the diagonal masks), output and log-sum-exp."""
    for N in (1, 17, 100, 1000):
        q, k, v = qkv(2, 3, N, D, dtype, seed=N + D, contiguous=N != 100)
        ref, ref_lse = reference(q, k, v, causal=causal), reference_lse(q, k, v, causal)
        for config in tuning_configs(D, dtype, gluon=True):
            out, lse = attention_fast(q, k, v, causal=causal, return_lse=True, gluon=True, **config)
            assert rel_error(out, ref) < TOL[dtype], (N, config)
            assert (lse.double() - ref_lse).abs().max().item() < 1e-3, (N, config)


@HOPPER
@pytest.mark.parametrize(("D", "consumers"), [(64, 2), (64, 3), (128, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_warp_specialized_programs_loop_over_tiles(D, consumers, causal):
    """More tiles than SMs: persistent programs run several tiles (the rings' phases carry over), with and
    without the overlap; the specialized grid (one program per tile) gives the same. N = 1100 is not a
    multiple of a tile's rows (128 or 192), so the last tile of each head is ragged."""
    q, k, v = qkv(3, 16, 1100, D, torch.float16, seed=D + consumers)
    ref, ref_lse = reference(q, k, v, causal=causal), reference_lse(q, k, v, causal)
    tiles = dict(block_m=64, block_n=128, num_warps=4, num_stages=2, consumers=consumers)
    for schedule in ("specialized", "persistent"):
        for overlap in (True, False):
            out, lse = attention_fast(q, k, v, causal=causal, return_lse=True, schedule=schedule, overlap=overlap,
                                      **tiles)
            assert rel_error(out, ref) < TOL[torch.float16], (schedule, overlap)
            assert (lse.double() - ref_lse).abs().max().item() < 1e-3, (schedule, overlap)


@HOPPER
def test_gluon_is_the_default_on_hopper_and_gives_way_to_triton_options():
    q, k, v = qkv(1, 2, 64, 64, torch.float16, seed=1)
    assert default_options(torch.float16, 64)["gluon"] is True
    assert default_options(torch.float32, 64)["gluon"] is False
    assert default_options(torch.float16, 32)["gluon"] is False
    ref = reference(q, k, v)
    tiles = dict(block_m=32, block_n=32, num_warps=4, num_stages=2)
    for option in ({"fast_exp": True}, {"prefetch_scores": True}, {"use_tma": False}, {"maxnreg": 128}, tiles):
        with pytest.raises(ValueError, match="gluon=False"):
            attention_fast(q, k, v, gluon=True, **option)
        # without gluon=True, the default gives way: the Triton kernel runs these
        assert rel_error(attention_fast(q, k, v, **option), ref) < TOL[torch.float16], option
    with pytest.raises(ValueError, match="Gluon"):
        attention_fast(q.float(), k.float(), v.float(), gluon=True)


@GPU
@pytest.mark.parametrize("option", ["use_tma", "fast_exp", "prefetch_scores", "warp_specialize", "lazy_rescale"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_every_switch_on_gpu(option, dtype):
    q, k, v = qkv(1, 2, 300, 64, dtype, seed=3, contiguous=False)
    tiles = dict(block_m=128, block_n=64, num_warps=8, num_stages=3)
    for value in (False, True):
        extra = {} if option == "use_tma" else {"use_tma": True}
        out = attention_fast(q, k, v, causal=True, gluon=False, **tiles, **extra, **{option: value})
        assert rel_error(out, reference(q, k, v, causal=True)) < TOL[dtype], f"{option}={value}"
