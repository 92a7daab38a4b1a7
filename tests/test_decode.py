"""attention_with_kvcache (notebook 15): the split-KV kernels against the float64 reference, contiguous and paged,
and the errors of bad input."""

import functools

import pytest
import torch
from helpers import DTYPES, TOL, rel_error
from hypothesis import given
from hypothesis import strategies as st

import flashattn
from flashattn import runtime
from flashattn.kernels import decode, decode_plan
from flashattn.measure.measurements.decode import cuda_graph_replay
from flashattn.reference import reference_with_kvcache

DEV = runtime.DEVICE


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(device=DEV, dtype=dtype)


def contiguous_cache(B, S_max, Hkv, D, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return randn(gen, B, S_max, Hkv, D, dtype=dtype), randn(gen, B, S_max, Hkv, D, dtype=dtype)


def paged(k_cache, v_cache, page_size, seed, spare=3):
    """The same cache in pages of ``page_size`` keys, shuffled among ``spare`` unused pages, and its block table."""
    B, S_max, Hkv, D = k_cache.shape
    per_seq = -(-S_max // page_size)
    num_pages = B * per_seq + spare
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))[: B * per_seq]
    pad = per_seq * page_size - S_max
    kp = torch.full((num_pages, page_size, Hkv, D), float("nan"), dtype=k_cache.dtype, device=DEV)  # unused: NaN
    vp = kp.clone()
    for dst, src in ((kp, k_cache), (vp, v_cache)):
        padded = torch.nn.functional.pad(src, (0, 0, 0, 0, 0, pad))
        dst[order.to(DEV)] = padded.reshape(B * per_seq, page_size, Hkv, D)
    return kp, vp, order.view(B, per_seq).int().to(DEV)


def lens(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEV)


