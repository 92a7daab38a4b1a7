"""The HBM traffic model: hand counts, brute-force kernel loops, byte counts of real kernel runs."""

from __future__ import annotations

import contextlib
import itertools
import math

import numpy as np
import pytest
import torch

import flashattn
from flashattn import runtime, traffic


def problem(**kw):
    base = dict(B=1, H=1, N=4, D=2, dtype_bytes=4, block_m=2, block_n=2, causal=False)
    base.update(kw)
    return base


# --- hand counts ------------------------------------------------------------------------------
# B=1, H=1, N=4, D=2, float32, blocks 2×2:
#   X = 1·1·4·2·4 = 32 bytes (one of Q, K, V, O), L = 1·1·4·4 = 16 bytes, Tr = Tc = 2.
#   S = 4·4 float32 = 64 bytes, P = 4·4·4 = 64 bytes.
HAND_N4 = {
    # K + V + Tc·(Q + O + 2L) = 32 + 32 + 2·(32 + 32 + 32) = 256;  Tc·(O + 2L) = 2·(32 + 32) = 128
    "v1": {"read": 256, "write": 128},
    # Q + Tr·(K + V) = 32 + 2·64 = 160;  O = 32
    "v2": {"read": 160, "write": 32},
    "v2_kt_view": {"read": 160, "write": 32},
    "v2_padded": {"read": 160, "write": 32},
    # v2 + host copy of K: 160 + 32 read, 32 + 32 written
    "v2_kt": {"read": 192, "write": 64},
    # Tc·Q + Tr·K + 3·S + P + Tr·V = 64 + 64 + 192 + 64 + 64 = 448;  S + P + O = 64 + 64 + 32 = 160
    "naive": {"read": 448, "write": 160},
}

# Same problem, causal.
#   v1: Q block 0 is visited by K block 0 only (K block 1 starts at row 2 > 0·2 + 1), Q block 1 by both:
#       3 visits of 2 rows; a visit reads Q, O rows (2·8 each) + l, m (2·4 each) = 48 bytes, writes 32.
#       read = K + V + 3·48 = 64 + 144 = 208, write = 3·32 = 96.
#   v2: Q block 0 reads K/V rows 0..1 (hi = 2), Q block 1 rows 0..3: (2 + 4) rows · 8 bytes · (K and V)
#       = 96, plus Q = 32: read 128, write O = 32.
#   naive: no skipping, the same as non-causal.
HAND_N4_CAUSAL = {
    "v1": {"read": 208, "write": 96},
    "v2": {"read": 128, "write": 32},
    "v2_kt": {"read": 160, "write": 64},
    "naive": {"read": 448, "write": 160},
}

# B=1, H=1, N=5 (not a multiple of the blocks), D=2, float16 (2 bytes), blocks 2×2:
#   X = 5·2·2 = 20, L = 5·4 = 20, Tr = Tc = 3 with rows (2, 2, 1); S = 25·4 = 100, P = 25·2 = 50.
#   v1:   read = 2·20 + 3·(20 + 20 + 2·20) = 280, write = 3·(20 + 2·20) = 180
#   v2:   read = 20 + 3·(20 + 20) = 140, write = 20
#   naive read = 3·20 + 3·20 + 3·100 + 50 + 3·20 = 530, write = 100 + 50 + 20 = 170
#   causal v1: K block j visits Q block i iff 2j <= 2i + 1, i.e. j <= i: visit rows 2·1 + 2·2 + 1·3 = 9;
#       per visited row Q 4 + O 4 + l 4 + m 4 = 16 read, O 4 + l 4 + m 4 = 12 written:
#       read = 40 + 9·16 = 184, write = 9·12 = 108
#   causal v2: hi = 2, 4, 5 -> K/V rows 2, 4, 5 (the last block's 6th row is past N) = 11 rows;
#       read = 20 + 11·4·2 = 108, write = 20
HAND_N5 = {
    ("v1", False): {"read": 280, "write": 180},
    ("v2", False): {"read": 140, "write": 20},
    ("naive", False): {"read": 530, "write": 170},
    ("v1", True): {"read": 184, "write": 108},
    ("v2", True): {"read": 108, "write": 20},
    ("naive", True): {"read": 530, "write": 170},
}


