"""flashattn.bench's table and its check on the sequence lengths (the timing itself needs a GPU)."""

import pytest

from flashattn import bench


def test_bench_table_rows_and_token_check():
    row = {"dtype": "float16", "B": 4, "H": 16, "N": 4096, "D": 64, "causal": True,
           "tflops": {"sdpa": 400.0, "fast": 420.4, "v2": 200.0}, "vs_sdpa": {"fast": 1.051, "v2": 0.5}}
    header, line = bench.format_header(), bench.format_row(row)
    assert header.split()[:5] == ["dtype", "D", "N", "B", "causal"] and "×SDPA" in header
    assert line.split() == ["float16", "64", "4096", "4", "True", "400", "420", "1.05", "200", "0.50"]
    bench._check_tokens(16384, (1024, 16384))
    with pytest.raises(ValueError, match="3072"):
        bench._check_tokens(16384, (1024, 3072))


def test_bench_refuses_bad_rounds():
    for rounds in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="rounds"):
            bench.compare(rounds=rounds)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--rounds", "0"])
    assert exit_info.value.code == 2


def test_time_rounds_interleaves(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "time_ms", lambda fn: (calls.append(fn()), len(calls))[1])
    times = bench.time_rounds({"a": lambda: "a", "b": lambda: "b"}, rounds=3)
    assert calls == ["a", "b", "a", "b", "a", "b"]  # a, b, a, b, ...: not a, a, a, b, b, b
    assert times == {"a": [1, 3, 5], "b": [2, 4, 6]}