def check(q, k, v, seqlens, *, block_table=None, causal=True, num_splits=0, tiles=None, merge=None):
    out = decode.decode_attention(q, k, v, seqlens, block_table=block_table, causal=causal, num_splits=num_splits,
                                  tiles=tiles, merge=merge)
    ref = reference_with_kvcache(q, k, v, seqlens, block_table=block_table, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    err = rel_error(out, ref)
    assert err < TOL[q.dtype], (err, num_splits, causal)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_ragged_lengths_every_split_count(dtype, causal):
    # GQA 4/2, three queries; lengths 3 (= Lq), a block boundary ± 1 (32 keys per block here) and S_max
    B, Lq, Hq, Hkv, D, S_max = 4, 3, 4, 2, 32, 80
    k, v = contiguous_cache(B, S_max, Hkv, D, dtype, seed=1)
    q = randn(torch.Generator().manual_seed(2), B, Lq, Hq, D, dtype=dtype)
    seqlens = lens(3, 31, 33, S_max)
    for num_splits in (1, 2, 3, 7):  # 7: more splits than the longest sequence's 3 key blocks
        check(q, k, v, seqlens, causal=causal, num_splits=num_splits)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_query_one_key_and_auto_splits(dtype):
    # Lq = 1 against caches of 1 key and up; num_splits = 0 (the rule), multi-head (Hq = Hkv) and grouped
    k, v = contiguous_cache(3, 70, 2, 16, dtype, seed=3)
    for Hq in (2, 6):
        q = randn(torch.Generator().manual_seed(Hq), 3, 1, Hq, 16, dtype=dtype)
        check(q, k, v, lens(1, 64, 70), num_splits=0)
        check(q, k, v, 17, num_splits=2)  # an int: every sequence 17 keys


@pytest.mark.parametrize("table_row", [0, 64], ids=["table load", "table row"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size, tiles", [(16, (32, 4, 1)), (32, (16, 4, 1)), (32, (32, 4, 1)), (48, (32, 4, 1)),
                                              (64, (32, 4, 1))])
def test_paged_equals_contiguous(dtype, page_size, tiles, table_row):
    # pages shorter than a key block (one table entry per key), holding whole blocks (one per block), and a page
    # size that is no multiple of the block; lengths at a page boundary ± 1. With decode_plan.TABLE_ROW_MAX_PAGES
    # (off by default) the launches whose pages hold whole blocks read the table row up front (the split kernel's
    # TABLE_ROW) and pick each page from it
    B, S_max, Hkv, D = 3, 100, 2, 32
    k, v = contiguous_cache(B, S_max, Hkv, D, dtype, seed=page_size)
    kp, vp, table = paged(k, v, page_size, seed=page_size)
    q = randn(torch.Generator().manual_seed(5), B, 2, 4, D, dtype=dtype)
    seqlens = lens(page_size - 1, page_size + 1, S_max)
    with decode.table_rows(table_row):
        for causal, num_splits in ((True, 1), (True, 3), (False, 2)):
            plan = decode.make_plan(B, 2, 4, Hkv, D, table.shape[1] * page_size, dtype, num_splits, DEV, tiles, True,
                                    None, page_size)
            assert (plan.table_row > 0) == (table_row > 0 and page_size % tiles[0] == 0)
            out = check(q, kp, vp, seqlens, block_table=table, causal=causal, num_splits=num_splits, tiles=tiles)
            flat = decode.decode_attention(q, k, v, seqlens, causal=causal, num_splits=num_splits, tiles=tiles)
            assert rel_error(out, flat) < TOL[dtype]


def test_which_paged_launches_take_the_table_row(monkeypatch):
    # pages holding whole key blocks, a row of at most TABLE_ROW_MAX_PAGES pages (rounded up to a power of two); none
    # beyond it; with it, the contiguous pipeline depth instead of paged_stages'
    assert decode_plan.TABLE_ROW_MAX_PAGES == 16 and decode_plan.table_row(256, 4096, 64) == 16
    assert decode_plan.table_row(256, 64 * 256, 64) == 0  # 64 pages: where it slowed the H200 (decode_plan's comment)
    monkeypatch.setattr(decode_plan, "TABLE_ROW_MAX_PAGES", 64)
    assert decode_plan.table_row(256, 4096, 64) == 16
    assert decode_plan.table_row(256, 3 * 256, 128) == 4
    assert decode_plan.table_row(256, 64 * 256, 64) == 64
    for why, args in (("65 pages", (256, 65 * 256, 64)), ("pages shorter than a block", (16, 4096, 32)),
                      ("pages that are no multiple of the block", (48, 4800, 32)), ("not paged", (0, 4096, 64))):
        assert decode_plan.table_row(*args) == 0, why
    decode.make_plan.cache_clear()
    try:
        paged_plan = decode.make_plan(1, 1, 32, 8, 128, 4096, torch.float16, 0, DEV, (64, 4, 3), True, None, 256)
        assert (paged_plan.table_row, paged_plan.num_stages) == (16, 3)
        monkeypatch.setattr(decode_plan, "TABLE_ROW_MAX_PAGES", 8)
        decode.make_plan.cache_clear()
        paged_plan = decode.make_plan(1, 1, 32, 8, 128, 4096, torch.float16, 0, DEV, (64, 4, 3), True, None, 256)
        assert (paged_plan.table_row, paged_plan.num_stages) == (0, 5)
    finally:
        decode.make_plan.cache_clear()


@pytest.mark.parametrize("causal", [True, False])
def test_many_queries_span_several_row_blocks(causal):
    # Lq = 20 queries of 4 grouped heads: 80 rows, more than one program's MAX_BLOCK_M = 64; each row block cuts its
    # own key range (causal: the first block's queries see fewer keys)
    k, v = contiguous_cache(2, 90, 2, 16, torch.float32, seed=11)
    q = randn(torch.Generator().manual_seed(11), 2, 20, 8, 16)
    assert decode.make_plan(2, 20, 8, 2, 16, 90, torch.float32, 1, DEV).row_blocks == 2
    for num_splits in (1, 3):
        check(q, k, v, lens(20, 90), causal=causal, num_splits=num_splits)


def test_head_dims_strides_and_scale():
    gen = torch.Generator().manual_seed(7)
    for D in (40, 256):  # padded to 64 and the largest
        k, v = contiguous_cache(2, 40, 1, D, torch.float16, seed=D)
        q = randn(gen, 2, 2, 3, D, dtype=torch.float16)  # three query heads on one K/V head (MQA)
        check(q, k, v, lens(2, 40), num_splits=2)
    # q as a view of (B, Hq, Lq, D) storage, and caches that are views of a larger buffer
    big_k, big_v = contiguous_cache(2, 50, 4, 32, torch.float32, seed=8)
    k, v = big_k[:, :, 1:3], big_v[:, :, 1:3]
    q = randn(gen, 2, 4, 2, 32).transpose(1, 2)
    check(q, k, v, lens(9, 50), num_splits=3)
    out = decode.decode_attention(q, k, v, lens(9, 50), softmax_scale=0.3)
    assert rel_error(out, reference_with_kvcache(q, k, v, lens(9, 50), softmax_scale=0.3)) < TOL[torch.float32]


def test_public_function_and_partials_merge_by_lse():
    k, v = contiguous_cache(2, 64, 2, 16, torch.float32, seed=9)
    q = randn(torch.Generator().manual_seed(9), 2, 1, 4, 16)
    seqlens = lens(5, 64)
    out, o_part, lse_part = decode.decode_attention(q, k, v, seqlens, num_splits=4, return_partials=True)
    assert o_part.shape == (2, 1, 4, 4, 16) and lse_part.shape == (2, 1, 4, 4)
    # 32 keys per block here: the first sequence's 5 keys lie in its first split, the second's 64 in two; the other
    # splits are empty (lse = -inf)
    assert torch.isneginf(lse_part[0, ..., 1:]).all() and torch.isfinite(lse_part[0, ..., 0]).all()
    assert torch.isneginf(lse_part[1, ..., 2:]).all() and torch.isfinite(lse_part[1, ..., :2]).all()
    w = torch.exp(lse_part - lse_part.amax(-1, keepdim=True))
    merged = (w[..., None] * o_part.nan_to_num()).sum(-2) / w.sum(-1)[..., None]
    assert rel_error(merged, out) < 1e-6
    assert torch.equal(flashattn.attention_with_kvcache(q, k, v, seqlens, num_splits=4), out)


@pytest.mark.parametrize("merge", ["kernel", "last program"])
@pytest.mark.parametrize("page_size", [0, 16])
def test_both_merges_give_the_reference(merge, page_size):
    # the merge kernel (a second launch) and the last split program of each row block (decode_plan.MERGE): ragged
    # lengths with empty splits, GQA, Lq = 1 and 3, causal and not, one row block and several (Lq = 20: 80 rows,
    # merged in steps of MERGE_ROWS rows), and a call repeated: the last program puts its ticket back to 0
    decode._PREPARED.clear()
    B, Hkv, D, S_max = 3, 2, 32, 96
    k, v = contiguous_cache(B, S_max, Hkv, D, torch.float16, seed=31)
    table = None
    if page_size:
        k, v, table = paged(k, v, page_size, seed=31)
    gen = torch.Generator().manual_seed(31)
    for Lq, causal, num_splits in ((1, True, 3), (3, False, 2), (3, True, 7), (20, True, 2)):
        q = randn(gen, B, Lq, 4 * Hkv, D, dtype=torch.float16)
        for _ in range(2):
            check(q, k, v, lens(Lq, 33, S_max), block_table=table, causal=causal, num_splits=num_splits, merge=merge)
    plans = [p.plan for p in decode._PREPARED.values() if p.plan.num_splits > 1]
    assert plans and all((p.merge_rows > 0) == (merge == "last program") for p in plans)
    assert all(int(p.tickets.abs().sum()) == 0 for p in decode._PREPARED.values() if p.tickets is not None)
    if merge == "last program":  # prepared again (as after _PREPARED is emptied): the same tickets, which outlive it
        before = {key: p.tickets for key, p in decode._PREPARED.items()}
        decode._PREPARED.clear()
        check(q, k, v, lens(Lq, 33, S_max), block_table=table, causal=causal, num_splits=num_splits, merge=merge)
        (key, again), = decode._PREPARED.items()
        assert again.tickets is before[key] and decode._TICKETS[key] is again.tickets


@pytest.mark.skipif(runtime.MODE != "gpu", reason="CUDA graphs need a GPU")
def test_a_cuda_graph_replays_the_last_programs_merge():
    # captured once; new lengths and queries written into the inputs before each replay: every replay finds the
    # tickets at 0 (the last program put them back) and gives the eager call's output
    k, v = contiguous_cache(2, 4096, 2, 64, torch.float16, seed=41)
    q = randn(torch.Generator().manual_seed(41), 2, 1, 8, 64, dtype=torch.float16)
    seqlens = lens(4096, 100)
    captured = {}
    decode.decode_attention(q, k, v, seqlens, num_splits=8)
    replay = cuda_graph_replay(lambda: captured.__setitem__("out", decode.decode_attention(q, k, v, seqlens,
                                                                                           num_splits=8)))
    gen = torch.Generator().manual_seed(42)
    for _ in range(20):
        seqlens.copy_(torch.randint(1, 4097, (2,), generator=gen, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=gen))
        replay()
        assert torch.equal(captured["out"], decode.decode_attention(q, k, v, seqlens, num_splits=8))
    assert all(int(p.tickets.abs().sum()) == 0 for p in decode._PREPARED.values() if p.tickets is not None)


def test_the_last_programs_merge_tile_and_when_the_merge_kernel_takes_over():
    # the last program's (rows, splits, D) float32 tile stays within MERGE_TILE_FLOATS: fewer rows per step as the
    # splits and D grow, and the merge kernel when one row's splits alone are larger
    limit = decode.MERGE_TILE_FLOATS
    for rows, block_m, splits, D in ((4, 16, 16, 128), (1, 16, 4, 128), (80, 64, 7, 128), (64, 64, 128, 64)):
        step = decode.merge_step_rows(rows, block_m, splits, D)
        assert step >= 1 and step * (1 << (splits - 1).bit_length()) * D <= limit
        assert step <= 1 << (min(rows, block_m) - 1).bit_length()
    assert decode.merge_step_rows(4, 16, 4, 128) == 4  # every row of the block at once
    assert decode.merge_step_rows(1, 16, 128, 256) == 0  # 128 splits × 256: the merge kernel
    plan = decode.make_plan(1, 1, 4, 1, 256, 1 << 16, torch.float16, 128, DEV, (16, 4, 1))
    assert plan.merge_rows == 0
    assert decode.make_plan(1, 1, 4, 1, 64, 4096, torch.float16, 1, DEV, (16, 4, 1)).merge_rows == 0  # unsplit
    with pytest.raises(ValueError, match="merge must be"):
        decode.make_plan(1, 1, 4, 1, 64, 4096, torch.float16, 2, DEV, (16, 4, 1), False, "last")


def test_choose_num_splits():
    # few programs: split as far as one wave holds (PROGRAMS_PER_SM on every SM), keeping MIN_BLOCKS_PER_SPLIT
    # blocks in each
    want = 132 * decode.PROGRAMS_PER_SM
    assert decode.choose_num_splits(8, 10_000, 132) == want // 8
    assert decode.choose_num_splits(32, 10_000, 132) * 32 <= want  # never a program past the wave
    assert decode.choose_num_splits(want - 1, 10_000, 132) == 1  # one short of a wave: no split
    assert decode.choose_num_splits(8, 2 * decode.MIN_BLOCKS_PER_SPLIT, 132) == 2  # a short cache
    assert decode.choose_num_splits(want, 10_000, 132) == 1  # enough programs already
    assert decode.choose_num_splits(1, 10**6, 132) == decode.MAX_SPLITS
    assert decode.choose_num_splits(1, 1, 132) == 1


def test_tile_configs_fit_the_shared_memory():
    for D in (64, 128, 256):
        for dtype in (torch.float16, torch.float32):
            configs = decode.tile_configs(D, dtype, shared_memory=100 * 1024, mode="gpu")
            assert configs and all(decode.shared_bytes(t, D, 2 if dtype != torch.float32 else 4) <= 100 * 1024
                                   for t in configs)
    assert decode.tile_configs(128, torch.float16, mode="gpu")[0] == decode.TILES[128][0]
    # a paged cache gets the deeper pipeline that keeps as many tiles in flight (decode.paged_stages)
    flat, paged = (decode.make_plan(1, 1, 32, 8, 128, 4096, torch.float16, 0, DEV, (64, 4, 3), p) for p in (0, 1))
    assert (flat.num_stages, paged.num_stages) == (3, 5)


def test_one_split_tiles(monkeypatch):
    # launches of long 16-bit caches (unsplit) or long slices (split) take ONE_SPLIT_TILES where they fit; anything
    # else keeps the default
    monkeypatch.setattr(decode_plan.runtime, "MODE", "gpu")
    wide, default = decode.ONE_SPLIT_TILES[128], (64, 4, 3)
    long, short = decode.ONE_SPLIT_MIN_KEYS, decode.ONE_SPLIT_MIN_KEYS - 1
    assert decode.one_split_tiles(128, torch.float16, long, None, 16, default) == wide
    assert decode.one_split_tiles(128, torch.bfloat16, long, 228 * 1024, 16, default) == wide
    assert decode.one_split_tiles(128, torch.float16, short, None, 16, default) == default
    assert decode.one_split_tiles(128, torch.float32, long, None, 16, default) == default
    assert decode.one_split_tiles(64, torch.float16, long, None, 16, default) == default  # not measured
    small = decode.shared_bytes(wide, 128, 2) - 1  # a device where the wide tiles do not fit (a T4: 64 KiB)
    assert decode.one_split_tiles(128, torch.float16, long, small, 16, default) == default
    # paged: the deeper pipeline of paged_stages, for the wide tiles as for the default
    decode.make_plan.cache_clear()  # plans made here, as on a GPU, must not outlive the test
    try:
        plans = {S: decode.make_plan(1, 1, 32, 32, 128, S, torch.float16, 1, DEV, None, True) for S in (long, short)}
        assert (plans[long].block_n, plans[long].num_warps, plans[long].num_stages) == (128, 4, 5)
        assert (plans[short].block_n, plans[short].num_warps, plans[short].num_stages) == (64, 4, 5)  # the default
    finally:
        decode.make_plan.cache_clear()
    # split launches: by the keys of each split's slice, against SPLIT_WIDE_MIN_KEYS
    slice_long, slice_short = decode.SPLIT_WIDE_MIN_KEYS, decode.SPLIT_WIDE_MIN_KEYS - 16
    assert decode.one_split_tiles(128, torch.float16, 4 * slice_long, None, 16, default, 4) == wide
    assert decode.one_split_tiles(128, torch.float16, 4 * slice_short, None, 16, default, 4) == default
    assert decode.one_split_tiles(128, torch.float16, 4 * slice_long, small, 16, default, 4) == default
    decode.make_plan.cache_clear()
    try:
        for S, splits, expected in ((131072, 16, wide), (131072, 4, wide), (32768, 4, wide), (32768, 16, default),
                                    (16384, 4, default)):
            plan = decode.make_plan(1, 1, 32, 8, 128, S, torch.float16, splits, DEV)
            assert (plan.num_splits, (plan.block_n, plan.num_warps, plan.num_stages)) == (splits, expected), (S, splits)
        explicit = decode.make_plan(1, 1, 32, 8, 128, 131072, torch.float16, 4, DEV, (64, 4, 3))
        assert (explicit.block_n, explicit.num_stages) == (64, 3)  # tiles asked for are kept
    finally:
        decode.make_plan.cache_clear()
    monkeypatch.setattr(decode_plan.runtime, "MODE", "interpreter")  # the interpreter's tiles stay its own
    assert decode.one_split_tiles(128, torch.float16, long, None, 16, (32, 4, 1)) == (32, 4, 1)
    assert decode.one_split_tiles(128, torch.float16, 4 * slice_long, None, 16, (32, 4, 1), 4) == (32, 4, 1)


def test_short_cache_tiles_when_the_default_needs_a_second_wave(monkeypatch):
    # unsplit grids over short caches: SHORT_TILES where the default's programs need more than one wave and
    # SHORT_TILES' fit in one (by shared memory); the H200's numbers: 132 SMs, 227 KiB per block
    monkeypatch.setattr(decode_plan.runtime, "MODE", "gpu")
    short, default, sms, smem = decode.SHORT_TILES[128], (64, 4, 3), 132, 232448
    per_default = decode.programs_per_sm(default, 128, 2, 16, smem)
    per_short = decode.programs_per_sm(short, 128, 2, 16, smem)
    assert (per_default, per_short) == (3, 6)
    pick = functools.partial(decode.short_cache_tiles, 128, torch.float16, 1024)
    assert pick(512, sms, smem, 16, default) == short  # B = 16 with 32/32 heads, B = 64 with 32/8
    assert pick(sms * per_default, sms, smem, 16, default) == default  # one wave of the default
    assert pick(sms * per_short + 1, sms, smem, 16, default) == default  # more than one wave either way
    assert decode.short_cache_tiles(128, torch.float16, decode.ONE_SPLIT_MIN_KEYS, 512, sms, smem, 16,
                                    default) == default  # a long cache: the wide tiles' business
    assert decode.short_cache_tiles(128, torch.float32, 1024, 512, sms, smem, 16, default) == default
    assert decode.short_cache_tiles(64, torch.float16, 1024, 512, sms, smem, 16, default) == default  # not measured
    assert pick(512, sms, None, 16, default) == default  # no device facts
    # make_plan, with the H200's facts: only the unsplit 512-program grids of the decode_vs_sdpa grid change
    monkeypatch.setattr(decode_plan, "_device_facts", lambda device: (sms, smem))
    decode.make_plan.cache_clear()
    try:
        for B, Hkv, S, expected in ((64, 8, 1024, short), (16, 32, 1024, short), (16, 8, 1024, default),
                                    (4, 32, 1024, default), (64, 32, 1024, default)):
            plan = decode.make_plan(B, 1, 32, Hkv, 128, S, torch.float16, 0, DEV)
            assert (plan.num_splits, (plan.block_n, plan.num_warps, plan.num_stages)) == (1, expected), (B, Hkv)
        wide = decode.ONE_SPLIT_TILES[128]
        assert decode.make_plan(64, 1, 32, 8, 128, 4096, torch.float16, 0, DEV).block_n == wide[0]
        assert decode.make_plan(64, 1, 32, 8, 128, 1024, torch.float16, 1, DEV, (64, 4, 3)).block_n == 64  # asked for
    finally:
        decode.make_plan.cache_clear()
    monkeypatch.setattr(decode_plan.runtime, "MODE", "interpreter")
    assert pick(512, sms, smem, 16, (32, 4, 1)) == (32, 4, 1)


@given(B=st.integers(1, 3), Lq=st.integers(1, 3), group=st.sampled_from([1, 2, 3]), Hkv=st.integers(1, 2),
       page=st.sampled_from([0, 16, 32]), causal=st.booleans(), num_splits=st.integers(0, 5), seed=st.integers(0, 99),
       merge=st.sampled_from(["kernel", "last program"]))
def test_hypothesis(B, Lq, group, Hkv, page, causal, num_splits, seed, merge):
    gen = torch.Generator().manual_seed(seed)
    S_max = 1 + int(torch.randint(Lq, 90, (1,), generator=gen))
    k, v = contiguous_cache(B, S_max, Hkv, 16, torch.float16, seed)
    q = randn(gen, B, Lq, group * Hkv, 16, dtype=torch.float16)
    seqlens = torch.randint(Lq, S_max + 1, (B,), generator=gen, dtype=torch.int32).to(DEV)
    table = None
    if page:
        k, v, table = paged(k, v, page, seed)
    check(q, k, v, seqlens, block_table=table, causal=causal, num_splits=num_splits, merge=merge)


@pytest.mark.parametrize("merge", ["kernel", "last program"])
def test_merges_of_large_scores_subtract_the_max(merge):
    # a large softmax_scale: scores, and so the log-sum-exps, of 100 and more, past float32's e^88; each merge
    # weighs the splits by e^(lse − max lse), never e^lse (inf / inf = NaN)
    k, v = contiguous_cache(2, 96, 1, 16, torch.float16, seed=51)
    q = randn(torch.Generator().manual_seed(51), 2, 1, 2, 16, dtype=torch.float16)
    seqlens = lens(70, 96)
    out, _, lse_part = decode.decode_attention(q, k, v, seqlens, softmax_scale=15.0, num_splits=3, merge=merge,
                                               return_partials=True)
    assert lse_part.max() > 90  # e^lse overflows float32
    assert rel_error(out, reference_with_kvcache(q, k, v, seqlens, softmax_scale=15.0)) < TOL[q.dtype]


def test_k_and_v_caches_with_strides_of_their_own():
    # v need not share k's layout: here a (B, Hkv + 1, S_max, D) buffer's first Hkv heads seen as (B, S_max, Hkv, D),
    # with other batch, key and head strides than the contiguous k; each is read with its own strides
    B, S_max, Hkv, D = 2, 70, 2, 16
    k, _ = contiguous_cache(B, S_max, Hkv, D, torch.float32, seed=52)
    gen = torch.Generator().manual_seed(52)
    v = randn(gen, B, Hkv + 1, S_max, D)[:, :Hkv].transpose(1, 2)
    assert v.shape == k.shape and all(sv != sk for sv, sk in zip(v.stride()[:3], k.stride()[:3], strict=True))
    q = randn(gen, B, 2, 4, D)
    for num_splits in (1, 2):
        check(q, k, v, lens(40, S_max), num_splits=num_splits)


@pytest.mark.parametrize("page_size", [16, 64])
def test_block_table_as_a_view_of_a_wider_table(page_size):
    # a block table sliced from a wider one (B, max_pages + 5): its rows are further apart than its width; pages
    # shorter than a key block (a table entry per key) and holding whole blocks (one per block), table row or not
    B, S_max, Hkv, D = 3, 100, 2, 16
    k, v = contiguous_cache(B, S_max, Hkv, D, torch.float32, seed=53)
    kp, vp, table = paged(k, v, page_size, seed=53)
    wide = torch.full((B, table.shape[1] + 5), -7, dtype=torch.int32, device=DEV)
    wide[:, : table.shape[1]] = table
    view = wide[:, : table.shape[1]]
    q = randn(torch.Generator().manual_seed(53), B, 2, 4, D)
    for table_row in (0, 64):
        with decode.table_rows(table_row):
            for num_splits in (1, 3):
                check(q, kp, vp, lens(page_size + 1, 63, S_max), block_table=view, num_splits=num_splits)


@pytest.mark.parametrize("page_size", [0, 16])
def test_cache_entries_past_the_lengths_may_hold_nan(page_size):
    # a cache allocated with torch.empty holds anything past each sequence's length (NaN here): the keys and values
    # past it are not read, not even as a weight of 0 times a NaN value
    B, S_max, Hkv, D = 3, 80, 2, 16
    seqlens = lens(5, 40, 67)
    k, v = contiguous_cache(B, S_max, Hkv, D, torch.float16, seed=54)
    past = torch.arange(S_max, device=DEV)[None, :] >= seqlens[:, None]
    for t in (k, v):
        t[past] = float("nan")
    table = None
    if page_size:
        k, v, table = paged(k, v, page_size, seed=54)
    q = randn(torch.Generator().manual_seed(54), B, 3, 4, D, dtype=torch.float16)
    for causal, num_splits in ((True, 1), (False, 3)):
        check(q, k, v, seqlens, block_table=table, causal=causal, num_splits=num_splits)


@pytest.mark.parametrize("merge", ["kernel", "last program"])
def test_partials_are_read_only_where_written(merge, monkeypatch):
    # the partial outputs are allocated with torch.empty, and an empty split writes none: filled with NaN here, the
    # merges must leave them unread (weight e^-inf = 0 times NaN would be NaN)
    k, v = contiguous_cache(2, 128, 2, 16, torch.float32, seed=55)
    q = randn(torch.Generator().manual_seed(55), 2, 2, 4, 16)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: empty(*args, **kwargs).fill_(float("nan")))
    for causal in (True, False):
        check(q, k, v, lens(5, 128), causal=causal, num_splits=4, merge=merge)  # 3 and 0 of 4 splits empty