@pytest.mark.parametrize("variant", sorted(HAND_N4))
def test_hand_counts_n4(variant):
    assert traffic.hbm_bytes(variant, **problem()) == HAND_N4[variant]


@pytest.mark.parametrize("variant", sorted(HAND_N4_CAUSAL))
def test_hand_counts_n4_causal(variant):
    assert traffic.hbm_bytes(variant, **problem(causal=True)) == HAND_N4_CAUSAL[variant]


@pytest.mark.parametrize("variant,causal", sorted(HAND_N5))
def test_hand_counts_n5_float16(variant, causal):
    got = traffic.hbm_bytes(variant, **problem(N=5, dtype_bytes=2, causal=causal))
    assert got == HAND_N5[(variant, causal)]


def test_hand_count_v1_causal_unequal_blocks():
    # N=5, block_m=4, block_n=2: Q blocks of 4 and 1 rows, K blocks starting at 0, 2, 4.
    # Q block 0 (rows 0..3) is visited by K blocks starting at 0 and 2 (<= 3): 2 visits · 4 rows = 8;
    # Q block 1 (row 4) by all three: 3 visits · 1 row = 3. 11 visited rows, D=2, float32:
    # read = K + V (2·40) + 11·(8 + 8 + 4 + 4) = 80 + 264 = 344, write = 11·(8 + 4 + 4) = 176.
    got = traffic.hbm_bytes("v1", **problem(N=5, block_m=4, block_n=2, causal=True))
    assert got == {"read": 344, "write": 176}


def test_formulas_for_multiples_of_the_blocks():
    B, H, N, D, db, bm, bn = 2, 3, 256, 64, 2, 64, 32
    X, L = B * H * N * D * db, B * H * N * 4
    Tr, Tc = N // bm, N // bn
    p = dict(B=B, H=H, N=N, D=D, dtype_bytes=db, block_m=bm, block_n=bn)
    assert traffic.hbm_bytes("v1", **p) == {"read": 2 * X + Tc * (2 * X + 2 * L), "write": Tc * (X + 2 * L)}
    assert traffic.hbm_bytes("v2", **p) == {"read": X + Tr * 2 * X, "write": X}
    assert traffic.hbm_bytes("v2_kt", **p) == {"read": 2 * X + Tr * 2 * X, "write": 2 * X}
    S, P = B * H * N * N * 4, B * H * N * N * db
    assert traffic.hbm_bytes("naive", **p) == {"read": Tc * X + 2 * Tr * X + 3 * S + P, "write": S + P + X}


def test_breakdown_sums_to_hbm_bytes_and_names_tensors():
    p = problem(N=37, D=16, block_m=8, block_n=16, causal=True)
    for variant in traffic.modelled_variants():
        parts = traffic.traffic_breakdown(variant, **p)
        total = traffic.hbm_bytes(variant, **p)
        assert sum(v["read"] for v in parts.values()) == total["read"]
        assert sum(v["write"] for v in parts.values()) == total["write"]
    assert set(traffic.traffic_breakdown("v1", **p)) == {"Q", "K", "V", "O", "l", "m"}
    assert set(traffic.traffic_breakdown("naive", **p)) == {"Q", "K", "V", "O", "S", "P"}
    assert "K^T copy" in traffic.traffic_breakdown("v2_kt", **p)


# --- brute force: loops that mirror the kernels -----------------------------------------------


