"""Notebook 15's generation with a KV cache (notebook 13's GPT) and the decoding measurements' code paths, at toy
sizes (the measurements themselves time a GPU)."""

import pytest
import torch
from helpers import rel_error

import flashattn
from flashattn import bench, record, runtime
from flashattn.kernels import decode
from flashattn.measure.measurements import decode as measure
from flashattn.measure.measurements import training
from flashattn.models.gpt import GPTConfig, sdpa_with_kvcache

SDPA = torch.nn.functional.scaled_dot_product_attention


def small_model(seed=0):
    config = GPTConfig(vocab_size=16, seq_len=20, n_layers=2, n_heads=4, n_kv_heads=2, d_model=32)
    model = training.make_model(config, SDPA, seed=seed, device=runtime.DEVICE)
    with torch.no_grad():
        model.pos_emb.weight.mul_(0.1)  # random positions would outweigh the tokens: let the prompt matter
    return model


def test_generation_with_a_kv_cache_gives_the_tokens_of_generation_without():
    model = small_model()
    prompt = torch.randint(0, 16, (3, 6), generator=torch.Generator().manual_seed(1)).to(runtime.DEVICE)
    full = model.generate(prompt, 8)  # every step runs the whole sequence (torch's SDPA)
    assert full.shape == (3, 8) and len({tuple(r) for r in full.tolist()}) > 1  # the prompts lead apart
    cached = model.generate(prompt, 8, model.new_cache(3))  # prompt once (Lq = 6), then Lq = 1 steps
    assert torch.equal(cached, full)
    assert torch.equal(model.generate(prompt, 8, model.new_cache(3, attention=sdpa_with_kvcache)), full)


def test_sdpa_with_kvcache_is_attention_with_kvcache():
    gen = torch.Generator().manual_seed(2)
    k, v = (torch.randn(2, 30, 2, 16, generator=gen).to(runtime.DEVICE) for _ in range(2))
    for L in (1, 4):
        q = torch.randn(2, L, 4, 16, generator=gen).to(runtime.DEVICE)
        ours = flashattn.attention_with_kvcache(q, k, v, 23)
        assert rel_error(sdpa_with_kvcache(q, k, v, 23), ours) < 1e-5


def test_full_grid_leaves_out_only_the_largest_cache():
    kept, skipped = measure.cells()
    assert len(kept) + len(skipped) == 4 * 5 * 2 * 2
    assert {(c["B"], c["S"], c["Hkv"]) for c in skipped} == {(64, 131072, 32)}
    assert all(2 * c["cache_bytes"] < 100e9 for c in kept)  # the paged copy beside it fits an H200
    assert "decode_vs_sdpa" in record.load_measurements() and "decode_generation" in record.load_measurements()


def test_decode_table_code_path():
    grid = dict(batches=(1,), contexts=(64,), heads=((4, 2), (4, 4)), D=16, dtypes=("float16",))
    table = measure.decode_table(grid, timer=measure.wall_timer, rounds=1, copy_gbps=1.0, page_size=16,
                                 max_bytes=measure.cache_bytes(1, 64, 2, 16, 2))
    (row,), (skipped,) = table["rows"], table["skipped"]
    assert (row["Hkv"], skipped["Hkv"]) == (2, 4) and "cache" in skipped["reason"]
    assert set(row["ms"]) == {"flashattn", "flashattn_paged", "sdpa", "fast"} and not row["errors"]
    assert all(err < 3e-3 for err in row["rel_error"].values())
    assert row["share"]["sdpa"] == row["gbps"]["sdpa"] and set(row["vs_sdpa"]) == set(row["ms"]) - {"sdpa"}
    assert "graph" not in row  # no capture given: calls only
    plan = decode.make_plan(1, 1, 4, 2, 16, 64, torch.float16, 0, runtime.DEVICE)
    assert (row["num_splits"], row["tiles"]) == (plan.num_splits, [plan.block_n, plan.num_warps, plan.num_stages])
    curve = measure.split_curve(((1, 2, 64),), "float16", (1, 2), device=runtime.DEVICE, copy_gbps=1.0,
                                timer=measure.wall_timer, rounds=1, D=16, page_size=16)
    assert curve[0]["splits"] == [1, 2] and len(curve[0]["share"]) == 2 and curve[0]["rule"] >= 1
    assert "graph_ms" not in curve[0]


