"""The Gluon backward (kernels/fast_backward_gluon.py) against the Triton kernels and SDPA's, and its ring depth.

    python tools/gpu/backward/gluon_probe.py      # a few minutes on an H200; $OUT/gluon_probe.json, a table last

fp16 and bf16, D 64 and 128, causal and not, N 4096 and 16384 (B·N = 16384, H = 16; PROBE_DTYPES, PROBE_D,
PROBE_N and PROBE_BUDGET_S as for atomic_probe.py). Every function is checked against float64 autograd on two
heads, then all are timed in three interleaved rounds: SDPA's backward (cuDNN), the fast backward's default (the
Gluon kernel on Hopper), its Triton kernels (gluon=False), and the Gluon kernel alone with each ring of Q/dO
slots that fits in shared memory (RINGS: at D = 128 only 2 fit; ``delta`` computed once beforehand, so these
compare with each other only). Ratios: SDPA time / time.
"""
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from atomic_probe import check_and_time, inputs, log, run_problems  # noqa: E402

from flashattn.kernels import fast_backward as fb  # noqa: E402
from flashattn.kernels import fast_backward_gluon as fbg  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/gluon_probe")
RINGS = {64: (3, 4), 128: (2,)}  # Q/dO slots that fit in 227 KB of shared memory beside the kernel's other tiles


def problem(dtype, D, causal, N):
    B, q, k, v, do, o, lse = inputs(dtype, D, causal, N)
    delta = fb.delta_rows(o, do)
    scale = D ** -0.5
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    graph = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    fns = {"sdpa": lambda: torch.autograd.grad(graph, leaves, do, retain_graph=True),
           "default": lambda: fb.attention_backward_fast(q, k, v, o, lse, do, causal=causal),
           "triton": lambda: fb.attention_backward_fast(q, k, v, o, lse, do, causal=causal, gluon=False)}

    def gluon_kernel(stages):
        dq_acc, dk, dv = fbg.attention_backward_gluon(q, k, v, lse, do, delta, causal=causal, scale=scale,
                                                      stages=stages)
        return fb.finish_dq(dq_acc, q.dtype, scale), dk, dv

    for stages in RINGS[D]:
        fns[f"gluon stages={stages}"] = lambda s=stages: gluon_kernel(s)
    errors, times, ms = check_and_time(fns, q, k, v, do, causal)
    return dict(dtype=str(dtype).replace("torch.", ""), D=D, causal=causal, N=N, B=B, ms=ms, rounds=times,
                err=errors, ratio={name: ms["sdpa"] / t for name, t in ms.items()})


def main():
    rows = run_problems(problem, os.path.join(OUT, "gluon_probe.json"))
    log("SUMMARY: SDPA ms / ms")
    for r in rows:
        log(r["dtype"][:4], r["D"], "C" if r["causal"] else "F", r["N"],
            " ".join(f"{n}={x:.3f}" for n, x in r["ratio"].items() if n != "sdpa"))


if __name__ == "__main__":
    main()
