"""The drop-in as an operator on the GPU (issue 28): what the CPU tests cannot show.

    python tools/gpu/operator/probe.py        # a few minutes on an H200; $OUT/operator_probe.json

1. correctness: a 2-layer GPT (d_model 1024, 16 heads of 64, fused QKV) on the drop-in, its loss and gradients
   compiled (``torch.compile``, default mode and ``fullgraph=True``) against eager, in float16 and bfloat16
   autocast; the graph and break counts from ``torch._dynamo.explain``;
2. ``mode="reduce-overhead"``: a training step (forward and backward) captured in CUDA graphs, replayed, and its
   loss against eager (a capture that fails prints why);
3. copies: a ``torch.profiler`` trace of one eager training step of the same model, listing every copy or
   transpose kernel (``copy``, ``elementwise`` on the attention's inputs, ``clone``) with its count: q, k, v are
   views of the fused projection, and the kernels behind ``descriptors.tma_ready`` and the backward's
   ``.contiguous()`` copy them;
4. host time per call (``flashattn.measure.measurements.host.host_us``) of the drop-in's forward and of its
   forward + backward step against SDPA's, at N = 1024, B = 16, H = 16, causal, D = 64, fp16 and bf16, beside
   do_bench's medians in interleaved rounds;
5. where the host time goes (issues 28 and 31: both lose to SDPA where the GPU's work is short): for the drop-in's
   forward, its training step, and ``attention_with_kvcache`` on a short cache (32/32 heads with 1 and 4 splits,
   32/8 with 4, 16 and 33), the host time
   per call, the GPU's own time (the call captured in a CUDA graph and replayed) and do_bench's, and the 25
   functions of most own time under cProfile.

Part 1 compiles the same model on SDPA too: its compiled-against-eager gap is the yardstick for ours.

In interpreter mode it runs parts 1 and 3 at a tiny size with backend "aot_eager", to check the script itself.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import traceback

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from flashattn import bench, runtime  # noqa: E402
from flashattn.functional import scaled_dot_product_attention  # noqa: E402
from flashattn.measure.measurements.host import host_us  # noqa: E402
from flashattn.measure.measurements.model_step import compiled_vs_eager, make_step  # noqa: E402
from flashattn.measure.measurements.training import make_model  # noqa: E402
from flashattn.models.gpt import GPTConfig  # noqa: E402

GPU = runtime.MODE == "gpu"
DEVICE = runtime.DEVICE
BACKEND = "inductor" if GPU else "aot_eager"
CONFIG = (dict(vocab_size=256, seq_len=1024, n_layers=2, n_heads=16, d_model=1024) if GPU
          else dict(vocab_size=32, seq_len=32, n_layers=1, n_heads=2, d_model=32))
BATCH = 4 if GPU else 2


def model_of(attention, seed=0):
    return make_model(GPTConfig(**CONFIG), attention, seed, DEVICE)


def compiled_against_eager(dtype, tokens, attention=scaled_dot_product_attention, **compile_kwargs) -> dict:
    """model_step's comparison: the compiled step's loss and worst gradient against the eager step's."""
    model = model_of(attention)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=BACKEND, **compile_kwargs)
    return compiled_vs_eager(make_step(model, tokens, dtype, DEVICE), make_step(compiled, tokens, dtype, DEVICE), model)


def copies_in_a_step(tokens, dtype) -> dict:
    model = model_of(scaled_dot_product_attention)
    step = make_step(model, tokens, dtype, DEVICE)
    step()  # tune and compile outside the trace
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if GPU else [])
    with torch.profiler.profile(activities=activities) as prof:
        step()
    names = {}
    for event in prof.key_averages():
        if any(word in event.key.lower() for word in ("copy", "clone", "contiguous", "transpose", "elementwise")):
            names[event.key] = event.count
    return names


def host_row(dtype) -> dict:
    q, k, v = (t.requires_grad_() for t in runtime.random_qkv(16, 16, 1024, 64, dtype=dtype, seed_value=1))
    do = torch.randn_like(q)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def ours():
        return torch.autograd.grad(scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), do)

    def theirs():
        return torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), do)

    with torch.no_grad():
        host = {"flashattn forward": host_us(lambda: scaled_dot_product_attention(q, k, v, is_causal=True)),
                "SDPA forward": host_us(lambda: sdpa(q, k, v, is_causal=True))}
    host |= {"flashattn step": host_us(ours), "SDPA step": host_us(theirs)}
    ms = {name: statistics.median(t) for name, t in bench.time_rounds({"flashattn step": ours,
                                                                        "SDPA step": theirs}, 5).items()}
    row = {"dtype": str(dtype)[6:], "host_us": host, "ms": ms,
           "step ratio (SDPA / flashattn)": ms["SDPA step"] / ms["flashattn step"]}
    print(row, flush=True)
    return row