def test_replays_are_timed_beside_the_calls_and_a_failed_capture_is_recorded():
    # a stand-in for cuda_graph_replay (no CUDA graphs on the CPU): the "replay" is the call itself, and the second
    # capture fails; each timing is a distinct number, so that a replay's time cannot be taken for its call's
    captured, clock = [], iter(range(1, 1000))

    def capture(fn):
        captured.append(fn)
        if len(captured) == 2:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")

        def replay():
            return ("replay", fn)
        return replay

    def timer(fn):
        fn()
        return float(next(clock))

    cell = dict(dtype="float16", B=1, S=64, Hq=4, Hkv=2, D=16, Lq=1, cache_bytes=measure.cache_bytes(1, 64, 2, 16, 2))
    p = measure.make_problem(cell, runtime.DEVICE, page_size=16)
    row = measure.measure_cell(cell, p, copy_gbps=1.0, timer=timer, rounds=2, capture=capture)
    names = list(measure.kernels(p))
    failed = names[1]
    graph = row["graph"]
    assert graph["errors"] == {failed: "RuntimeError: operation not permitted when stream is capturing"}
    assert set(graph["ms"]) == set(names) - {failed} and set(row["ms"]) == set(names)
    assert all(len(t) == 2 for t in graph["ms_rounds"].values())
    every = [t for r in (row["ms_rounds"], graph["ms_rounds"]) for times in r.values() for t in times]
    assert sorted(every) == list(range(1, len(every) + 1))  # calls and replays in one set of interleaved rounds
    assert graph["vs_sdpa"]["flashattn"] == graph["ms"]["sdpa"] / graph["ms"]["flashattn"]
    assert graph["share"]["sdpa"] == cell["cache_bytes"] / (graph["ms"]["sdpa"] * 1e-3) / 1e9
    assert "replayed: flashattn" in measure.format_row(row)
    curve = measure.split_curve(((1, 2, 64),), "float16", (1, 2), device=runtime.DEVICE, copy_gbps=1.0,
                                timer=timer, rounds=1, D=16, page_size=16, capture=lambda fn: fn)
    assert len(curve[0]["graph_ms"]) == len(curve[0]["ms"]) == len(curve[0]["splits"])
    assert set(curve[0]["graph_ms"]).isdisjoint(curve[0]["ms"])


def test_flush_effect_times_each_flush_in_the_same_rounds():
    """flush_effect: per shape, both kernels timed under every flush's timer, in one set of interleaved rounds
    (each timer stamps its calls: the medians must come from its own), ms and share by flush then kernel."""
    stamps = iter(range(1, 1000))

    def stamping(offset):
        def timer(fn):
            fn()
            return offset + next(stamps)  # a distinct "time" per call, above 10 000 for the read flush's calls
        return timer

    timers = {"zeros": stamping(0), "read": stamping(10_000)}
    rows = measure.flush_effect(((1, 2, 64),), "float16", device=runtime.DEVICE, copy_gbps=2.0, timers=timers,
                                rounds=3, D=16, page_size=16, capture=lambda fn: fn)
    (row,) = rows
    assert row["replayed"] and set(row["ms"]) == set(row["share"]) == {"zeros", "read"}
    for flush in ("zeros", "read"):
        assert set(row["ms"][flush]) == {"flashattn", "sdpa"}
        assert all((ms > 10_000) == (flush == "read") for ms in row["ms"][flush].values())
        for name, ms in row["ms"][flush].items():
            assert row["share"][flush][name] == row["cache_bytes"] / (ms * 1e-3) / 1e9 / 2.0
    assert next(stamps) == 13  # 2 flushes x 2 kernels x 3 rounds, each call timed once


def test_the_read_flush_leaves_the_buffer_and_gives_the_drivers_flush_back(monkeypatch):
    """bench.l2_flush("read") makes do_bench's flush a read of its buffer (nothing written: no dirty lines), only
    inside the block, nested or not; an unknown flush is a ValueError naming the choices."""
    import triton

    class Driver:
        def clear_cache(self, cache):
            cache.zero_()

    config = triton.runtime.driver.__class__()
    config.set_active(Driver())
    monkeypatch.setattr(triton.runtime, "driver", config)
    driver, buffer = config.active, torch.ones(8)
    with bench.l2_flush("read"):
        driver.clear_cache(buffer)
        assert torch.equal(buffer, torch.ones(8))
        with bench.l2_flush("read"), bench.l2_flush("zeros"):
            driver.clear_cache(buffer)
        driver.clear_cache(buffer)
        assert torch.equal(buffer, torch.ones(8))
    driver.clear_cache(buffer)
    assert torch.equal(buffer, torch.zeros(8)) and "clear_cache" not in vars(driver)
    with pytest.raises(ValueError, match="zeros.*read"):
        with bench.l2_flush("dirty"):
            pass


