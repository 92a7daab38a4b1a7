"""flashattn.fma_loads: the model of Triton's shared-memory loads on the CUDA-core (FMA) path."""

from __future__ import annotations

import pytest
import torch

from flashattn import fma_loads, runtime
from flashattn.kernels import v2 as v2_module


def test_fma_threads_per_warp_rule():
    assert fma_loads.fma_threads_per_warp(64) == (2, 16)
    assert fma_loads.fma_threads_per_warp(32) == (4, 8)
    assert fma_loads.fma_threads_per_warp(128) == (1, 32)
    assert fma_loads.fma_threads_per_warp(256) == (1, 32)


def test_fma_loop_loads_hand_counts():
    # D=32, 4 warps, 64×64 blocks. Q·Kᵀ: lanes 2×16, warp rows 8 per repetition, 2 repetitions;
    # Q: 2 reps × 4 rows × 8 k-chunks = 64 loads, lanes 0-15 / 16-31 share a row -> 1 per phase -> 4 each.
    # K (v2): 4 columns × 8 k-chunks = 32 loads; a phase's 8 lanes read 8 rows' chunk k -> 8 each, 32 a load.
    # K (v2_kt): 32 k × 1 = 32 loads of 16 consecutive floats per half-warp -> 4 each.
    # P·V (output 64×32): lanes 4×8; P: 4 rows × 16 chunks = 64 loads (8 lanes per row) -> 4; V: 64 loads -> 4.
    loads = {x.operand: x for x in fma_loads.fma_loop_loads("v2", 32, num_warps=4)}
    assert {k: (x.instructions, x.wavefronts) for k, x in loads.items()} == {
        "Q": (64, 256), "K": (32, 1024), "P": (64, 256), "V": (64, 256)}
    assert loads["K"].conflict_ways == 8 and loads["Q"].conflict_ways == 1 and loads["K"].ideal == 128
    kt = {x.operand: (x.instructions, x.wavefronts) for x in fma_loads.fma_loop_loads("v2_kt", 32, num_warps=4)}
    assert kt == {"Q": (64, 256), "K": (32, 128), "P": (64, 256), "V": (64, 256)}
    view = [(x.instructions, x.wavefronts) for x in fma_loads.fma_loop_loads("v2_kt_view", 32, num_warps=4)]
    assert view == [(x.instructions, x.wavefronts) for x in fma_loads.fma_loop_loads("v2", 32, num_warps=4)]
    s64 = fma_loads.fma_loop_summary(64, num_warps=8, variants=("v2", "v2_kt", "v2_padded"))
    assert s64["v2"]["instructions"] == s64["v2_kt"]["instructions"] == 256
    assert (s64["v2"]["wavefronts"], s64["v2_kt"]["wavefronts"]) == (64 * 4 + 64 * 32 + 64 * 4 + 64 * 4, 256 * 4)
    assert s64["v2_padded"]["instructions"] == 448  # D_PAD=128: 128 + 128 + 2·64 + 64


def test_predicted_ratios():
    r32 = fma_loads.predicted_ratios(32, num_warps=4)
    assert r32 == {"simple": 32.0, "k_tile_triton": 8.0, "loop_triton": 1792 / 896}
    r64 = fma_loads.predicted_ratios(64, num_warps=8)
    assert r64 == {"simple": 32.0, "k_tile_triton": 8.0, "loop_triton": 2816 / 1024}


def test_fma_loop_loads_rejects():
    with pytest.raises(ValueError, match="unknown variant"):
        fma_loads.fma_loop_loads("v1", 32)
    with pytest.raises(ValueError, match="multiples of 4"):
        fma_loads.fma_loop_loads("v2", 30)
    with pytest.raises(ValueError, match="num_warps"):
        fma_loads.fma_loop_loads("v2", 32, num_warps=0)


@pytest.mark.parametrize("D", [16, 32, 64, 128])
def test_fma_num_warps_follows_the_kernels_gpu_defaults(monkeypatch, D):
    monkeypatch.setattr(runtime, "MODE", "interpreter")  # the model is about a GPU launch, in any mode
    assert fma_loads.fma_num_warps(D) == v2_module.default_options(torch.float32, D, "gpu")["num_warps"]
