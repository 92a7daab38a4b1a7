"""The occupancy calculator on hand-worked cases and against Nsight Compute's recorded limits."""

import pytest

from flashattn import recorded
from flashattn.models.occupancy import SMLimits, occupancy


def test_hand_worked_register_bound():
    # 255 registers -> 255·32 = 8160, rounded up to 8192 per warp; 65536 / 8192 = 8 warps; 4-warp blocks -> 2
    r = occupancy(registers_per_thread=255, shared_bytes=41216, num_warps=4)
    assert r["limits"]["registers"] == 2 and r["blocks_per_sm"] == 2
    assert r["warps_per_sm"] == 8 and r["occupancy"] == 8 / 64 and r["limited_by"] == ["registers"]


def test_hand_worked_shared_memory_bound():
    # 128 registers -> 4096 per warp -> 16 warps -> 4 blocks of 4 warps; shared 100000 -> 100096 + 1024 = 101120
    # per block; 233472 // 101120 = 2 blocks
    r = occupancy(registers_per_thread=128, shared_bytes=100000, num_warps=4)
    assert r["limits"]["registers"] == 4 and r["limits"]["shared_memory"] == 2
    assert r["blocks_per_sm"] == 2 and r["limited_by"] == ["shared_memory"]


def test_hand_worked_warp_and_block_bound():
    # 32 registers, no shared memory, 1 warp per block: warps allow 64, but only 32 blocks fit
    r = occupancy(registers_per_thread=32, shared_bytes=0, num_warps=1)
    assert r["limits"]["warps"] == 64 and r["blocks_per_sm"] == 32 and r["limited_by"] == ["blocks"]
    r = occupancy(registers_per_thread=32, shared_bytes=0, num_warps=8)
    assert r["blocks_per_sm"] == 8 and r["occupancy"] == 1.0 and "warps" in r["limited_by"]


def test_register_rounding_per_warp():
    # 143 registers -> 4576, rounded to 4608 per warp -> 14 warps -> one 8-warp block
    assert occupancy(registers_per_thread=143, shared_bytes=0, num_warps=8)["limits"]["registers"] == 1
    assert occupancy(registers_per_thread=144, shared_bytes=0, num_warps=4)["limits"]["registers"] == 3


def test_limits_from_recorded_device():
    props = recorded.get("device")["properties"]
    limits = SMLimits.from_properties(props)
    assert limits.registers == props["registers_per_sm"] and limits.max_warps == props["max_threads_per_sm"] // 32


@pytest.mark.parametrize("bad", [dict(registers_per_thread=0), dict(registers_per_thread=300),
                                 dict(num_warps=128), dict(shared_bytes=-1), dict(shared_bytes=300000),
                                 dict(num_warps=2.0)])
def test_bad_inputs(bad):
    args = dict(registers_per_thread=64, shared_bytes=1024, num_warps=4) | bad
    with pytest.raises(ValueError):
        occupancy(**args)


def test_matches_nsight_compute_on_recorded_kernels():
    # ncu reports, per launch, how many blocks each resource allows; the calculator must agree.
    entry = recorded.get("bank_conflicts")
    assert entry["rows"], "no recorded ncu rows"
    limits = SMLimits.from_properties(recorded.get("device")["properties"])
    for row in entry["rows"]:
        m = row["metrics"]
        warps = int(m["launch__block_size"]) // 32
        r = occupancy(registers_per_thread=int(m["launch__registers_per_thread"]),
                      shared_bytes=int(m["launch__shared_mem_per_block"]) - 1024, num_warps=warps, limits=limits)
        where = f"{row['path']} {row['variant']} D={row['D']}"
        assert r["limits"]["registers"] == m["launch__occupancy_limit_registers"], where
        assert r["limits"]["warps"] == m["launch__occupancy_limit_warps"], where
        # the driver may choose a smaller shared-memory carve-out than the largest, so ncu's shared-memory
        # limit can be lower than the calculator's; it is never higher
        assert r["limits"]["shared_memory"] >= m["launch__occupancy_limit_shared_mem"], where
