"""The measurement ``model_step_vs_sdpa``'s cell loop (flashattn.measure.measurements.model_step), run at a toy
size on the course device: the GPU timings replaced by fixed numbers, ``torch.compile`` on aot_eager in
interpreter mode (Inductor on a GPU)."""

import time

import pytest
import torch

from flashattn import bench, record, runtime
from flashattn.measure import recorded
from flashattn.measure.measurements import model_step


def test_cells_at_a_toy_size(monkeypatch):
    fake = {"flashattn eager": 2.0, "torch eager": 3.0, "flashattn compiled": 1.5, "torch compiled": 1.5}
    ran = []

    def time_rounds(fns, rounds, rep):
        assert rep == model_step.STEP_REP_MS
        for name, fn in fns.items():  # each step still runs, so a compiled one that breaks fails here
            ran.append(name)
            fn()
        return {name: [fake[name]] * rounds for name in fns}

    monkeypatch.setattr(bench, "time_rounds", time_rounds)
    def peak_memory(fn):
        fn()
        return 0

    monkeypatch.setattr(bench, "peak_memory", peak_memory)
    backend = "inductor" if runtime.MODE == "gpu" else "aot_eager"
    rows = model_step.run_cells([(64, 2)], [32], tokens=64, n_layers=1, vocab_size=32, dtypes=["float32"],
                                rounds=1, backend=backend)
    assert len(rows) == 1 and sorted(ran) == sorted(fake)
    row = rows[0]
    assert (row["d_model"], row["n_heads"], row["head_dim"], row["N"], row["B"], row["dtype"]) == \
           (64, 2, 32, 32, 2, "float32")
    assert row["vs_sdpa"] == {"eager": 1.5, "compiled": 1.0}
    assert row["vs_sdpa_rounds"] == {"eager": [1.5], "compiled": [1.0]}
    assert set(row["peak_bytes"]) == set(fake) and set(row["first_call_s"]) == set(fake)
    check = row["compiled_vs_eager"]
    assert check["loss"] < 1e-5 and check["grads"] < 1e-4, check  # float32: the same kernels in another order
    assert check["worst_grad"].endswith("weight") or check["worst_grad"].endswith("bias")  # a parameter's name
    assert model_step.summary(rows) == {"float32": {"loss": check["loss"], "grads": check["grads"]}}
    assert "SDPA/flashattn eager 1.50, compiled 1.00" in model_step.format_row(row)


def test_tokens_must_divide_by_every_n():
    with pytest.raises(ValueError, match="multiple of every N"):
        model_step.run_cells([(64, 2)], [24], tokens=64)


def test_registered_recorded_and_refused_without_a_gpu():
    registry = record.load_measurements()
    assert "model_step_vs_sdpa" in registry and "model_step_vs_sdpa" not in record.PENDING
    assert recorded.find("model_step_vs_sdpa", gpu="NVIDIA H200") is not None
    if runtime.MODE == "gpu":
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="measures a GPU"):
        registry["model_step_vs_sdpa"]["fn"]()


def test_step_sets_the_gradients_afresh():
    model = model_step.make_model(model_step.GPTConfig(16, 8, n_layers=1, n_heads=1, d_model=16),
                                  torch.nn.functional.scaled_dot_product_attention, 0, runtime.DEVICE)
    tokens = torch.randint(0, 16, (2, 9)).to(runtime.DEVICE)
    step = model_step.make_step(model, tokens, torch.float32, runtime.DEVICE)
    first = model_step.loss_and_grads(step, model)[1]
    second = model_step.loss_and_grads(step, model)[1]  # not accumulated into the first
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_budget_and_skip_leave_cells_for_a_later_run(monkeypatch):
    monkeypatch.setattr(model_step, "make_model", lambda *a: None)
    ran = []

    def cell(models, data, dtype, device, backend, rounds, row):
        ran.append(model_step.cell_key(row))
        time.sleep(0.05)  # past the budget below once one cell has run
        return {**row, "vs_sdpa": {"eager": 1.0, "compiled": 1.0}}

    monkeypatch.setattr(model_step, "_cell", cell)
    skipped = []
    rows = model_step.run_cells([(64, 2)], [16, 32], tokens=64, dtypes=["float32", "bfloat16"], budget_s=0.01,
                                skip={(64, 2, 16, "float32")}, skipped=skipped, device="cpu")
    assert ran == [(64, 2, 16, "bfloat16")] and [model_step.cell_key(r) for r in rows] == ran
    assert skipped == [[64, 2, 32, "float32"], [64, 2, 32, "bfloat16"]]


def test_rows_of_the_previous_recording_are_kept_and_marked():
    def row(N, dtype, ratio):
        return {"d_model": 1024, "n_heads": 16, "N": N, "dtype": dtype, "vs_sdpa": {"eager": ratio}}

    previous = {"recorded_at": "2026-12-01T10:00:00", "rows": [row(4096, "float16", 0.9), row(1024, "bfloat16", 0.8)]}
    new = [row(1024, "bfloat16", 1.1)]
    rows, skipped = model_step.merge_with_previous(new, [[1024, 16, 4096, "float16"], [1024, 16, 8192, "float16"]],
                                                   previous)
    assert [(r["N"], r["dtype"], r["vs_sdpa"]["eager"]) for r in rows] == [(1024, "bfloat16", 1.1),
                                                                           (4096, "float16", 0.9)]
    assert "measured_at" not in rows[0] and rows[1]["measured_at"] == "2026-12-01T10:00:00"
    assert skipped == [[1024, 16, 8192, "float16"]]  # measured by neither run
    assert model_step.merge_with_previous(new, [], None) == (new, [])