def test_flex_pass_code_path(monkeypatch):
    # FlexAttention is timed after the table, beside SDPA timed again, on FLEX_CELLS' rows only (a stand-in
    # computes it here: compiling FlexAttention on the CPU is not what is tested)
    monkeypatch.setitem(measure.FLEX_CELLS, "batches", (1,))
    monkeypatch.setitem(measure.FLEX_CELLS, "contexts", (64,))
    grid = dict(batches=(1, 2), contexts=(64,), heads=((4, 2),), D=16, dtypes=("float16",))
    table = measure.decode_table(grid, timer=measure.wall_timer, rounds=1, copy_gbps=1.0, page_size=16)
    assert not any("flex" in row["ms"] for row in table["rows"])

    def stand_in(q, k, v, enable_gqa):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=enable_gqa)

    done = measure.flex_pass(table["rows"], timer=measure.wall_timer, rounds=2, page_size=16, copy_gbps=1.0,
                             flex_fn=stand_in)
    one, two = table["rows"]
    assert done == 1 and "flex" in one["ms"] and "flex" not in two["ms"]
    assert len(one["ms_rounds"]["flex"]) == 2 and one["rel_error"]["flex"] < 3e-3
    assert one["vs_sdpa"]["flex"] == one["sdpa_beside_flex_ms"] / one["ms"]["flex"]
    assert one["share"]["flex"] == one["gbps"]["flex"]

    replayed = measure.decode_table(grid, timer=measure.wall_timer, rounds=1, copy_gbps=1.0, page_size=16,
                                    capture=lambda fn: fn)
    measure.flex_pass(replayed["rows"], timer=measure.wall_timer, rounds=1, page_size=16, copy_gbps=1.0,
                      flex_fn=stand_in, capture=lambda fn: fn)
    graph = replayed["rows"][0]["graph"]
    assert "flex" in graph["ms"] and graph["vs_sdpa"]["flex"] == graph["sdpa_beside_flex_ms"] / graph["ms"]["flex"]
    assert "flex" not in replayed["rows"][1]["graph"]["ms"]


def test_generation_measurement_code_path():
    model = small_model()
    prompt = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(3)).to(runtime.DEVICE)
    assert measure.tokens_agree(model, prompt, 4) == {"flashattn": 1.0, "sdpa": 1.0}
    timing = measure.step_times(model, prompt, 3, rounds=1)
    assert set(timing["tokens_per_s"]) == {"flashattn", "sdpa"}
    assert all(len(t) == 1 for t in timing["ms_rounds"].values())


@pytest.mark.parametrize("attention", [flashattn.attention_with_kvcache, sdpa_with_kvcache])
def test_a_prompt_in_chunks_through_the_cache_gives_the_logits_without(attention):
    # prefill 5, then a chunk of 4 against the 5 cached (Lq = 4 < 9 keys: bottom right, positions 5..8), then 1
    model = small_model()
    tokens = torch.randint(0, 16, (2, 10), generator=torch.Generator().manual_seed(4)).to(runtime.DEVICE)
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache(2, attention=attention)
        chunks = [model(tokens[:, a:b], cache) for a, b in ((0, 5), (5, 9), (9, 10))]
    assert cache.length == 10
    assert rel_error(torch.cat(chunks, 1), full) < 1e-5


def test_generate_fills_the_position_embeddings_and_wants_an_empty_cache():
    model = small_model()
    prompt = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(5)).to(runtime.DEVICE)
    full = model.generate(prompt, 8)  # 12 + 8 = seq_len: the last token is predicted at position 19
    assert torch.equal(model.generate(prompt, 8, model.new_cache(2)), full)
    with pytest.raises(ValueError, match="seq_len"):
        model.generate(prompt, 9)
    cache = model.new_cache(2)
    model.generate(prompt, 1, cache)
    with pytest.raises(ValueError, match="empty"):
        model.generate(prompt, 1, cache)


def test_generation_measurements_use_each_attention(monkeypatch):
    # tokens_agree scores each cache loop by its own attention (a wrong one scores below 1), and step_times' two
    # loops attend over the same prompt keys (the flashattn cache gets the SDPA prefill's)
    model = small_model()
    prompt = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(3)).to(runtime.DEVICE)

    def no_attention(q, k_cache, v_cache, cache_seqlens, *, causal=True):
        return torch.zeros_like(q)

    monkeypatch.setattr(measure, "sdpa_with_kvcache", no_attention)
    agree = measure.tokens_agree(model, prompt, 4)
    assert agree["flashattn"] == 1.0 and agree["sdpa"] < 1.0
    monkeypatch.undo()

    seen = {}

    def spy(name, attention):
        def fn(q, k_cache, v_cache, cache_seqlens, **kw):
            if q.shape[1] == 1:  # a step: the prompt's keys (layer 0 first) as this loop sees them
                seen.setdefault(name, k_cache[:, :prompt.shape[1]].clone())
            return attention(q, k_cache, v_cache, cache_seqlens, **kw)
        return fn

    monkeypatch.setattr(measure, "attention_with_kvcache", spy("flashattn", flashattn.attention_with_kvcache))
    monkeypatch.setattr(measure, "sdpa_with_kvcache", spy("sdpa", sdpa_with_kvcache))
    measure.step_times(model, prompt, 2, rounds=1)
    assert set(seen) == {"flashattn", "sdpa"} and seen["sdpa"].abs().sum() > 0
    assert torch.equal(seen["flashattn"], seen["sdpa"])
