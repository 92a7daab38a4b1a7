"""flashattn.roofline: the memory hierarchy, arithmetic intensity, the roofline, naive attention's memory."""

import numpy as np
import pytest
import torch
from helpers import toy_hardware

from flashattn import recorded, roofline, runtime, traffic
from flashattn.kernels import naive as naive_module

# --- arithmetic intensity, worked by hand --------------------------------------------------------


def test_matmul_flops_bytes_intensity_by_hand():
    # 3×7 times 7×5: 105 multiply-adds = 210 FLOP; A 21, B 35, C 15 elements of 4 bytes = 284 bytes
    assert roofline.matmul_flops(3, 5, 7) == 210
    assert roofline.matmul_bytes(3, 5, 7, 4) == 284
    assert roofline.matmul_intensity(3, 5, 7, 4) == pytest.approx(210 / 284)


def test_square_matmul_intensity_is_n_over_3_in_fp16():
    # 2n³ FLOP over 3n² elements × 2 bytes = n/3
    for n in (48, 4096, 8193):
        assert roofline.matmul_intensity(n, n, n, 2) == pytest.approx(n / 3)


def test_intensity_rejects_zero_bytes():
    with pytest.raises(ValueError, match="bytes_moved"):
        roofline.intensity(1.0, 0)


def test_roofline_is_min_of_the_two_roofs():
    assert roofline.roofline(10.0, 660.0, 4.25) == pytest.approx(42.5)  # memory-bound
    assert roofline.roofline(1000.0, 660.0, 4.25) == pytest.approx(660.0)  # compute-bound
    out = roofline.roofline(np.array([1.0, 100.0, 1e4]), 50.0, 2.0)
    np.testing.assert_allclose(out, [2.0, 50.0, 50.0])
    assert isinstance(roofline.roofline(3.0, 50.0, 2.0), float)


def test_ridge_point_and_bound():
    assert roofline.ridge_point(660.0, 4.4) == pytest.approx(150.0)
    assert roofline.bound(149.0, 660.0, 4.4) == "memory"
    assert roofline.bound(150.0, 660.0, 4.4) == "compute"


def test_minimum_attention_intensity_is_n_over_dtype_bytes():
    # 4·B·H·N²·D FLOP over 4 tensors of B·H·N·D·b bytes = N / b
    for B, H, N, D, b in ((1, 1, 8, 4, 2), (2, 3, 1000, 64, 4), (1, 16, 4096, 128, 2)):
        assert roofline.attention_intensity("minimum", B=B, H=H, N=N, D=D, dtype_bytes=b) == pytest.approx(N / b)
    causal = roofline.attention_intensity("minimum", B=1, H=1, N=8, D=4, dtype_bytes=2, causal=True)
    assert causal == pytest.approx(2.0)  # half the FLOP, same bytes


def test_v2_attention_bytes_and_intensity_by_hand():
    # B=2 H=3 N=256 D=64 fp16, blocks 128×64: X = 196608; Tr = 2; read = X + 2·(X + X), write = X
    X = 2 * 3 * 256 * 64 * 2
    got = roofline.attention_bytes("v2", B=2, H=3, N=256, D=64, dtype_bytes=2, block_m=128, block_n=64)
    assert got == 6 * X
    flops = 4 * 2 * 3 * 256**2 * 64
    assert roofline.attention_intensity("v2", B=2, H=3, N=256, D=64, dtype_bytes=2, block_m=128,
                                        block_n=64) == pytest.approx(flops / (6 * X))


def test_naive_attention_bytes_by_hand():
    # B=H=1 N=64 D=16 float32, blocks 32×32: X = 4096, Tr = Tc = 2, S = P = 64²·4 = 16384
    # read = Tc·X (Q) + Tr·X (K) + Tr·X (V) + 3·S + P ; write = S + P + X
    X, S, P = 4096, 16384, 16384
    expected = (2 * X + 2 * X + 2 * X + 3 * S + P) + (S + P + X)
    assert roofline.attention_bytes("naive", B=1, H=1, N=64, D=16, dtype_bytes=4, block_m=32, block_n=32) == expected


def test_attention_bytes_defaults_to_the_gpu_block_sizes():
    for variant in ("naive", "v1", "v2"):
        bm, bn = roofline.gpu_default_blocks(variant, "float16", 64)
        counts = traffic.hbm_bytes(variant, B=2, H=2, N=300, D=64, dtype_bytes=2, block_m=bm, block_n=bn)
        got = roofline.attention_bytes(variant, B=2, H=2, N=300, D=64, dtype_bytes=2)
        assert got == counts["read"] + counts["write"]


