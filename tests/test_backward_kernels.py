"""The launch statistics of backward kernels (notebook 12, section 6): the ncu target, and parsing what ncu wrote."""

import json
import re
import stat
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import TOL, rel_error

from flashattn.measure import backward_kernels, profile

FIXTURES = Path(__file__).parent / "fixtures"


def test_profile_backward_with_a_fake_ncu(tmp_path, monkeypatch):
    """profile_backward end to end on a stand-in ncu that prints rows the H200's ncu printed for SDPA's backward
    (cuDNN, D = 128; the fixture's first line says how it was made): this module is the target, and the second
    call's three kernels come back with their numbers under short names."""
    cfg = backward_kernels.target_config("sdpa", B=4, H=16, N=4096, D=128)
    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""
        import sys
        assert sys.argv[-3:] == ["-m", "flashattn.measure.backward_kernels", {json.dumps([cfg])!r}], sys.argv
        assert "regex:" + {backward_kernels.KERNEL_REGEX!r} in sys.argv
        print(open({str(FIXTURES / "ncu_backward_sdpa_h200.csv")!r}).read())
    """))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(profile, "find_ncu", lambda: str(fake))
    launches = backward_kernels.profile_backward(cfg)
    assert [r["kernel"].split("(")[0].split("<")[0] for r in launches] == [
        "void cudnn::compute_dot_do_o_specialized", "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16"
        "_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0", "void cudnn::convert_dq_to_16bits"]
    main = backward_kernels.kernel_summary(launches[1])
    assert main["grid"] == 132 and main["threads"] == 384 and main["registers"] == 168
    assert main["shared_kib"] == pytest.approx(216064 / 1024)
    assert main["ms"] == pytest.approx(2.29952) and main["tensor_busy_pct"] == pytest.approx(65.81)


def test_target_config_checks_its_arguments():
    cfg = backward_kernels.target_config("fast_triton", B=1, H=2, N=17, D=16, tiles={"dq_tiles": (16, 16, 4, 1)})
    assert cfg["tiles"] == {"dq_tiles": [16, 16, 4, 1]} and cfg["dtype"] == "float16"
    with pytest.raises(ValueError, match="tiles are for backward='fast_triton'"):
        backward_kernels.target_config("fast", B=1, H=2, N=17, D=16, tiles={"dq_tiles": (16, 16, 4, 1)})
    with pytest.raises(ValueError, match="backward must be one of sdpa, fast"):
        backward_kernels.target_config("flash", B=1, H=1, N=1, D=16)
    with pytest.raises(ValueError, match="dtype must be"):
        backward_kernels.target_config("sdpa", B=1, H=1, N=1, D=16, dtype="float64")
    with pytest.raises(ValueError, match="tiles takes dkdv_tiles and dq_tiles"):
        backward_kernels.target_config("fast_triton", B=1, H=1, N=1, D=16, tiles={"block_m": 16})


@pytest.mark.parametrize("causal", [False, True])
def test_the_target_runs_every_backward_on_the_same_problem(causal):
    """What ncu profiles computes the gradients: SDPA's and the fast backward's agree on the target's inputs
    (on a Hopper GPU "fast" and "fast_triton" are different kernels; elsewhere both run the Triton ones)."""
    problem = dict(B=2, H=2, N=17, D=16, dtype="float32", causal=causal)
    sdpa = backward_kernels.run_target(backward_kernels.target_config("sdpa", **problem), calls=1)
    for name in ("fast", "fast_triton"):
        ours = backward_kernels.run_target(backward_kernels.target_config(name, **problem), calls=2)
        for mine, theirs in zip(ours, sdpa, strict=True):  # each within TOL of float64, so within 2·TOL
            assert rel_error(mine.double(), theirs.double()) < 2 * TOL[torch.float32], name


def test_without_ncu_the_error_says_so(monkeypatch):
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    cfg = backward_kernels.target_config("sdpa", B=1, H=1, N=16, D=16)
    with pytest.raises(profile.NcuUnavailable, match="not installed"):
        backward_kernels.profile_backward(cfg)


def test_the_kernel_regex_matches_backward_kernels_only():
    for name in ("bwd_dkdv_fast", "bwd_dq_fast", "bwd_preprocess_fast", "bwd_kernel_gluon", "bwd_dq_finish",
                 "cudnn_generated_fort_native_sdpa_sm90_"
                 "flash_bprop_wgmma_f16_knob_26", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel"):
        assert re.search(backward_kernels.KERNEL_REGEX, name), name
    for name in ("attn_kernel_fast", "attn_kernel_gluon", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma",
                 "flash_fwd_kernel"):
        assert not re.search(backward_kernels.KERNEL_REGEX, name), name
