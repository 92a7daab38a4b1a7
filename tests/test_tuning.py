"""Pure helpers of flashattn.tuning: spaces, shared-memory estimate, pruning, the FA1 rule, heatmap grid."""

import math

import pytest

from flashattn import autotune, plots, recorded, tuning
from flashattn.exercises.occupancy import check_blocks_per_sm
from flashattn.exercises.tuning import check_fa1_block_sizes
from flashattn.models.occupancy import occupancy


def test_sweep_configs_is_the_product():
    space = {"block_m": (64, 128), "block_n": (32, 64, 128), "num_warps": (4,), "num_stages": (2, 3)}
    cfgs = tuning.sweep_configs(space)
    assert len(cfgs) == 12 and len({tuple(c.values()) for c in cfgs}) == 12
    assert {"block_m": 128, "block_n": 32, "num_warps": 4, "num_stages": 3} in cfgs
    with pytest.raises(ValueError):
        tuning.sweep_configs({"block_m": (64,)})


def test_shared_estimate_matches_compiled_tensor_core_kernels():
    rows = [r for r in recorded.get("compiled_layouts")["rows"] if r["path"] == "fp16_tc"]
    assert rows
    for r in rows:
        d_pad = max(16, 2 * r["D"]) if r["variant"] == "v2_padded" else r["D"]
        est = tuning.estimate_shared_bytes(block_m=r["block_m"], block_n=r["block_n"], d_pad=d_pad, elem_bytes=2,
                                           num_stages=r["num_stages"])
        assert est == r["shared_bytes"], r


def test_shared_estimate_by_hand():
    # fp16, 128x64 tiles, D=64, 3 stages: 3*(64*64*2)*2 + 128*64*2 = 49152 + 16384
    assert tuning.estimate_shared_bytes(block_m=128, block_n=64, d_pad=64, elem_bytes=2, num_stages=3) == 65536


def test_prune_keeps_what_fits_and_never_nothing():
    cfgs = tuning.sweep_configs(tuning.AUTOTUNE_SPACE)
    kept = tuning.prune_configs(cfgs, d_pad=128, elem_bytes=2, shared_limit=232448)
    assert 0 < len(kept) < len(cfgs)
    assert all(tuning.estimate_shared_bytes(block_m=c["block_m"], block_n=c["block_n"], num_stages=c["num_stages"],
                                            d_pad=128, elem_bytes=2) <= 232448 for c in kept)
    assert {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 4} not in kept  # 288 KiB
    assert len(tuning.prune_configs(cfgs, d_pad=128, elem_bytes=2, shared_limit=10)) == 1
    auto = tuning.prune_autotune_space(cfgs, d_pad=64, elem_bytes=2, shared_limit=232448)
    fit64 = tuning.prune_configs(cfgs, d_pad=64, elem_bytes=2, shared_limit=232448)
    assert 0 < len(auto) < len(fit64) and all(c in fit64 for c in auto)
    assert all(tuning.register_estimate(block_m=c["block_m"], block_n=c["block_n"], d_pad=64, num_warps=c["num_warps"])
               <= tuning.MAX_VALUES_PER_THREAD for c in auto)
    assert {"block_m": 128, "block_n": 128, "num_warps": 4, "num_stages": 2} not in auto  # 192 values per thread


