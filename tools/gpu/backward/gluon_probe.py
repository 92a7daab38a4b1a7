"""The Gluon backward (kernels/fast_backward_gluon.py) against the Triton kernels and SDPA's, and its ring depth.

    python tools/gpu/backward/gluon_probe.py      # a few minutes on an H200; $OUT/gluon_probe.json, a table last

fp16 and bf16, D 64 and 128, causal and not, N 4096 and 16384 (B·N = 16384, H = 16; PROBE_D, PROBE_N and
PROBE_DTYPES choose). Every function is checked against float64 autograd on two heads, then all are timed in
three interleaved rounds: SDPA's backward (cuDNN), the fast backward's default (the Gluon kernel on Hopper), its
Triton kernels (gluon=False), and the Gluon kernel alone with a ring of 2 and of 3 Q/dO slots (``delta``
computed once beforehand, so these two compare with each other only). Ratios: SDPA time / time.
"""
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from atomic_probe import check_and_time  # noqa: E402

from flashattn import runtime  # noqa: E402
from flashattn.kernels import fast_backward as fb  # noqa: E402
from flashattn.kernels import fast_backward_gluon as fbg  # noqa: E402
from flashattn.kernels.fast import attention_fast  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/gluon_probe")
T0 = time.time()
BUDGET_S = int(os.environ.get("PROBE_BUDGET_S", 300))  # no new problem starts past this
HEAD_DIMS = [int(x) for x in os.environ.get("PROBE_D", "64 128").split()]
LENGTHS = [int(x) for x in os.environ.get("PROBE_N", "4096 16384").split()]
DTYPES = [getattr(torch, x) for x in os.environ.get("PROBE_DTYPES", "float16 bfloat16").split()]


def log(*args):
    print(f"[{time.time() - T0:6.1f}s]", *args, flush=True)


def problem(dtype, D, causal, N):
    B, H = 16384 // N, 16
    q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N + D)
    do = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N + D + 1)[0]
    o, lse = attention_fast(q, k, v, causal=causal, return_lse=True)
    delta = (o.float() * do.float()).sum(-1)
    scale = D ** -0.5
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    graph = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    fns = {"sdpa": lambda: torch.autograd.grad(graph, leaves, do, retain_graph=True),
           "default": lambda: fb.attention_backward_fast(q, k, v, o, lse, do, causal=causal),
           "triton": lambda: fb.attention_backward_fast(q, k, v, o, lse, do, causal=causal, gluon=False)}
    for stages in (2, 3):
        fns[f"gluon stages={stages}"] = (lambda s=stages: fbg.attention_backward_gluon(
            q, k, v, o, lse, do, delta, causal=causal, scale=scale, stages=s))
    errors, times, ms = check_and_time(fns, q, k, v, do, causal)
    return dict(dtype=str(dtype).replace("torch.", ""), D=D, causal=causal, N=N, B=B, ms=ms, rounds=times,
                err=errors, ratio={name: ms["sdpa"] / t for name, t in ms.items()})


def main():
    os.makedirs(OUT, exist_ok=True)
    rows = []
    for dtype in DTYPES:
        for D in HEAD_DIMS:
            for causal in (False, True):
                for N in LENGTHS:
                    if time.time() - T0 > BUDGET_S:
                        log("out of time, skipped", dtype, D, causal, N)
                        continue
                    try:
                        row = problem(dtype, D, causal, N)
                        rows.append(row)
                        worst = {n: round(max(e), 5) if isinstance(e, list) else e for n, e in row["err"].items()}
                        log(row["dtype"], D, "causal" if causal else "full", N, "| max rel errors", worst)
                    except Exception:  # noqa: BLE001
                        log("FAILED", dtype, D, causal, N, traceback.format_exc()[-800:])
                    with open(os.path.join(OUT, "gluon_probe.json"), "w") as f:
                        json.dump(rows, f, indent=1)
                    torch.cuda.empty_cache()
    log("SUMMARY: SDPA ms / ms")
    for r in rows:
        log(r["dtype"][:4], r["D"], "C" if r["causal"] else "F", r["N"],
            " ".join(f"{n}={x:.3f}" for n, x in r["ratio"].items() if n != "sdpa"))


if __name__ == "__main__":
    main()