def test_the_last_programs_merge_in_several_steps():
    # D = 128 and 8 splits: the last program merges its row block 8 rows at a time (MERGE_TILE_FLOATS), here 20 rows
    # (5 queries of 4 grouped heads) in steps of 8, the last step half padding
    k, v = contiguous_cache(1, 256, 1, 128, torch.float16, seed=56)
    q = randn(torch.Generator().manual_seed(56), 1, 5, 4, 128, dtype=torch.float16)
    plan = decode.make_plan(1, 5, 4, 1, 128, 256, torch.float16, 8, DEV, None, False, "last program")
    assert 0 < plan.merge_rows < 20 <= plan.block_m
    check(q, k, v, lens(250), num_splits=8, merge="last program")


def test_lengths_and_pages_are_clamped_to_the_cache_when_unchecked(monkeypatch):
    # inside a CUDA graph capture the host checks nothing (check_kvcache_values): the kernel clamps each length to
    # the capacity and each page number to the cache. The caches here are views of larger NaN-filled buffers, so
    # a read past them shows as NaN
    monkeypatch.setattr(decode, "check_kvcache_values", lambda *args, **kwargs: None)
    B, S_max, Hkv, D = 2, 64, 2, 16
    gen = torch.Generator().manual_seed(57)
    k, v = (torch.full((B, S_max + 32, Hkv, D), float("nan"), device=DEV)[:, :S_max] for _ in range(2))
    k.copy_(randn(gen, B, S_max, Hkv, D))
    v.copy_(randn(gen, B, S_max, Hkv, D))
    q = randn(gen, B, 2, 4, D)
    out = decode.decode_attention(q, k, v, lens(S_max + 20, 30), num_splits=2)
    assert rel_error(out, reference_with_kvcache(q, k, v, lens(S_max, 30))) < TOL[q.dtype]
    for page_size in (16, 32):  # a table entry per key, one per key block
        kp, vp, table = paged(k, v, page_size, seed=57)
        num_pages = kp.shape[0]
        kp, vp = (torch.cat([torch.full_like(t[:2], float("nan")), t.nan_to_num(1.0), torch.full_like(t[:2],
                  float("nan"))])[2:-2] for t in (kp, vp))  # the spare pages (NaN in paged's) now read as ones
        bad = table.clone()
        bad[0, 0], bad[1, 1] = -1, num_pages + 1  # pages in use that name no page of the cache
        clamped = bad.clamp(0, num_pages - 1)
        for num_splits in (1, 2):
            out = decode.decode_attention(q, kp, vp, lens(50, 40), block_table=bad, num_splits=num_splits)
            ref = reference_with_kvcache(q, kp, vp, lens(50, 40), block_table=clamped)
            assert rel_error(out, ref) < TOL[q.dtype]


