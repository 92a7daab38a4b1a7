"""The fast kernel: decoder shapes (L != S, grouped heads, any D), its log-sum-exp, its options, its autotuner
and, on a GPU, every path it can take."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers import TOL, qkv, rel_error
from hypothesis import given
from hypothesis import strategies as st

from flashattn import VARIANTS, reference, runtime
from flashattn.kernels import device, fast_options, tuner
from flashattn.kernels.fast import (
    GLUON_SPACE,
    Problem,
    attention_fast,
    default_options,
    gluon_available,
    tuned_config,
    tuning_configs,
)
from flashattn.kernels.fast_options import FastOptions, gluon_conflicts

GPU = pytest.mark.skipif(runtime.MODE != "gpu", reason="needs a GPU")
HOPPER = pytest.mark.skipif(not gluon_available(torch.float16, 64), reason="needs a Hopper GPU and Triton's Gluon")
INTERPRETER = pytest.mark.skipif(runtime.MODE != "interpreter", reason="interpreter-mode behaviour")
TF32_TOL = 3e-3  # TF32 keeps 10 mantissa bits, like float16
# The log-sum-exp is computed in float32 from the same (rounded) inputs as the float64 reference: its values
# are about log(S) + the largest score (< 20 here), so float32 rounding leaves ~1e-6; 1e-4 on the CPU. On a
# GPU the scores of 16-bit inputs come from the tensor cores (float32 accumulation in another order): 1e-3.
LSE_TOL = 1e-4 if runtime.MODE == "interpreter" else 1e-3


def tensors(B, H, N, D, dtype, gen, contiguous=True):
    """Fresh random (B, H, N, D); non-contiguous ones are (B, N, H, D) storage seen as (B, H, N, D)."""
    t = torch.randn(B, H, N, D, generator=gen) if contiguous else torch.randn(B, N, H, D, generator=gen).transpose(1, 2)
    return t.to(device=runtime.DEVICE, dtype=dtype)


def decoder_qkv(B, Hq, Hkv, L, S, D, dtype, seed, contiguous=True):
    gen = torch.Generator().manual_seed(seed)
    return (tensors(B, Hq, L, D, dtype, gen, contiguous), tensors(B, Hkv, S, D, dtype, gen, contiguous),
            tensors(B, Hkv, S, D, dtype, gen, contiguous))


def torch_reference(q, k, v, causal, scale=None):
    """Output and log-sum-exp in float64 with torch: K/V heads repeated for the query heads (in the test
    only), the causal mask as torch's ``is_causal`` (top-left: query i sees keys j <= i)."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, scale=scale)
    s = (q64 @ k64.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return out, torch.logsumexp(s, dim=-1)


def check(q, k, v, causal, **options):
    out, lse = attention_fast(q, k, v, causal=causal, return_lse=True, **options)
    ref, ref_lse = torch_reference(q, k, v, causal)
    B, Hq, L, D = q.shape
    assert out.shape == (B, Hq, L, D) and out.dtype == q.dtype
    assert lse.shape == (B, Hq, L) and lse.dtype == torch.float32
    err = rel_error(out, ref)
    assert err < TOL[q.dtype], f"relative error {err:.2e}"
    lse_err = (lse.double() - ref_lse).abs().max().item()
    assert lse_err < LSE_TOL, f"log-sum-exp off by {lse_err:.2e}"


@pytest.mark.parametrize("N", [1, 17, 100])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_output_and_log_sum_exp(N, causal, dtype):
    q, k, v = qkv(2, 3, N, 32, dtype, seed=N)
    check(q, k, v, causal, block_m=32, block_n=16)


@pytest.mark.parametrize(("L", "S"), [(70, 33), (33, 70), (1, 50), (50, 1), (64, 128), (129, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_more_or_fewer_keys_than_queries(L, S, causal):
    """L != S, causal aligned as torch's is_causal: with L > S the rows past S see every key, not none."""
    q, k, v = decoder_qkv(1, 2, 2, L, S, 32, torch.float16, seed=L * S)
    check(q, k, v, causal, block_m=32, block_n=16)


@pytest.mark.parametrize(("Hq", "Hkv"), [(4, 2), (6, 1), (3, 3)])
def test_grouped_query_heads(Hq, Hkv):
    """Query head h uses K/V head h // (Hq / Hkv), read in place: the K/V given are (B, Hkv, S, D)."""
    q, k, v = decoder_qkv(2, Hq, Hkv, 40, 57, 16, torch.float32, seed=Hq, contiguous=False)
    check(q, k, v, True, block_m=16, block_n=16)
    check(q, k, v, False, block_m=32, block_n=32)


@pytest.mark.parametrize("D", [1, 8, 40, 80, 96, 100, 200, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_any_head_dim(D, dtype):
    """D is padded to a power of two >= 16 inside the kernel: the extra columns load as zeros, never stored."""
    q, k, v = decoder_qkv(1, 2, 1, 37, 45, D, dtype, seed=D)
    check(q, k, v, True, block_m=32, block_n=32)


problems = st.fixed_dictionaries({
    "B": st.integers(1, 2), "Hkv": st.integers(1, 2), "group": st.integers(1, 3),
    "L": st.integers(1, 200), "S": st.integers(1, 200), "D": st.sampled_from([16, 40, 64, 80, 96, 128]),
    "causal": st.booleans(), "dtype": st.sampled_from([torch.float32, torch.float16]),
    "contiguous": st.booleans(), "seed": st.integers(0, 2**31 - 1),
})


@given(p=problems)
def test_random_decoder_problems(p):
    """Random shapes (ragged L and S, grouped heads, padded D, strided inputs) against float64 torch."""
    q, k, v = decoder_qkv(p["B"], p["Hkv"] * p["group"], p["Hkv"], p["L"], p["S"], p["D"], p["dtype"], p["seed"],
                          p["contiguous"])
    check(q, k, v, p["causal"])


def test_explicit_scale_with_decoder_shapes():
    q, k, v = decoder_qkv(1, 4, 2, 20, 30, 24, torch.float32, seed=5)
    out = attention_fast(q, k, v, causal=True, scale=0.3)
    assert rel_error(out, torch_reference(q, k, v, True, scale=0.3)[0]) < TOL[torch.float32]


def test_bad_shapes_are_refused():
    q, k, v = decoder_qkv(2, 6, 4, 8, 9, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"multiple of the key/value heads.*Hq=6.*Hkv=4"):
        attention_fast(q, k, v)
    q, k, v = decoder_qkv(2, 4, 2, 8, 9, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"same batch B and head dimension D; got q \(1, 4, 8, 16\)"):
        attention_fast(q[:1], k, v)
    with pytest.raises(ValueError, match=r"same batch B and head dimension D; got q \(2, 4, 8, 8\)"):
        attention_fast(q[..., :8], k, v)
    with pytest.raises(ValueError, match=r"k and v must have the same shape \(B, Hkv, S, D\)"):
        attention_fast(q, k, v[:, :, :5])
    big = torch.randn(1, 1, 4, 257, device=runtime.DEVICE)
    with pytest.raises(ValueError, match="D=257 is not supported; accepted: any D from 1 to 256$"):
        attention_fast(big, big, big)


def test_bad_options_are_refused():
    q, k, v = qkv(1, 1, 8, 32, torch.float32, seed=0)
    with pytest.raises(TypeError, match="return_lse"):
        attention_fast(q, k, v, return_lse="yes")
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


@pytest.mark.parametrize("switch", ["fast_exp", "lazy_rescale", "prefetch_scores", "warp_specialize"])
def test_switches_that_never_won_are_gone(switch):
    """Measured on the H200 and removed (their recorded ablation rows stay): now unknown options."""
    q, k, v = qkv(1, 1, 8, 32, torch.float16, seed=0)
    with pytest.raises(TypeError, match=f"unknown option\\(s\\) {switch}"):
        attention_fast(q, k, v, **{switch: True})
    assert switch not in default_options(torch.float16, 64, mode="gpu")


def test_options_are_a_frozen_dataclass_checked_once():
    opts = fast_options.resolve(torch.float16, 64, False, {"block_m": 32, "block_n": 32})
    assert isinstance(opts, FastOptions) and opts.block_m == 32 and not opts.autotune
    assert fast_options.resolve(torch.float16, 64, False, {"block_m": 32, "block_n": 32}) is opts  # remembered
    with pytest.raises(AttributeError):
        opts.block_m = 64
    backward_only = {"dq_mode", "dkdv_tiles", "dq_tiles"}
    forward_fields = {f.name for f in dataclasses.fields(FastOptions)} - backward_only
    assert set(default_options(torch.float16, 64, mode="gpu")) == forward_fields
    # one options type for both directions: the backward's are the same frozen dataclass, remembered the same way
    backward = fast_options.resolve_backward(torch.float16, 64, {"dkdv_tiles": (32, 32, 4, 1)})
    assert isinstance(backward, FastOptions) and backward.dkdv_tiles == (32, 32, 4, 1) and backward.block_m == 32
    assert fast_options.resolve_backward(torch.float16, 64, {"dkdv_tiles": (32, 32, 4, 1)}) is backward


@INTERPRETER
@pytest.mark.parametrize("option", [{"use_tma": True}, {"autotune": True}, {"maxnreg": 128}, {"gluon": True}], ids=str)
def test_gpu_only_options_are_refused_in_the_interpreter(option):
    q, k, v = qkv(1, 1, 8, 32, torch.float16, seed=0)
    with pytest.raises(ValueError, match="GPU"):
        attention_fast(q, k, v, **option)


def test_the_gluon_kernel_refuses_decoder_shapes():
    q, k, v = decoder_qkv(1, 2, 1, 64, 64, 64, torch.float16, seed=0)
    with pytest.raises(ValueError, match="gluon=True needs .*as many keys as queries and one K/V head per query head"):
        attention_fast(q, k, v, gluon=True)


def test_what_the_gluon_kernel_cannot_run_is_named():
    base = {**default_options(torch.float16, 64, mode="gpu"), "use_tma": True}
    assert gluon_conflicts({**base, "block_m": 64, "block_n": 128, "num_warps": 4}) == []
    assert gluon_conflicts({**base, "block_m": 128, "block_n": 64, "num_warps": 8}) == []
    assert any("block_m=32" in c for c in gluon_conflicts({**base, "block_m": 32, "num_warps": 4}))
    assert any("num_warps=2" in c for c in gluon_conflicts({**base, "block_m": 64, "num_warps": 2}))
    assert gluon_conflicts({**base, "maxnreg": 128}) == ["maxnreg"]
    assert gluon_conflicts({**base, "use_tma": False}) == ["use_tma=False"]


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
    assert any("schedule='specialized'" in c for c in gluon_conflicts({**base, "block_m": 128, "num_warps": 8,
                                                                        "schedule": "specialized"}))
    for schedule in ("auto", "single"):
        assert any("consumers=3" in c for c in gluon_conflicts({**base, "consumers": 3, "schedule": schedule}))
    assert gluon_conflicts({**base, "consumers": 3, "schedule": "persistent"}) == []


@INTERPRETER
def test_overlap_belongs_to_the_gluon_kernel():
    q, k, v = qkv(1, 1, 8, 32, torch.float16, seed=0)
    with pytest.raises(ValueError, match="overlap"):
        attention_fast(q, k, v, overlap=False)


def test_tuning_space_is_valid():
    for D in (1, 16, 32, 40, 64, 96, 128, 200, 256):
        for dtype in (torch.float16, torch.float32):
            configs = tuning_configs(D, dtype)
            assert configs and all(c["block_m"] >= 16 and c["block_n"] >= 16 for c in configs)
            assert all(c["maxnreg"] is None or 24 <= c["maxnreg"] <= 255 for c in configs)
            assert any(c["block_n"] <= c["block_m"] for c in configs), "causal needs a config with block_n <= block_m"
    for D in GLUON_SPACE:
        for c in tuning_configs(D, torch.bfloat16, gluon=True):
            opts = {**default_options(torch.bfloat16, D, mode="gpu"), **c, "use_tma": True}
            assert gluon_conflicts(opts) == [], c
    with pytest.raises(ValueError, match="Gluon"):
        tuning_configs(32, torch.float16, gluon=True)


def test_causal_candidates_are_pruned():
    base = FastOptions(gluon=True, autotune=True, block_m=64, block_n=128, num_warps=4, num_stages=2, use_tma=True)
    causal = fast_options.candidates(base, 64, torch.float16, causal=True)
    assert causal and all(c.consumers != 3 and not c.autotune for c in causal)
    assert any(c.consumers == 3 for c in fast_options.candidates(base, 64, torch.float16, causal=False))
    # the Gluon kernel masks any key block that crosses the diagonal: its 128-key, two-consumer programs stay
    assert any(c.block_n > c.block_m and c.schedule != "single"
               for c in fast_options.candidates(base, 128, torch.float16, causal=True))
    triton_base = FastOptions(gluon=False, autotune=True, block_m=64, block_n=64, num_warps=4, num_stages=2)
    assert all(c.block_n <= c.block_m for c in fast_options.candidates(triton_base, 64, torch.float16, causal=True))


def test_autotuning_interleaves_rounds_against_clock_drift(monkeypatch):
    """Under a clock that slows a little with every timing (an H200 at its power limit), candidates timed one
    after another favour the first; rounds that alternate their order, each candidate keeping its median,
    pick the one that is really fastest."""
    true_ms = {"a": 1.00, "b": 0.97, "c": 1.05}
    calls = []

    def drifting_do_bench(fn, warmup, rep, return_mode):
        fn()
        calls.append(fn.args[0])
        return true_ms[fn.args[0]] * (1 + 0.05 * len(calls))

    monkeypatch.setattr(tuner.triton.testing, "do_bench", drifting_do_bench)
    ran = []
    best, medians = tuner.tune(["a", "b", "c"], ran.append)
    assert best == "b" and set(medians) == {"a", "b", "c"}
    assert ran[:3] == ["a", "b", "c"]  # each compiled (run once) before any timing
    assert calls[:6] == ["a", "b", "c", "c", "b", "a"]  # the order alternates from round to round
    assert len(calls) == 3 * tuner.TUNE_ROUNDS and tuner.TUNE_ROUNDS % 2 == 0
    # one timing each, in one order, would have picked "a"
    assert min(true_ms, key=lambda c: true_ms[c] * (1 + 0.05 * (1 + "abc".index(c)))) == "a"


def test_tuned_config_reads_the_recorded_pick(monkeypatch):
    picked = FastOptions(gluon=False, autotune=False, block_m=128, block_n=64, num_warps=8, num_stages=2,
                         maxnreg=128, use_tma=True)
    problem = Problem("forward", False, torch.float16, 64, 4, 16, 16, 1024, 1024, True, True, "ieee", True, "auto",
                      None)
    monkeypatch.setattr(tuner, "_picks", {problem: (picked, {picked: 0.5})})
    assert tuned_config(64, torch.float16, 1024, 16, True, gluon=False) == picked.tiles()
    assert tuned_config(64, torch.float16, 1024, 16, True, gluon=False, B=4)["maxnreg"] == 128
    assert tuned_config(64, torch.float16, 1024, 16, True, gluon=False, B=2) is None
    assert tuned_config(64, torch.float16, 1024, 16, False, gluon=False) is None
    assert tuner.tuning_times(problem) == {picked: 0.5}


# --- on a GPU ------------------------------------------------------------------------------------

@GPU
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_autotuned_on_gpu(D, causal, dtype):
    for N in (17, 1000):
        q, k, v = qkv(2, 3, N, D, dtype, seed=N)
        out, lse = VARIANTS["fast"](q, k, v, causal=causal, return_lse=True)
        ref, ref_lse = torch_reference(q, k, v, causal)
        assert rel_error(out, ref) < TOL[dtype]
        assert (lse.double() - ref_lse).abs().max().item() < 1e-2
        assert tuned_config(D, dtype, N, 3, causal, B=2) is not None  # the pick, recorded where it was made


@GPU
@pytest.mark.parametrize(("D", "dtype"), [(40, torch.float16), (96, torch.bfloat16), (128, torch.float16)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_decoder_shapes_on_gpu(D, dtype, causal):
    """L != S and grouped heads on the Triton kernel (TMA where D allows it), output and log-sum-exp; fixed tiles
    here (each autotuning candidate is checked by test_every_tuning_config_on_gpu, the autotuned decoder shapes
    at full size by tools/gpu/fast/probe.py)."""
    tiles = dict(block_m=64, block_n=64, num_warps=4, num_stages=2)
    for L, S in ((300, 1000), (1000, 300)):
        q, k, v = decoder_qkv(2, 8, 2, L, S, D, dtype, seed=L + D)
        ref, ref_lse = torch_reference(q, k, v, causal)
        for use_tma in (False, True) if D == 128 and device.hopper() else (False,):
            out, lse = attention_fast(q, k, v, causal=causal, return_lse=True, use_tma=use_tma, **tiles)
            assert rel_error(out, ref) < TOL[dtype], (L, S, use_tma)
            assert (lse.double() - ref_lse).abs().max().item() < 1e-2, (L, S, use_tma)


@GPU
@pytest.mark.parametrize("D", [16, 32, 80, 256])
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
        ref, ref_lse = torch_reference(q, k, v, causal)
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
    ref, ref_lse = torch_reference(q, k, v, causal)
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
    assert not default_options(torch.float16, 96)["gluon"] and not default_options(torch.float16, 96)["use_tma"]
    ref = reference(q, k, v)
    tiles = dict(block_m=32, block_n=32, num_warps=4, num_stages=2)
    for option in ({"use_tma": False}, {"maxnreg": 128}, tiles):
        with pytest.raises(ValueError, match="gluon=False"):
            attention_fast(q, k, v, gluon=True, **option)
        # without gluon=True, the default gives way: the Triton kernel runs these
        assert rel_error(attention_fast(q, k, v, **option), ref) < TOL[torch.float16], option
    with pytest.raises(ValueError, match="Gluon"):
        attention_fast(q.float(), k.float(), v.float(), gluon=True)


@GPU
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_tma_and_pointer_loads_on_gpu(dtype):
    q, k, v = qkv(1, 2, 300, 64, dtype, seed=3, contiguous=False)
    tiles = dict(block_m=128, block_n=64, num_warps=8, num_stages=3)
    for use_tma in (False, True):
        out = attention_fast(q, k, v, causal=True, gluon=False, use_tma=use_tma, **tiles)
        assert rel_error(out, reference(q, k, v, causal=True)) < TOL[dtype], f"use_tma={use_tma}"
    q96 = torch.cat([q, q[..., :32]], dim=-1)
    with pytest.raises(ValueError, match="use_tma needs D a power of two"):
        attention_fast(q96, q96, q96, gluon=False, use_tma=True)


def test_ablation_no_longer_tries_the_removed_switches_but_keeps_their_rows():
    from flashattn.measure.measurements import fast as measurement

    for D in (64, 128):
        for causal in (False, True):
            steps = measurement._ablation_steps(D, causal)
            assert not {label for label, *_ in steps} & set(measurement.REMOVED_STEPS)
            for _, _, options, _ in steps:
                assert not set(options) & {"fast_exp", "lazy_rescale", "prefetch_scores", "warp_specialize"}
    carried = measurement._removed_rows()  # from the recorded file shipped in figures/data/
    assert {r["step"] for r in carried} == set(measurement.REMOVED_STEPS)
    assert all(r["removed_from_kernel"] and r["measured_at"] and not r["kept"] for r in carried)
