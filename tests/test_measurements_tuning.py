"""measurements_tuning: registration and the shapes the notebooks read (GPU code paths run on the H200 only)."""

from flashattn import record, tuning
from flashattn.measure.measurements.tuning import (
    ABLATIONS,
    AUTOTUNE_NAMES,
    CHECK,
    SWEEP_NAMES,
    _ncu_targets,
    _variant_jits,
)


def test_every_measurement_is_registered():
    registry = record.load_measurements()
    for name in ["compiled_facts", "compiled_facts_fast", "normalization_exp2", "occupancy_ncu",
                 *SWEEP_NAMES, *AUTOTUNE_NAMES]:
        assert name in registry, name
    assert SWEEP_NAMES == ["block_sweep_fp16_d64", "block_sweep_fp16_d128", "block_sweep_fp32_d32",
                           "block_sweep_fp32_d64"]


def test_check_problem_shares_the_timed_specialization():
    # N and H multiples of 16 (as in the timed problems) but N not a multiple of any tile
    assert CHECK["N"] % 16 == 0 and CHECK["H"] % 16 == 0
    for space in tuning.SWEEP_SPACES.values():
        assert all(CHECK["N"] % b for b in (*space["block_m"], *space["block_n"]) if b > 16)


def test_ablations_cover_both_options():
    assert {(a["deferred_norm"], a["use_exp2"]) for a in ABLATIONS} == {(False, False), (True, False), (False, True),
                                                                         (True, True)}


def test_variant_kernels_are_named():
    names = {v: [tuning.kernel_name(j) for j in _variant_jits(v)] for v in ("naive", "v1", "v2", "v2_padded")}
    assert names["naive"] == ["scores_kernel", "softmax_kernel", "pv_kernel"]
    assert names["v1"] == ["attn_kernel_v1"] and names["v2_padded"] == ["attn_kernel_v2"]


def test_sweep_budget():
    # a cap on the sweep's size: every configuration compiles and is timed, so the count sets the run time
    for path, space in tuning.SWEEP_SPACES.items():
        assert len(tuning.sweep_configs(space)) <= 40, path


def test_ncu_targets_launch_one_kernel_each():
    targets = _ncu_targets()
    assert {t["variant"] for t in targets} == {"v1", "v2"} and len(targets) == 5
