"""Notebook 13's pieces (the task, the GPT, training side by side) and the backward measurements' code paths,
run here at toy sizes (the measurements themselves time a GPU)."""

import pytest
import torch

import flashattn
from flashattn import bench, runtime
from flashattn.measure.measurements import backward as measure_backward
from flashattn.measure.measurements import training
from flashattn.models.gpt import GPT, GPTConfig
from flashattn.models.tasks import AssociativeRecall
from flashattn.reference import rel_error


def test_recall_task_asks_for_the_values_of_its_keys():
    task = AssociativeRecall(n_pairs=5, n_keys=9, n_values=7)
    inputs, targets, answer = task.sample(64, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == answer.shape == (64, task.seq_len) == (64, 19)
    assert int(answer.sum(1).unique()) == 5 and answer[:, : 2 * 5].sum() == 0
    for b in range(64):
        seq = torch.cat([inputs[b], targets[b, -1:]])
        keys, values = seq[0:10:2], seq[1:10:2]
        assert len(set(keys.tolist())) == 5 and keys.max() < 9 and values.min() >= 9 and values.max() < 16
        lookup = dict(zip(keys.tolist(), values.tolist(), strict=True))
        queries = inputs[b][answer[b]]
        assert sorted(queries.tolist()) == sorted(keys.tolist())  # every key asked once
        assert [lookup[k] for k in queries.tolist()] == targets[b][answer[b]].tolist()
    with pytest.raises(ValueError, match="n_pairs"):
        AssociativeRecall(n_pairs=10, n_keys=9)


@pytest.mark.parametrize("kv_heads", [None, 1])
def test_gpt_runs_on_both_attentions_alike(kv_heads):
    config = GPTConfig(vocab_size=16, seq_len=15, n_layers=2, n_heads=2, n_kv_heads=kv_heads, d_model=32)
    tokens = torch.randint(0, 16, (3, 15), generator=torch.Generator().manual_seed(1)).to(runtime.DEVICE)
    outs = [training.make_model(config, fn, seed=3, device=runtime.DEVICE)(tokens)
            for fn in training.ATTENTIONS.values()]
    assert outs[0].shape == (3, 15, 16)
    assert rel_error(outs[0].detach(), outs[1].detach()) < 1e-5


def test_train_side_by_side_gives_the_same_curves_in_float32():
    task = AssociativeRecall(n_pairs=2, n_keys=4, n_values=4)
    config = GPTConfig(task.vocab_size, task.seq_len, n_layers=1, n_heads=1, d_model=16)
    run = training.train_side_by_side(config, task, steps=3, batch=2, lr=1e-2, eval_batch=8)
    assert set(run["loss"]) == {"flashattn", "torch"} and len(run["loss"]["torch"]) == 3
    for a, b in zip(run["loss"]["flashattn"], run["loss"]["torch"], strict=True):
        assert abs(a - b) < 1e-5
    assert run["accuracy"]["flashattn"] == run["accuracy"]["torch"]
    assert GPT(config, None).config == config


def test_saved_for_backward_bytes_has_no_n_squared_term_for_flashattn():
    sizes = {}
    for N in (32, 64):
        q, k, v = (torch.randn(1, 1, N, 16, requires_grad=True, device=runtime.DEVICE) for _ in range(3))
        sizes[N] = (measure_backward.saved_for_backward_bytes(measure_backward.pytorch_attention, q, k, v),
                    measure_backward.saved_for_backward_bytes(lambda *t: flashattn.attention(*t, variant="fast"),
                                                              q, k, v))
        assert sizes[N][0] == 3 * N * 16 * 4 + N * N * 4  # q, k, v and P
        assert sizes[N][1] == 4 * N * 16 * 4 + N * 4      # q, k, v, O and lse
    q, k, v = (torch.randn(1, 2, 20, 16, device=runtime.DEVICE) for _ in range(3))
    assert rel_error(measure_backward.pytorch_attention(q, k, v, causal=True),
                     flashattn.reference(q, k, v, causal=True)) < 1e-5


def test_time_problem_row(monkeypatch):
    """The backward comparison's bookkeeping, with the GPU timings replaced by fixed numbers."""
    fake = {("", "sdpa"): 2.0, ("", "fast"): 1.0, ("", "fast_triton"): 1.25, ("", "teaching"): 4.0,
            ("training_", "sdpa"): 3.0, ("training_", "fast"): 3.0}
    monkeypatch.setattr(bench, "time_rounds", lambda fns, rounds: {name: [fake[name]] * rounds for name in fns})
    q, k, v, do = (torch.randn(2, 2, 40, 16, device=runtime.DEVICE) for _ in range(4))
    row = measure_backward._time_problem(q, k, v, do, causal=True, rounds=2)
    assert row["vs_sdpa"] == {"fast": 2.0, "fast_triton": 1.6, "teaching": 0.5}
    assert row["training_vs_sdpa"] == {"fast": 1.0}
    flops = 2.5 * flashattn.roofline.attention_flops(2, 2, 40, 16, True)
    assert row["tflops"]["fast"] == pytest.approx(flops / 1e-3 / 1e12)
    assert all(max(errs) < 1e-5 for errs in row["rel_error"].values())  # float32 against float64
    row.update(dtype="float32", B=2, H=2, N=40, D=16, causal=True)
    assert measure_backward.format_row(row).split()[:5] == ["float32", "16", "40", "2", "True"]
    if runtime.MODE != "gpu":
        with pytest.raises(RuntimeError, match="needs a GPU"):
            measure_backward.compare_backward()
