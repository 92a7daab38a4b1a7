"""The compiled-facts and tuning measurements: registration and the shapes the notebooks read (their GPU code
paths run on the H200 only)."""

from flashattn import record, tuning
from flashattn.kernels import registry
from flashattn.measure.compiled import kernel_name
from flashattn.measure.measurements.compiled import ABLATIONS, _ncu_targets, compiled_variants
from flashattn.measure.measurements.tuning import AUTOTUNE_NAMES, CHECK, SWEEP_NAMES


def test_every_measurement_is_registered():
    registered = record.load_measurements()
    for name in ["compiled_facts", "compiled_facts_fast", "normalization_exp2", "occupancy_ncu",
                 *SWEEP_NAMES, *AUTOTUNE_NAMES]:
        assert name in registered, name
    assert list(SWEEP_NAMES) == ["block_sweep_fp16_d64", "block_sweep_fp16_d128", "block_sweep_fp32_d32",
                           "block_sweep_fp32_d64"]


def test_check_problem_shares_the_timed_specialization():
    # N and H multiples of 16 (as in the timed problems) but N not a multiple of any tile
    assert CHECK["N"] % 16 == 0 and CHECK["H"] % 16 == 0
    for space in tuning.SWEEP_SPACES.values():
        assert all(CHECK["N"] % b for b in (*space["block_m"], *space["block_n"]) if b > 16)


def test_ablations_cover_both_options():
    assert {(a["deferred_norm"], a["use_exp2"]) for a in ABLATIONS} == {(False, False), (True, False), (False, True),
                                                                         (True, True)}


def test_compiled_facts_cover_the_modelled_variants_and_name_their_kernels():
    assert compiled_variants() == ["naive", "v1", "v2", "v2_kt", "v2_kt_view", "v2_padded"]
    names = {v: [kernel_name(j) for j in registry.jit_kernels(v)] for v in compiled_variants()}
    assert names["naive"] == ["scores_kernel", "softmax_kernel", "pv_kernel"]
    assert names["v1"] == ["attn_kernel_v1"] and names["v2_padded"] == ["attn_kernel_v2"]


def test_sweep_budget():
    # a cap on the sweep's size: every configuration compiles and is timed, so the count sets the run time
    for path, space in tuning.SWEEP_SPACES.items():
        assert len(tuning.sweep_configs(space)) <= 40, path


def test_ncu_targets_launch_one_kernel_each():
    targets = _ncu_targets()
    assert {t["variant"] for t in targets} == {"v1", "v2"} and len(targets) == 5
    assert all(registry.get(t["variant"]).launches == 1 for t in targets)
