"""How :mod:`flashattn.kernels.decode` launches one problem (notebook 15): the tiles, the number of splits and who
merges them, as a :class:`Plan` (:func:`make_plan`, cached per problem).

The rules are declarative constants, each beside the measurement it was set from (tools/gpu/decode/ on the H200): the
tiles per head dimension (``TILES``; ``ONE_SPLIT_TILES`` for long slices of the cache, ``SHORT_TILES`` for grids over
short caches that would need a second wave), the number of splits when ``num_splits=0`` (:func:`choose_num_splits`:
one wave of programs), the deeper pipeline of a paged cache (:func:`paged_stages`; or, for rows of the block table of
up to ``TABLE_ROW_MAX_PAGES`` pages, the row read up front, :func:`table_row`) and the merge (``MERGE``: the last
split program of each row block, or a second kernel when its tile is too large).
The shares of the copy bandwidth quoted below were timed after do_bench's own L2 flush, which writes zeros whose
write-back falls in the timed call (``bench.l2_flush``): a few µs more per call than ``decode_vs_sdpa`` now measures,
about the same for every candidate compared on one cache, so their order stands while the shares of short calls
read low.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton

from flashattn import runtime

from . import device as gpu
from .fast_options import padded_head_dim

MAX_SPLITS = 128  # the merge holds every split of a row in one tile

# The tiles, declarative: (BLOCK_N keys per step, num_warps, num_stages) per padded head dimension; the first that
# fits the device's shared memory (:func:`shared_bytes`) is the default. tools/gpu/decode/probe.py times them all.
# Compiled ahead of time (sm_80, sm_90) none spills; on sm_75 (no asynchronous copies: the tiles go through
# registers) D = 128 spills with 64 keys per step, not with 32.
TILES = {
    16: [(128, 4, 3), (64, 4, 3)],
    32: [(128, 4, 3), (64, 4, 3)],
    64: [(128, 4, 3), (64, 4, 4), (64, 4, 3), (128, 4, 2)],
    128: [(64, 4, 3), (128, 4, 3), (64, 4, 4), (128, 8, 2), (32, 4, 4), (32, 4, 2)],
    256: [(64, 4, 2), (32, 4, 3), (64, 8, 2), (32, 4, 2), (16, 4, 2)],
}
FLOAT32_TILES = [(32, 4, 2), (64, 4, 2), (16, 4, 2)]  # float32: CUDA-core dots (IEEE)
INTERPRETER_TILES = (32, 4, 1)  # the CPU interpreter: few, wide steps run faster
MAX_BLOCK_M = 64  # rows (query heads × queries) per program; more rows: more programs

# Without splits, a cache of ONE_SPLIT_MIN_KEYS keys or more is read in wider steps: tools/gpu/decode/waves.py on the
# H200 (2026-12-03, fp16, D = 128, full caches of 4k-128k keys, 512 programs: B = 16 with 32/32 heads, B = 64 with
# 32/8) read them with (128, 4, 3) at 98-105 % of the copy bandwidth against 85-91 % with TILES[128]'s default; at
# 1k keys the two were level. Only where it fits the device's shared memory (with a block table, with the deeper
# pipeline of paged_stages, as every launch).
# A split launch gets them when each split's slice is SPLIT_WIDE_MIN_KEYS keys or more: tools/gpu/decode/long_slices.py
# on the H200 (2026-12-03 11:26, fp16, D = 128, calls) read slices of 32k keys (4 splits of 128k: B = 4 with 32/8
# heads, B = 1 with 32/32) at 101 % of the copy bandwidth against 95-96 % with the default, slices of 8k keys from
# 0.4 % slower to 3 % faster (B = 1 with 32/8 heads at 128k and 16 splits: 90 % against 88 %), slices of 4k keys
# 0.5 % slower.
ONE_SPLIT_TILES = {128: (128, 4, 3)}
ONE_SPLIT_MIN_KEYS = 4096
SPLIT_WIDE_MIN_KEYS = 8192

# An unsplit launch over fewer than ONE_SPLIT_MIN_KEYS keys whose grid is more than one wave of the default tiles but
# fits one wave of SHORT_TILES (programs per SM by shared memory, :func:`programs_per_sm`) takes SHORT_TILES. Nsight
# Compute on the H200 (tools/gpu/decode/ncu_short.py, 2026-12-03) found the default's 512 programs over 1k keys
# (B = 16 with 32/32 heads, B = 64 with 32/8) in 1.29 waves (3 per SM) at 75 % of the DRAM bandwidth, SDPA's 512 in
# 1.94 waves at 84 %; tools/gpu/decode/residency.py (2026-12-03 11:48, fp16, D = 128, calls) read those cells with
# (32, 4, 3), 6 per SM by shared memory, at 82 % of the copy bandwidth against 75-76 % with the default (SDPA
# 81-82 %), and the grids of 128 programs (one wave either way) faster with the default.
SHORT_TILES = {128: (32, 4, 3)}

# The number of splits when num_splits=0 (:func:`choose_num_splits`): as many programs as fit PROGRAMS_PER_SM on
# every SM at once (one wave), each with at least MIN_BLOCKS_PER_SPLIT key blocks. From tools/gpu/decode/waves.py
# and decode_vs_sdpa's split_curve on the H200: one program per SM read the cache as fast as two or faster (B = 1,
# 32/8 heads: 16 splits against 32 or 33), a grid a little past one wave more slowly (9 splits against 8 at 32
# programs per split), and splitting a grid that already fills the SMs once (128 programs, caches of 1k-4k keys)
# was slower with either merge (tools/gpu/decode/merge.py, 2026-12-03: 2 splits against 1). At B = 1 with 32/8
# heads and 1k keys, merge.py timed 8 splits of 2 key blocks (the last program merging) faster than 4 of 4 or 16
# of 1: hence 2 blocks at least (it only decides for caches under 2k keys per 8 programs).
PROGRAMS_PER_SM = 1
MIN_BLOCKS_PER_SPLIT = 2
INTERPRETER_SM_COUNT = 4  # no GPU: a nominal SM count, so that the rule still splits small problems

# Who merges the splits by default: "last program" (the last split program of a row block to finish, found by a
# ticket counter; one launch) or "kernel" (decode_merge_kernel, a second launch).
MERGE = "last program"
MERGE_TILE_FLOATS = 8192  # the last program's merge tile (rows, splits, D) in float32: 64 per thread with 4 warps

# A paged launch whose pages hold whole key blocks, over a table row of at most TABLE_ROW_MAX_PAGES pages, loads the
# sequence's whole row of the table beside its length, and picks each block's page from registers (the split kernel's
# TABLE_ROW): a paged program then waits for one load before its first key block, as a contiguous one does, not for
# the length and then the page; and with no table load in its loop it takes the contiguous pipeline depth, not
# paged_stages'. Written 2026-12-04 (stop 53) for decode_vs_sdpa's paged cells of 1k-16k keys that trail the
# contiguous ones by more than 5 %. tools/gpu/decode/table_row.py ran on the H200 on 2026-12-05 (its checks against
# float64 and the per-block path all passed): in pages of 256 keys it narrowed the paged path's gap to the contiguous
# one at rows of 4 and 16 pages (1k and 4k keys) and widened it at 64 pages (16k keys; likely the cost of picking
# each block's page out of a 64-wide row). Hence the limit of 16 pages, with which decode_vs_sdpa was recorded on
# 2026-12-05 (its table_row_max_pages): against the recording before, without it, the paged cells of 1k keys and most
# of 4k came nearer the contiguous ones; the 4k-key cells with 32 K/V heads at B = 4 to 64 did not (B = 64 lost about
# 1 %, still within 5 %); the cells of longer rows, which do not take it, stayed where they were.
# For those longer rows, a split program that read only its own part of the row once its bounds were known (no table
# load in its loop) was tried and dropped: on the H200 (2026-12-05 05:40, fp16, D = 128, pages of 256, CUDA-graph
# replays; the probe is table_row.py --slice at commit 821dfbc) it checked correct and gained nothing at 16k and 32k
# keys (paged ÷ contiguous within 1.2 % of the per-block path's in the 6 cells that split, 3 of them 0.7-1.2 % slower).
TABLE_ROW_MAX_PAGES = 16


class Plan(NamedTuple):
    """How one problem is launched: the tiles, the rows per program and the grid."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    row_blocks: int
    num_splits: int
    merge_warps: int
    merge_rows: int  # with splits: rows per step of the last program's merge; 0: the merge kernel merges
    table_row: int = 0  # paged: the table entries loaded up front (TABLE_ROW_MAX_PAGES); 0: a load per key block