def test_gpu_default_blocks_ask_for_the_gpu_choice():
    from flashattn.kernels import default_options

    assert roofline.gpu_default_blocks("v2", "float16", 64) == (128, 64)
    assert roofline.gpu_default_blocks("v2_padded", "float16", 64) == (64, 64)
    assert default_options("v2", torch.float16, 64, mode="interpreter")["block_m"] == 64
    assert default_options("v1", torch.float32, 64, mode="gpu")["num_warps"] == 8
    with pytest.raises(ValueError, match="unknown variant"):
        roofline.gpu_default_blocks("v9")


def test_fused_attention_has_higher_intensity_than_naive():
    kw = dict(B=4, H=16, N=4096, D=64, dtype_bytes=2)
    naive, v2, minimum = (roofline.attention_intensity(v, **kw) for v in ("naive", "v2", "minimum"))
    assert naive < v2 < minimum


def test_hierarchy_rows_by_hand():
    rows = roofline.hierarchy_rows(toy_hardware())
    assert [r["level"].split()[0] for r in rows] == ["HBM", "L2", "shared", "registers"]
    hbm, l2, smem, regs = rows
    assert hbm["total"] == 3 * 2**30 and hbm["bandwidth_gbps"] == 2000.0
    assert l2["total"] == 4096 and l2["bandwidth_gbps"] is None
    assert smem["per_sm"] == 1024 and smem["total"] == 2048
    assert smem["bandwidth_gbps"] == pytest.approx(128 * 2 * 1000e6 / 1e9)  # 128 B/clock/SM × 2 SMs × 1 GHz
    assert regs["per_sm"] == 400 and regs["total"] == 800
    assert roofline.hierarchy_rows(toy_hardware(clock=None))[2]["bandwidth_gbps"] is None
    unknown = {**toy_hardware(), "shared_memory_per_sm_bytes": None, "register_bytes_per_sm": None}
    assert [r["total"] for r in roofline.hierarchy_rows(unknown)[2:]] == [None, None]
    assert "| — | — |" in roofline.hierarchy_markdown(unknown)


def test_hierarchy_markdown_has_a_row_per_level():
    text = roofline.hierarchy_markdown(toy_hardware())
    lines = text.splitlines()
    assert len(lines) == 2 + 4
    assert "2.0 TB/s" in lines[2] and "3.00 GiB" in lines[2]  # capacities in binary units


# --- naive attention's memory --------------------------------------------------------------------


def test_naive_intermediate_bytes_by_hand():
    assert roofline.naive_intermediate_bytes(2, 3, 5, 2) == {"S": 600, "P": 300, "total": 900}


def test_naive_intermediate_bytes_match_the_kernels_buffers():
    B, H, N, D = 1, 2, 33, 16
    q, k, v = runtime.random_qkv(B, H, N, D, dtype=torch.float16, seed_value=3)
    _, S, P = naive_module.naive_attention(q, k, v, return_intermediates=True)
    got = roofline.naive_intermediate_bytes(B, H, N, 2)
    assert got["S"] == S.numel() * S.element_size()
    assert got["P"] == P.numel() * P.element_size()


def test_naive_oom_n_by_hand():
    # B=H=D=1, 4-byte elements: q, k, v, o take 16·N bytes, S + P take 8·N²
    fits_64 = 16 * 64 + 8 * 64**2
    assert roofline.naive_oom_n(fits_64, 1, 1, 1, 4) == 128
    assert roofline.naive_oom_n(fits_64 - 1, 1, 1, 1, 4) == 64


def test_naive_oom_n_matches_the_recorded_out_of_memory_point():
    m = recorded.get("memory_vs_n")
    ooms = [r["N"] for r in m["rows"] if r["variant"] == "naive" and "oom" in r]
    memory = recorded.get("device")["properties"]["total_memory_bytes"]
    dtype_bytes = torch.empty(0, dtype=getattr(torch, m["dtype"])).element_size()
    assert roofline.naive_oom_n(memory, m["B"], m["H"], m["D"], dtype_bytes) == min(ooms)


def test_attention_flops_convention():
    assert roofline.attention_flops(2, 3, 5, 7) == 4 * 2 * 3 * 5 * 5 * 7
    assert roofline.attention_flops(2, 3, 5, 7, causal=True) == 2 * 2 * 3 * 5 * 5 * 7
