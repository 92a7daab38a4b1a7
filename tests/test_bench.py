"""flashattn.bench: the table, its check on the sequence lengths, interleaved rounds, memory against N (the
timing itself needs a GPU: here the timers are faked and the kernels run in the interpreter)."""

import types

import pytest
import torch
from helpers import TOL

from flashattn import bench, reference, runtime
from flashattn.reference import rel_error


def test_bench_table_rows_and_token_check():
    row = {"dtype": "float16", "B": 4, "H": 16, "N": 4096, "D": 64, "causal": True,
           "tflops": {"sdpa": 400.0, "fast": 420.4, "v2": 200.0}, "vs_sdpa": {"fast": 1.051, "v2": 0.5}}
    assert bench.default_variants() == ["v2", "fast"]  # the variants registered with in_bench=True
    header, line = bench.format_header(), bench.format_row(row)
    assert header.split()[:5] == ["dtype", "D", "N", "B", "causal"] and "×SDPA" in header
    assert header.index("v2 TF/s") < header.index("fast TF/s")
    assert line.split() == ["float16", "64", "4096", "4", "True", "400", "200", "0.50", "420", "1.05"]
    assert bench.format_row(row, ["fast"]).split()[-2:] == ["420", "1.05"]
    bench._check_tokens(16384, (1024, 16384))
    with pytest.raises(ValueError, match="3072"):
        bench._check_tokens(16384, (1024, 3072))


def test_bench_refuses_bad_rounds_and_unknown_variants(monkeypatch):
    for rounds in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="rounds"):
            bench.compare(rounds=rounds)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--rounds", "0"])
    assert exit_info.value.code == 2
    monkeypatch.setattr(bench, "runtime", types.SimpleNamespace(MODE="gpu"))
    with pytest.raises(ValueError, match="unknown variant 'v9'; accepted: naive, v1"):
        bench.compare(["v9"])


def test_time_rounds_interleaves(monkeypatch):
    calls, reps = [], []
    monkeypatch.setattr(bench, "time_ms", lambda fn, rep: (calls.append(fn()), reps.append(rep), len(calls))[2])
    times = bench.time_rounds({"a": lambda: "a", "b": lambda: "b"}, rounds=3)
    assert calls == ["a", "b", "a", "b", "a", "b"]  # a, b, a, b, ...: not a, a, a, b, b, b
    assert times == {"a": [1, 3, 5], "b": [2, 4, 6]} and set(reps) == {100}  # do_bench's default
    bench.time_rounds({"a": lambda: "a"}, rounds=2, rep=600)
    assert reps[-2:] == [600, 600]


def test_call_runs_a_variant_or_sdpa():
    q, k, v = runtime.random_qkv(1, 2, 20, 16, seed_value=1)
    out = bench.call("v2", q, k, v, causal=True)()
    assert rel_error(out, reference(q, k, v, causal=True)) < TOL[torch.float32]
    sdpa = bench.call("sdpa", q, k, v, causal=True)
    assert sdpa.func is bench.sdpa and sdpa.keywords == {"causal": True} and sdpa().shape == q.shape
    with pytest.raises(ValueError, match="sdpa takes no options"):
        bench.call("sdpa", q, k, v, block_m=16)
    with pytest.raises(ValueError, match="unknown variant"):
        bench.call("v9", q, k, v)


def test_memory_vs_n_stops_a_variant_after_out_of_memory(monkeypatch):
    shapes = []

    def fake_peak(fn):
        out = fn()  # the real kernel runs (through the interpreter here)
        if fn.func is bench.sdpa and out.shape[2] >= 32:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate a lot\nsecond line")
        shapes.append(tuple(out.shape))
        return 123

    gpu_runtime = types.SimpleNamespace(MODE="gpu", random_qkv=runtime.random_qkv)  # bench's view only
    monkeypatch.setattr(bench, "runtime", gpu_runtime)
    monkeypatch.setattr(bench, "peak_memory", fake_peak)
    monkeypatch.setattr(bench, "time_ms", lambda fn, rep: 1.5)
    m = bench.memory_vs_n((16, 32, 48), ("sdpa", "naive", "v1"), B=1, H=2, D=16, dtype=torch.float32,
                          max_n={"v1": 16})
    assert (m["B"], m["H"], m["D"], m["dtype"], m["causal"]) == (1, 2, 16, "float32", False)
    rows = [(r["variant"], r["N"], r.get("oom", r.get("ms"))) for r in m["rows"]]
    assert rows == [("sdpa", 16, 1.5), ("naive", 16, 1.5), ("v1", 16, 1.5),
                    ("sdpa", 32, "CUDA out of memory. Tried to allocate a lot"), ("naive", 32, 1.5),
                    ("naive", 48, 1.5)]  # sdpa stops after its out-of-memory row, v1 at max_n
    assert all(r["input_bytes"] == 3 * r["output_bytes"] == 3 * 2 * r["N"] * 16 * 4 for r in m["rows"])
    assert m["rows"][0]["peak_bytes_above_inputs"] == 123
    assert shapes == [(1, 2, n, 16) for n in (16, 16, 16, 32, 48)]
    with pytest.raises(ValueError, match="unknown variant"):
        bench.memory_vs_n((16,), ("v9",), B=1, H=1, D=16)


def test_memory_vs_n_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(bench, "runtime", types.SimpleNamespace(MODE="interpreter"))
    with pytest.raises(RuntimeError, match="recorded"):
        bench.memory_vs_n((16,), B=1, H=1, D=16)