# --- bad input ----------------------------------------------------------------------------------------------

def _problem(dtype=torch.float16):
    k, v = contiguous_cache(2, 32, 2, 16, dtype, seed=0)
    return randn(torch.Generator().manual_seed(0), 2, 1, 4, 16, dtype=dtype), k, v


@pytest.mark.skipif(runtime.MODE != "interpreter", reason="bfloat16 runs on a GPU")
def test_bfloat16_is_refused_in_the_interpreter():
    q, k, v = _problem(torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 is refused in interpreter mode"):
        flashattn.attention_with_kvcache(q, k, v, 4)


@pytest.mark.parametrize("change, error, message", [
    (lambda q, k, v: (q[0], k, v, 4, {}), ValueError, "q must have 4 dimensions"),
    (lambda q, k, v: (q, k, v[:, :16], 4, {}), ValueError, "k_cache and v_cache must have one shape"),
    (lambda q, k, v: (q, k, v, 4 * torch.ones(2, dtype=torch.int64, device=DEV), {}), TypeError,
     "cache_seqlens must be int32"),
    (lambda q, k, v: (q, k, v, 4.0, {}), TypeError, "cache_seqlens must be"),
    (lambda q, k, v: (q, k, v, lens(4), {}), ValueError, r"cache_seqlens must have shape \(B,\)"),
    (lambda q, k, v: (q, k, v, 33, {}), ValueError, "cache_seqlens=33 .* from 1 to 32"),
    (lambda q, k, v: (q, k, v, lens(4, 33), {}), ValueError, r"cache_seqlens\[1\] = 33"),
    (lambda q, k, v: (q, k, v, lens(-1, 3), {}), ValueError, r"cache_seqlens\[0\] = -1"),
    (lambda q, k, v: (q.expand(2, 3, 4, 16), k, v, lens(2, 5), {}), ValueError, r"cache_seqlens\[0\] = 2: .* Lq=3"),
    (lambda q, k, v: (q.expand(2, 3, 4, 16), k, v, 2, {}), ValueError, "cache_seqlens=2 .* from 3 to 32"),
    (lambda q, k, v: (q[:, :, :3], k, v, 4, {}), ValueError, "multiple of the cache's key/value heads"),
    (lambda q, k, v: (q[..., :8], k, v, 4, {}), ValueError, "one head dimension D"),
    (lambda q, k, v: (q, k[:1], v[:1], 4, {}), ValueError, "without a block_table, k_cache is"),
    (lambda q, k, v: (q.float(), k, v, 4, {}), TypeError, "one dtype"),
    (lambda q, k, v: (q, k, v, 4, {"num_splits": -1}), ValueError, "num_splits must be an int"),
    (lambda q, k, v: (q, k, v, 4, {"num_splits": decode.MAX_SPLITS + 1}), ValueError, "num_splits"),
    (lambda q, k, v: (q, k, v, 4, {"causal": 1}), TypeError, "causal must be True or False"),
    (lambda q, k, v: (q, k, v, 4, {"softmax_scale": 0.0}), ValueError, "scale must be finite and non-zero"),
    (lambda q, k, v: (q, k, v, 4, {"block_table": torch.zeros(2, 2, dtype=torch.int64, device=DEV)}), TypeError,
     "block_table must be int32"),
    (lambda q, k, v: (q, k.view(4, 16, 2, 16), v.view(4, 16, 2, 16), 4,
                      {"block_table": torch.zeros(3, 2, dtype=torch.int32, device=DEV)}), ValueError,
     r"block_table must be \(B, max_pages\)"),
    (lambda q, k, v: (q, k.view(4, 16, 2, 16), v.view(4, 16, 2, 16), 4,
                      {"block_table": torch.zeros(2, dtype=torch.int32, device=DEV)}), ValueError,
     r"block_table must be \(B, max_pages\)"),
    (lambda q, k, v: (q, k.view(8, 8, 2, 16), v.view(8, 8, 2, 16), 4,
                      {"block_table": torch.zeros(2, 2, dtype=torch.int32, device=DEV)}), ValueError,
     "page_size a multiple of 16"),
    (lambda q, k, v: (q, k.view(4, 16, 2, 16), v.view(4, 16, 2, 16), 20,
                      {"block_table": torch.tensor([[0, 1], [2, 4]], dtype=torch.int32, device=DEV)}), ValueError,
     r"block_table\[1, 1\] = 4 names no page .* 4 pages"),
    (lambda q, k, v: (q, k.view(4, 16, 2, 16), v.view(4, 16, 2, 16), lens(5, 33),
                      {"block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEV)}), ValueError,
     r"cache_seqlens\[1\] = 33: .* from 1 to 32"),
])
def test_bad_input_is_named(change, error, message):
    flashattn.attention_with_kvcache(*_problem(), 4)  # a prepared problem of these shapes must not skip the checks
    q, k, v, seqlens, kwargs = change(*_problem())
    with pytest.raises(error, match=message):
        flashattn.attention_with_kvcache(q, k, v, seqlens, **kwargs)


def test_unused_table_entries_are_not_checked_and_changed_values_are():
    q, k, v = _problem()
    kp, vp = k.view(4, 16, 2, 16), v.view(4, 16, 2, 16)
    table = torch.tensor([[0, -1], [2, 3]], dtype=torch.int32, device=DEV)  # sequence 0 uses one page only
    seqlens = lens(16, 20)
    out = flashattn.attention_with_kvcache(q, kp, vp, seqlens, block_table=table)
    assert rel_error(out, reference_with_kvcache(q, kp, vp, seqlens, block_table=table)) < TOL[q.dtype]
    seqlens += 1  # in place: the lengths are checked again (sequence 0 now needs its second page)
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = -1"):
        flashattn.attention_with_kvcache(q, kp, vp, seqlens, block_table=table)


def test_an_int_length_is_checked_on_every_call_without_preparing_again():
    # a generation loop passes the cache's length as an int that grows by one every step: one prepared problem
    # serves every length (preparing again would take the host longer than a short step takes the GPU), and each
    # length is still checked and used
    decode._PREPARED.clear()
    k, v = contiguous_cache(2, 40, 2, 16, torch.float16, seed=23)
    q = randn(torch.Generator().manual_seed(23), 2, 1, 4, 16, dtype=torch.float16)
    for n in (1, 17, 40):
        out = flashattn.attention_with_kvcache(q, k, v, n)
        assert rel_error(out, reference_with_kvcache(q, k, v, n)) < TOL[q.dtype]
    assert len(decode._PREPARED) == 1
    for bad in (0, 41):
        with pytest.raises(ValueError, match=f"cache_seqlens={bad} .* from 1 to 40"):
            flashattn.attention_with_kvcache(q, k, v, bad)
    with pytest.raises(TypeError, match="cache_seqlens must be"):
        flashattn.attention_with_kvcache(q, k, v, True)  # a bool is an int to Python, not a length


def test_a_prepared_problem_is_reused_only_for_the_same_metadata():
    # the second call of a problem skips the checks of its shapes and its plan (decode._PREPARED): new data, other
    # strides and another alignment must still give the right output
    decode._PREPARED.clear()
    k, v = contiguous_cache(2, 64, 2, 16, torch.float16, seed=21)
    gen = torch.Generator().manual_seed(21)
    q = randn(gen, 2, 1, 4, 16, dtype=torch.float16)
    check(q, k, v, lens(5, 64), num_splits=3)
    assert len(decode._PREPARED) == 1
    k2, v2 = contiguous_cache(2, 64, 2, 16, torch.float16, seed=22)
    check(randn(gen, 2, 1, 4, 16, dtype=torch.float16), k2, v2, lens(64, 7), num_splits=3)  # new data: reused
    assert len(decode._PREPARED) == 1
    check(randn(gen, 2, 4, 1, 16, dtype=torch.float16).transpose(1, 2), k, v, lens(5, 64), num_splits=3)  # strides
    flat = torch.empty(q.numel() + 1, dtype=q.dtype, device=DEV)
    unaligned = flat[1:].view(q.shape)  # the same strides, 2-byte aligned
    unaligned.copy_(q)
    check(unaligned, k, v, lens(5, 64), num_splits=3)
    assert len(decode._PREPARED) == 3