def merge_step_rows(rows: int, block_m: int, num_splits: int, D: int) -> int:
    """Rows per step of the last split program's merge (:func:`_merge_row_block`): as many as keep its (rows,
    splits, D) float32 tile within MERGE_TILE_FLOATS, 0 when one row's splits alone exceed it (the merge kernel
    then merges)."""
    per_row = triton.next_power_of_2(num_splits) * padded_head_dim(D)
    if per_row > MERGE_TILE_FLOATS:
        return 0
    return min(triton.next_power_of_2(min(rows, block_m)), MERGE_TILE_FLOATS // per_row)


def shared_bytes(tiles: tuple, D: int, dtype_bytes: int, block_m: int = 16) -> int:
    """An estimate of a tile configuration's shared memory: ``num_stages − 1`` K and V tiles in flight (Triton's
    pipeliner keeps that many asynchronous copies going; at least one), and Q. Compiled for sm_90 the kernel uses
    this or less."""
    block_n, _, num_stages = tiles
    return (max(1, num_stages - 1) * 2 * block_n + block_m) * padded_head_dim(D) * dtype_bytes


def tile_configs(D: int, dtype: torch.dtype, shared_memory: int | None = None, mode: str | None = None) -> list:
    """The tile configurations for head dimension D and ``dtype``, those that fit ``shared_memory`` bytes (None:
    all), default first."""
    if (mode or runtime.MODE) == "interpreter":
        return [INTERPRETER_TILES]
    configs = FLOAT32_TILES if dtype == torch.float32 else TILES[padded_head_dim(D)]
    if shared_memory is None:
        return list(configs)
    size = torch.finfo(dtype).bits // 8
    return [t for t in configs if shared_bytes(t, D, size) <= shared_memory] or [configs[-1]]


@functools.cache
def _device_facts(device: torch.device) -> tuple[int, int | None]:
    """(SM count, shared memory per block in bytes) of ``device``; nominal values in the interpreter."""
    if device.type != "cuda":
        return INTERPRETER_SM_COUNT, None
    return gpu.sm_count(), gpu.target().shared_bytes


def choose_num_splits(programs: int, key_blocks: int, sm_count: int) -> int:
    """num_splits=0: without splits the grid has ``programs`` programs (B·Hkv·row blocks); split the keys into as
    many slices as fit one wave, PROGRAMS_PER_SM programs on every SM (rounded down: a few programs past a wave wait
    for a whole second one), but keep at least MIN_BLOCKS_PER_SPLIT of the cache's ``key_blocks`` (its capacity: the
    lengths are on the GPU) in each split, and at most MAX_SPLITS splits."""
    wanted = sm_count * PROGRAMS_PER_SM // programs
    return max(1, min(wanted, key_blocks // MIN_BLOCKS_PER_SPLIT, MAX_SPLITS))


def paged_stages(num_stages: int) -> int:
    """The pipeline depth a paged cache gets for a configuration's ``num_stages``. The block table's load takes
    stages of its own: compiled for sm_90, a paged kernel keeps as many K/V tiles in flight with 2·s − 1 stages as a
    contiguous one with s (3 and 4 stages hold one tile of K and V in flight, 5 two, like 3 without pages)."""
    return 2 * num_stages - 1


def one_split_tiles(D: int, dtype: torch.dtype, capacity: int, shared_memory: int | None, block_m: int,
                    default: tuple, num_splits: int = 1) -> tuple:
    """The tiles of a launch without explicit tiles: ONE_SPLIT_TILES for 16-bit caches whose programs each read
    ONE_SPLIT_MIN_KEYS keys or more unsplit, SPLIT_WIDE_MIN_KEYS or more per split (``capacity`` // ``num_splits``),
    where they fit ``shared_memory``; else ``default``."""
    wide = ONE_SPLIT_TILES.get(padded_head_dim(D))
    keys, min_keys = capacity // num_splits, ONE_SPLIT_MIN_KEYS if num_splits == 1 else SPLIT_WIDE_MIN_KEYS
    if wide is None or dtype == torch.float32 or keys < min_keys or runtime.MODE != "gpu":
        return default
    fits = shared_memory is None or shared_bytes(wide, D, torch.finfo(dtype).bits // 8, block_m) <= shared_memory
    return wide if fits else default


def programs_per_sm(tiles: tuple, D: int, dtype_bytes: int, block_m: int, shared_memory: int) -> int:
    """How many programs of these tiles share an SM by shared memory (``shared_memory``: the device's per-block
    maximum, close to what an SM holds), by :func:`shared_bytes`' estimate; registers may allow fewer."""
    return max(1, shared_memory // shared_bytes(tiles, D, dtype_bytes, block_m))


def short_cache_tiles(D: int, dtype: torch.dtype, capacity: int, programs: int, sm_count: int,
                      shared_memory: int | None, block_m: int, default: tuple) -> tuple:
    """The tiles of an unsplit launch over a short cache (fewer than ONE_SPLIT_MIN_KEYS keys): SHORT_TILES where the
    ``programs`` are more than one wave of ``default`` and at most one of SHORT_TILES, else ``default``."""
    short = SHORT_TILES.get(padded_head_dim(D))
    if (short is None or dtype == torch.float32 or capacity >= ONE_SPLIT_MIN_KEYS or shared_memory is None
            or runtime.MODE != "gpu"):
        return default
    size = torch.finfo(dtype).bits // 8
    waves_default = programs > sm_count * programs_per_sm(default, D, size, block_m, shared_memory)
    one_wave_short = programs <= sm_count * programs_per_sm(short, D, size, block_m, shared_memory)
    return short if waves_default and one_wave_short else default


@functools.cache
def make_plan(B: int, Lq: int, Hq: int, Hkv: int, D: int, capacity: int, dtype: torch.dtype, num_splits: int,
              device: torch.device, tiles: tuple | None = None, paged: bool = False, merge: str | None = None,
              page_size: int = 0) -> Plan:
    """The launch of one problem (cached: the host's time per call matters when the cache is short). ``merge``:
    who merges the splits, "last program" (the last split program of each row block to finish), "kernel" (a
    second launch, :func:`decode_merge_kernel`) or None for MERGE's choice. ``page_size``: a paged cache's (for
    :func:`table_row`; 0: not known, a load per key block)."""
    sm_count, shared_memory = _device_facts(device)
    block_n, num_warps, num_stages = tiles or tile_configs(D, dtype, shared_memory)[0]
    rows = (Hq // Hkv) * Lq
    block_m = min(MAX_BLOCK_M, max(16, triton.next_power_of_2(rows)))
    row_blocks = triton.cdiv(rows, block_m)
    if num_splits == 0:
        num_splits = choose_num_splits(B * Hkv * row_blocks, triton.cdiv(capacity, block_n), sm_count)
    if tiles is None:
        block_n, num_warps, num_stages = one_split_tiles(D, dtype, capacity, shared_memory, block_m,
                                                         (block_n, num_warps, num_stages), num_splits)
    if tiles is None and num_splits == 1:
        block_n, num_warps, num_stages = short_cache_tiles(D, dtype, capacity, B * Hkv * row_blocks, sm_count,
                                                           shared_memory, block_m, (block_n, num_warps, num_stages))
    row = table_row(page_size, capacity, block_n) if paged else 0
    if paged and num_stages > 1 and not row:
        num_stages = paged_stages(num_stages)
    block_s = triton.next_power_of_2(num_splits)
    merge_warps = min(16, max(1, block_s * padded_head_dim(D) // 1024))
    if merge not in (None, "last program", "kernel"):
        raise ValueError(f"decode_attention: merge must be 'last program', 'kernel' or None, got {merge!r}")
    fused = num_splits > 1 and (merge or MERGE) == "last program"
    in_program = merge_step_rows(rows, block_m, num_splits, D) if fused else 0
    return Plan(block_m, block_n, num_warps, num_stages, row_blocks, num_splits, merge_warps, in_program, row)


def table_row(page_size: int, capacity: int, block_n: int) -> int:
    """The split kernel's TABLE_ROW for a paged cache of ``capacity`` keys per sequence in pages of ``page_size``:
    the power of two at or above its table row's pages where pages hold whole key blocks of ``block_n`` and the row
    has at most TABLE_ROW_MAX_PAGES of them; else 0 (a table load per key block)."""
    pages = capacity // page_size if page_size else 0
    if not pages or page_size % block_n or pages > TABLE_ROW_MAX_PAGES:
        return 0
    return triton.next_power_of_2(pages)