def host_breakdown() -> list[dict]:
    """Part 5: host time, GPU time (graph replay) and do_bench per call, and cProfile's top functions."""
    import cProfile
    import io
    import pstats

    from triton.testing import do_bench, do_bench_cudagraph

    from flashattn import attention_with_kvcache

    q, k, v = (t.requires_grad_() for t in runtime.random_qkv(16, 16, 1024, 64, dtype=torch.bfloat16, seed_value=2))
    do = torch.randn_like(q)
    dq = torch.randn(1, 1, 32, 128, dtype=torch.float16, device=DEVICE)
    caches = {hkv: [torch.randn(1, 4096, hkv, 128, dtype=torch.float16, device=DEVICE) for _ in range(2)]
              for hkv in (32, 8)}
    seqlens = torch.full((1,), 4096, dtype=torch.int32, device=DEVICE)

    def forward():
        with torch.no_grad():
            return scaled_dot_product_attention(q, k, v, is_causal=True)

    def step():
        return torch.autograd.grad(scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), do)

    cases = {"drop-in forward (B16 H16 N1024 D64 bf16 causal)": (forward, True),
             "drop-in forward + backward": (step, False)}
    # decode_vs_sdpa (2026-12-02): at B = 1 with 32/8 heads a call took about as long at S = 4k with 16 splits as at
    # 32k with 33, and far longer than at 1k with 4: the graph replay tells the GPU's part from the host's
    for hkv, splits in ((32, 1), (32, 4), (8, 4), (8, 16), (8, 33)):
        cases[f"attention_with_kvcache, {splits} split(s) (B1 32/{hkv} heads S4096 D128 fp16)"] = (
            lambda splits=splits, hkv=hkv: attention_with_kvcache(dq, *caches[hkv], seqlens, num_splits=splits), True)
    rows = []
    for name, (fn, capturable) in cases.items():
        row = {"call": name, "host_us": host_us(fn),
               "do_bench_us": do_bench(fn, warmup=5, rep=40, return_mode="median") * 1e3}
        try:
            # the GPU's own time: the call captured in a CUDA graph, its replays timed
            row["graph_us"] = do_bench_cudagraph(fn, rep=40, return_mode="median") * 1e3 if capturable else None
        except Exception as err:  # noqa: BLE001  (a capture that fails is a finding)
            row["graph_us"] = f"capture failed: {type(err).__name__}: {str(err)[:200]}"
        profile = cProfile.Profile()
        torch.cuda.synchronize()
        profile.enable()
        for _ in range(200):
            fn()
        profile.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        row["cprofile_top25_tottime_200_calls"] = text.getvalue()[-6000:]
        print({key: value for key, value in row.items() if not key.startswith("cprofile")}, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    out_dir = os.environ.get("OUT", "./probe_out")
    os.makedirs(out_dir, exist_ok=True)
    result = {"device": runtime.describe(), "torch": torch.__version__, "config": CONFIG, "batch": BATCH}
    tokens = torch.randint(0, CONFIG["vocab_size"], (BATCH, CONFIG["seq_len"] + 1), device=DEVICE)
    dtypes = (torch.float16, torch.bfloat16) if GPU else (torch.float32,)

    explanation = torch._dynamo.explain(model_of(scaled_dot_product_attention))(tokens[:, :-1])
    result["explain"] = {"graphs": explanation.graph_count, "breaks": explanation.graph_break_count,
                         "reasons": [str(r.reason) for r in explanation.break_reasons]}
    print("explain:", result["explain"], flush=True)
    for dtype in dtypes:
        for label, kwargs in (("default", {}), ("fullgraph", {"fullgraph": True})):
            key = f"compiled {label} {str(dtype)[6:]}"
            result[key] = compiled_against_eager(dtype, tokens, **kwargs)
            print(key, result[key], flush=True)
        key = f"SDPA compiled default {str(dtype)[6:]}"
        result[key] = compiled_against_eager(dtype, tokens, torch.nn.functional.scaled_dot_product_attention)
        print(key, result[key], flush=True)

    if GPU:
        try:
            result["reduce-overhead"] = {str(dtype)[6:]: compiled_against_eager(dtype, tokens, mode="reduce-overhead")
                                         for dtype in dtypes}
        except Exception:  # noqa: BLE001  (what failed is the finding)
            result["reduce-overhead"] = {"error": traceback.format_exc()[-3000:]}
        print("reduce-overhead:", result["reduce-overhead"], flush=True)

    result["copies"] = {str(dtype)[6:]: copies_in_a_step(tokens, dtype) for dtype in dtypes}
    print("copies:", json.dumps(result["copies"], indent=1), flush=True)

    if GPU:
        result["host"] = [host_row(dtype) for dtype in dtypes]
        result["host_breakdown"] = host_breakdown()

    with open(os.path.join(out_dir, "operator_probe.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