def brute_force(variant, *, B, H, N, D, dtype_bytes, block_m, block_n, causal):
    """Walk the kernels' loops program by program and add up each masked load and store."""
    row, stat, bh = D * dtype_bytes, 4, B * H
    read = write = 0
    if variant == "v1":  # grid (B·H,); outer loop over K/V blocks, inner over Q blocks
        for _ in range(bh):
            for start_n in range(0, N, block_n):
                read += 2 * min(block_n, N - start_n) * row  # kj, vj
                lo = (start_n // block_m) * block_m if causal else 0
                for start_m in range(lo, N, block_m):
                    rows = min(block_m, N - start_m)
                    read += rows * (2 * row + 2 * stat)  # qi, oi, li, mi
                    write += rows * (row + 2 * stat)  # oi, li, mi
    elif variant in ("v2", "v2_kt", "v2_kt_view", "v2_padded"):  # grid (cdiv(N, BM), B·H)
        for pid_m, _ in itertools.product(range(math.ceil(N / block_m)), range(bh)):
            read += min(block_m, N - pid_m * block_m) * row  # qi
            hi = min(N, (pid_m + 1) * block_m) if causal else N
            for start_n in range(0, hi, block_n):
                read += 2 * min(block_n, N - start_n) * row  # kj, vj
            write += min(block_m, N - pid_m * block_m) * row  # O
        if variant == "v2_kt":
            read += bh * N * row
            write += bh * N * row
    elif variant == "naive":
        for _ in range(bh):
            for start_m, start_n in itertools.product(range(0, N, block_m), range(0, N, block_n)):
                rows, cols = min(block_m, N - start_m), min(block_n, N - start_n)
                read += (rows + cols) * row  # scores_kernel: qi, kj
                write += rows * cols * stat  # S tile
            for start_m in range(0, N, block_m):
                rows = min(block_m, N - start_m)
                for _pass in range(3):  # softmax_kernel: max, sum, write passes over S
                    read += rows * N * stat
                write += rows * N * dtype_bytes  # P
                read += rows * N * dtype_bytes  # pv_kernel: P
                for start_n in range(0, N, block_n):
                    read += min(block_n, N - start_n) * row  # pv_kernel: V
                write += rows * row  # O
    return {"read": read, "write": write}


SMALL_SHAPES = [
    dict(N=n, block_m=bm, block_n=bn)
    for n in (1, 2, 3, 5, 16, 17, 31, 33, 64, 100)
    for bm, bn in ((1, 1), (2, 3), (4, 4), (16, 16), (16, 32), (32, 16), (64, 64))
]


@pytest.mark.parametrize("variant", traffic.modelled_variants())
@pytest.mark.parametrize("causal", [False, True])
def test_matches_brute_force_kernel_loops(variant, causal):
    for shape in SMALL_SHAPES:
        p = dict(B=2, H=3, D=8, dtype_bytes=2, causal=causal, **shape)
        assert traffic.hbm_bytes(variant, **p) == brute_force(variant, **p), (variant, p)


def test_v1_causal_rule_matches_the_kernels_lower_bound():
    # the brief's rule "K block j visits Q block i iff j·bn <= i·bm + bm - 1" and the kernel's
    # lo = (j·bn // bm)·bm select the same pairs
    for N, bm, bn in itertools.product(range(1, 40), (1, 2, 3, 4, 8, 16), (1, 2, 3, 4, 8, 16)):
        for j, i in itertools.product(range(math.ceil(N / bn)), range(math.ceil(N / bm))):
            assert (j * bn <= i * bm + bm - 1) == (i * bm >= (j * bn // bm) * bm)


# --- against real kernel runs in the interpreter: count every masked element ------------------


@contextlib.contextmanager
def count_kernel_bytes():
    """Patch the Triton interpreter's load/store to count the bytes of unmasked elements."""
    from triton.runtime import interpreter

    counts = {"read": 0, "write": 0}
    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def nbytes(ptrs, mask):
        item = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        return int(np.broadcast_to(mask.data, ptrs.data.shape).sum()) * item

    def counting_load(self, ptrs, mask, other, *flags):  # flags: the cache and volatile flags, which differ by release
        counts["read"] += nbytes(ptrs, mask)
        return load(self, ptrs, mask, other, *flags)

    def counting_store(self, ptrs, value, mask, *flags):
        counts["write"] += nbytes(ptrs, mask)
        return store(self, ptrs, value, mask, *flags)

    builder.create_masked_load, builder.create_masked_store = counting_load, counting_store
    try:
        yield counts
    finally:
        builder.create_masked_load, builder.create_masked_store = load, store


KERNEL_CASES = [  # (variant, causal, block_m, block_n, dtype); N = 37 is not a multiple of any block
    ("naive", False, 16, 32, torch.float16),
    ("v1", False, 16, 32, torch.float32),
    ("v1", True, 32, 16, torch.float16),
    ("v2", True, 32, 16, torch.float32),
    ("v2", False, 16, 16, torch.float16),
    ("v2_kt", True, 16, 32, torch.float32),
    ("v2_kt_view", False, 32, 16, torch.float32),
    ("v2_padded", True, 16, 16, torch.float32),
]


@pytest.mark.skipif(runtime.MODE != "interpreter", reason="counts elements through the Triton interpreter")
@pytest.mark.parametrize("variant,causal,block_m,block_n,dtype", KERNEL_CASES)
def test_matches_bytes_the_kernels_request(variant, causal, block_m, block_n, dtype):
    B, H, N, D = 1, 2, 37, 16
    q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=3)
    with count_kernel_bytes() as counted:
        flashattn.VARIANTS[variant](q, k, v, causal=causal, block_m=block_m, block_n=block_n)
    model = traffic.hbm_bytes(variant, B=B, H=H, N=N, D=D, dtype_bytes=q.element_size(),
                              block_m=block_m, block_n=block_n, causal=causal)
    if variant == "v2_kt":  # the host transpose copy is PyTorch's, not a Triton load/store
        host = B * H * N * D * q.element_size()
        model = {"read": model["read"] - host, "write": model["write"] - host}
    assert counted["read"] > 0
    assert counted == model


# --- behaviour --------------------------------------------------------------------------------


def test_v2_writes_tc_times_less_than_v1():
    for N, D, db, bm, bn in itertools.product((512, 2048), (32, 64, 128), (2, 4), (32, 64), (32, 64, 128)):
        p = dict(B=2, H=4, N=N, D=D, dtype_bytes=db, block_m=bm, block_n=bn)
        v1, v2 = traffic.hbm_bytes("v1", **p), traffic.hbm_bytes("v2", **p)
        # v1 writes O, l, m once per K/V block: Tc·(1 + 2·4 / (D·dtype_bytes)) times O
        assert v1["write"] / v2["write"] == pytest.approx((N // bn) * (1 + 8 / (D * db)))


def test_v2_reads_about_as_much_as_v1_at_equal_blocks_and_less_with_taller_q_blocks():
    p = dict(B=4, H=16, N=4096, D=64, dtype_bytes=4)
    same = traffic.savings(traffic.hbm_bytes("v2", **p, block_m=64, block_n=64),
                           traffic.hbm_bytes("v1", **p, block_m=64, block_n=64))
    # no cache reuse: v2 re-reads K and V once per Q block, v1 re-reads Q and O once per K block
    assert 0 < same["read"] < 0.05
    assert same["write"] > 0.98
    taller = traffic.savings(traffic.hbm_bytes("v2", **p, block_m=128, block_n=64),
                             traffic.hbm_bytes("v1", **p, block_m=128, block_n=64))
    assert taller["read"] == pytest.approx(0.5, abs=0.02)


def test_naive_grows_quadratically_and_v2_writes_linearly():
    p = dict(B=1, H=2, D=64, dtype_bytes=2, block_m=64, block_n=64)
    small, big = (traffic.hbm_bytes("naive", N=n, **p) for n in (8192, 16384))
    assert big["write"] / small["write"] == pytest.approx(4, rel=0.01)
    small, big = (traffic.hbm_bytes("v2", N=n, **p) for n in (8192, 16384))
    assert big["write"] / small["write"] == 2


def test_causal_skips_blocks_in_v1_and_v2_but_not_in_naive():
    p = dict(B=1, H=2, N=4096, D=64, dtype_bytes=2, block_m=64, block_n=64)
    for variant in ("v1", "v2", "v2_kt_view"):
        full, causal = traffic.hbm_bytes(variant, **p), traffic.hbm_bytes(variant, **p, causal=True)
        assert causal["read"] < 0.55 * full["read"]
    assert traffic.hbm_bytes("naive", **p, causal=True) == traffic.hbm_bytes("naive", **p)
    assert traffic.hbm_bytes("v2", **p, causal=True)["write"] == traffic.hbm_bytes("v2", **p)["write"]


def test_padded_and_view_read_what_v2_reads_and_kt_adds_one_copy():
    p = dict(B=3, H=2, N=777, D=32, dtype_bytes=2, block_m=64, block_n=32, causal=True)
    v2 = traffic.hbm_bytes("v2", **p)
    assert traffic.hbm_bytes("v2_padded", **p) == v2
    assert traffic.hbm_bytes("v2_kt_view", **p) == v2
    x = 3 * 2 * 777 * 32 * 2
    assert traffic.hbm_bytes("v2_kt", **p) == {"read": v2["read"] + x, "write": v2["write"] + x}


# --- validation -------------------------------------------------------------------------------


def test_unknown_variant_lists_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown variant 'v3'.*naive, v1, v2, v2_kt, v2_kt_view, v2_padded"):
        traffic.hbm_bytes("v3", **problem())
    with pytest.raises(TypeError, match="variant must be a str"):
        traffic.hbm_bytes(2, **problem())
    with pytest.raises(ValueError, match="unknown variant 'fast'"):  # registered, but not modelled
        traffic.hbm_bytes("fast", **problem())


@pytest.mark.parametrize("name", ["B", "H", "N", "D", "dtype_bytes", "block_m", "block_n"])
def test_non_positive_ints_are_rejected(name):
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"{name} must be a positive int, got {bad}"):
            traffic.hbm_bytes("v2", **problem(**{name: bad}))


@pytest.mark.parametrize("name", ["B", "H", "N", "D", "dtype_bytes", "block_m", "block_n"])
def test_wrong_types_are_rejected(name):
    for bad in (2.0, "2", True, None):
        with pytest.raises(TypeError, match=f"{name} must be an int"):
            traffic.hbm_bytes("v1", **problem(**{name: bad}))


def test_causal_must_be_a_bool_and_numpy_ints_are_fine():
    with pytest.raises(TypeError, match="causal must be True or False"):
        traffic.hbm_bytes("v2", **problem(causal=1))
    assert traffic.hbm_bytes("v2", **problem(N=np.int64(4))) == HAND_N4["v2"]


def test_missing_argument_is_a_type_error():
    with pytest.raises(TypeError):
        traffic.hbm_bytes("v2", B=1, H=1, N=4, D=2, dtype_bytes=4, block_m=2)


# --- helpers ----------------------------------------------------------------------------------


def test_traffic_table_rows():
    rows = traffic.traffic_table(("v1", "v2"), **problem())
    assert [r["variant"] for r in rows] == ["v1", "v2"]
    assert rows[0] == {"variant": "v1", "read": 256, "write": 128, "total": 384}
    assert [r["variant"] for r in traffic.traffic_table(**problem())] == traffic.modelled_variants()
    assert traffic.traffic_table("v2", **problem())[0]["total"] == 192
    text = traffic.format_table(rows)
    assert text.splitlines()[1].split()[:3] == ["v1", "256", "B"]


def test_savings_and_sentence():
    v1, v2 = HAND_N4["v1"], HAND_N4["v2"]
    s = traffic.savings(v2, v1)
    assert s == pytest.approx({"read": 1 - 160 / 256, "write": 1 - 32 / 128, "total": 1 - 192 / 384})
    assert traffic.describe_savings("v2", v2, "v1", v1) == "v2 reads 37.5 % less and writes 75.0 % less than v1"
    assert "reads 60.0 % more" in traffic.describe_savings("v1", v1, "v2", v2)
    with pytest.raises(TypeError, match="hbm_bytes"):
        traffic.savings({"read": 1}, v1)


def test_format_bytes_and_n_sweep():
    assert traffic.format_bytes(11_580_000_000) == "11.58 GB"
    assert traffic.format_bytes(412_180_000) == "412.18 MB"
    assert traffic.format_bytes(512) == "512 B"
    assert traffic.format_bytes(80 * 2**20, binary=True) == "80.00 MiB"
    assert traffic.format_bytes(None) == "—" and traffic.format_bytes(232448, binary=True) == "227.00 KiB"
    assert traffic.n_sweep(1024) == [128, 256, 512, 1024]
    assert traffic.n_sweep(1000, 100) == [128, 256, 512]
    with pytest.raises(ValueError):
        traffic.n_sweep(64)