def test_prune_accepts_triton_configs():
    cfgs = autotune.triton_configs([{"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 4},
                                  {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2}])
    kept = tuning.prune_configs(cfgs, d_pad=128, elem_bytes=2, shared_limit=232448)
    assert [tuning.config_dict(c)["block_m"] for c in kept] == [64]


@pytest.mark.parametrize("sram,D,eb", [(48 * 1024, 64, 4), (232448, 128, 2), (100_000, 48, 2), (3000, 16, 4)])
def test_fa1_rule_by_hand(sram, D, eb):
    r = tuning.fa1_block_sizes(sram, D, eb)
    M = sram // eb
    assert r["bc"] == -(-M // (4 * D)) and r["br"] == min(r["bc"], D)
    for key in ("block_m", "block_n"):
        assert r[key] & (r[key] - 1) == 0 and 16 <= r[key] <= 256
    assert r["block_n"] <= max(16, r["bc"]) and r["block_m"] <= max(16, r["br"])


def test_fa1_rule_rtx2070():
    # 48 KiB, float32, D=64: M = 12288, Bc = 48, Br = 48 -> tiles 32x32
    r = tuning.fa1_block_sizes(48 * 1024, 64, 4)
    assert (r["bc"], r["br"], r["block_m"], r["block_n"]) == (48, 48, 32, 32)
    with pytest.raises(ValueError):
        tuning.fa1_block_sizes(0, 64, 4)


def test_fa1_check_catches_mistakes():
    def right(s, D, eb):
        bc = math.ceil(s // eb / (4 * D))
        return bc, min(bc, D)

    def bytes_not_elements(s, D, eb):
        bc = math.ceil(s / (4 * D))
        return bc, min(bc, D)

    def floor(s, D, eb):
        bc = (s // eb) // (4 * D)
        return bc, min(bc, D)

    assert check_fa1_block_sizes(right) is True
    for wrong, words in ((bytes_not_elements, "elements"), (floor, "up")):
        with pytest.raises(AssertionError, match=words):
            check_fa1_block_sizes(wrong)

    def stub(s, D, eb):
        raise NotImplementedError

    assert check_fa1_block_sizes(stub) is False


def test_blocks_per_sm_check():
    def right(r, s, w):
        return occupancy(registers_per_thread=r, shared_bytes=s, num_warps=w)["blocks_per_sm"]

    def no_warp_limit(r, s, w):
        res = occupancy(registers_per_thread=r, shared_bytes=s, num_warps=w)["limits"]
        return min(res["registers"], res["shared_memory"], 32)

    assert check_blocks_per_sm(right) is True
    with pytest.raises(AssertionError, match="64 warps"):
        check_blocks_per_sm(no_warp_limit)


def _rows():
    rows = []
    for cfg in tuning.sweep_configs({"block_m": (64, 128), "block_n": (32, 64), "num_warps": (4, 8),
                                     "num_stages": (2,)}):
        r = dict(cfg)
        if cfg["block_m"] == 128 and cfg["block_n"] == 64 and cfg["num_warps"] == 8:
            r["error"] = tuning.short_error("OutOfResources: out of resource: shared memory, Required: 300000")
        elif cfg["block_m"] == 64 and cfg["block_n"] == 32 and cfg["num_warps"] == 8:
            r["error"] = "CompilationError: boom"
        else:
            r["tflops"] = cfg["block_m"] + cfg["block_n"] + cfg["num_warps"] / 10
        rows.append(r)
    return rows


def test_heatmap_table_and_best():
    rows = _rows()
    t = tuning.heatmap_table(rows)
    assert t["row_labels"] == ["64×32", "64×64", "128×32", "128×64"] and t["col_labels"] == ["4w/2s", "8w/2s"]
    assert t["status"][3][1] == "smem" and t["status"][0][1] == "error" and t["values"][3][1] is None
    assert t["values"][3][0] == 128 + 64 + 0.4
    best = tuning.best_row(rows)
    assert (best["block_m"], best["block_n"], best["num_warps"]) == (128, 64, 4)
    assert tuning.best_row([r for r in rows if "error" in r]) is None


def test_heatmap_draws(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    plots.plot_sweep_heatmap(ax, _rows(), "test")
    texts = [t.get_text() for t in ax.texts]
    assert "smem" in texts and "×" in texts and any("★" in t for t in texts)
    plt.close(fig)


def test_short_error():
    assert tuning.short_error(RuntimeError("x\n  y")) == "RuntimeError: x y"
    assert tuning.short_error("OutOfResources: shared memory").startswith("out of shared memory")
