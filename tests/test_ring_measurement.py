"""The ring's scaling model (flashattn.models.ring) and the host logic of the ``ring_steps`` measurement, run here
in the interpreter at tiny sizes (the GPU run is the lead's: python -m flashattn.record --only ring_steps)."""

import json

import pytest

from flashattn.measure.measurements import ring as ring_measurement
from flashattn.models import ring as model

KINDS = {"full": 4.0, "diagonal": 2.0, "first key chunk": 2.0, "second query chunk": 2.0, "skipped": 0.0}


def test_model_without_communication_is_the_sum_of_the_slowest_steps():
    for layout, causal, expected in (("contiguous", True, 2.0 + 4.0 * 3), ("zigzag", True, 2.0 * 4),
                                     ("zigzag", False, 4.0 * 4)):
        compute = model.step_compute(4, layout, causal, KINDS, n_local=8)
        assert sum(compute) == expected
        assert model.forward_ms(compute, 0.0) == expected
        assert model.backward_ms(compute, 0.0, 0.0) == expected


def test_model_hides_transfers_shorter_than_the_steps_and_pays_longer_ones():
    compute = [2.0, 2.0, 2.0, 2.0]
    assert model.forward_ms(compute, 1.0) == 8.0  # hidden behind every step
    assert model.forward_ms(compute, 3.0) == 3 * 3.0 + 2.0  # the link sets the pace; the last step sends nothing
    # backward: kv then kv + dkv behind the middle steps, dkv behind the last, and the last dkv hop after it
    assert model.backward_ms(compute, 0.5, 1.0) == 2.0 + 2.0 + 2.0 + 2.0 + 1.0
    assert model.backward_ms(compute, 1.5, 1.0) == 2.0 + 2.5 + 2.5 + 2.0 + 1.0
    assert model.backward_ms([5.0], 9.0, 9.0) == 5.0  # one device: no transfers


def test_model_merges_count_from_the_second_step():
    merge = {"all rows": 0.5, "half rows": 0.25}
    compute = model.step_compute(2, "zigzag", True, KINDS, merge, n_local=8)
    # rank 0 at step 1 holds rank 1's shard (source > rank): second query chunk, half the rows merged
    assert compute == [2.0, 2.0 + 0.5]  # rank 1 at step 1: first key chunk, every row merged (the slowest)


def test_model_transfers_and_efficiency():
    t = model.transfer_s(model.shard_bytes(1, 32, 8192, 128, 2), 450e9, 0.0)
    assert t == pytest.approx(2 * 32 * 8192 * 128 * 2 / 450e9)
    assert model.efficiency(8.0, 4, 2.0) == 1.0
    assert set(model.LINKS) and all(src for _, src in model.LINKS.values())


@pytest.fixture(scope="module")
def tiny():
    return ring_measurement.measure(problem=dict(B=1, H=2, Hkv=2, D=16, dtype="float32"), n_locals=(8,),
                                    world_sizes=(2, 4), one_gpu_max_n=16,
                                    check=dict(world_size=2, n_local=4, cases=(("contiguous", True, 2),
                                                                               ("zigzag", True, 1))),
                                    budget_s=300, progress=lambda line: None)


def test_measurement_host_logic(tiny):
    json.dumps(tiny)  # what record writes
    assert all(row["ok"] for row in tiny["check"]), tiny["check"]
    assert {row["kind"] for row in tiny["steps"]} == set(ring_measurement.KINDS)
    sources = {row["N"]: row["source"] for row in tiny["one_gpu"]}
    assert sources[16] == "measured" and sources[32].startswith("extrapolated as N² from N=16")
    combos = {(r["world_size"], r["layout"], r["causal"]) for r in tiny["compute"]}
    assert len(combos) == 2 * 2 * 2
    assert len(tiny["model"]) == len(tiny["compute"]) * len(model.LINKS)
    for row in tiny["compute"]:
        assert row["efficiency_forward"] == pytest.approx(row["one_gpu_forward_ms"] / (row["world_size"]
                                                                                       * row["forward_ms"]))
    by_key = {(r["world_size"], r["layout"], r["causal"]): r for r in tiny["compute"]}
    for row in tiny["model"]:  # transfers only add time
        assert row["forward_ms"] >= by_key[(row["world_size"], row["layout"], row["causal"])]["forward_ms"] - 1e-9


def test_measurement_skips_what_the_budget_leaves_out():
    out = ring_measurement.measure(problem=dict(B=1, H=1, Hkv=1, D=16, dtype="float32"), n_locals=(4,),
                                   world_sizes=(2,), one_gpu_max_n=8,
                                   check=dict(world_size=2, n_local=2, cases=(("zigzag", True, 1),)),
                                   budget_s=0.0, progress=lambda line: None)
    assert out["skipped"] and out["steps"] == [] and out["compute"] == []
