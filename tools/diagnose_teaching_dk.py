"""A GPU diagnostic, kept as an example of the method (issue 18). The teaching backward's dK at D = 128,
non-causal, was off on the H200 (a recording of fast_backward_vs_sdpa showed several times SDPA's error, falling
with N; the interpreter, with the GPU's tiles, did not). This script located it: with the default tiles then
(32 x 64, 8 warps, 2 stages) dK changed from run to run, and one stage, 64-row blocks or 32-key blocks each
brought it back to rounding error, the same bits every run: a race in Triton 3.6's pipelined loop.
kernels/backward.default_options now runs one stage there.

Run on the GPU machine from the repository root:  python tools/diagnose_teaching_dk.py
(about a minute). It prints one line per case and a summary table last; details go to
$OUT/teaching_dk_d128.json.

Cases: the tiles that raced (32, 64, 8 warps, 2 stages) twice (is it deterministic?), then one change at a time
(num_stages=1, num_warps=4, block_m=64, block_n=32, input_precision irrelevant for fp16), fp16 and bf16, N 1024 and
4096, causal=False (and one causal control). For the worst case it prints which key rows of dK are wrong
(positions mod BLOCK_N, first/last block) so the defect can be pinned to a loop iteration or a tile position.
"""
import json
import os
import time
import traceback

import torch

from flashattn import runtime
from flashattn.kernels.backward import attention_backward, default_options
from flashattn.kernels.v2 import attention_v2
from flashattn.measure.measurements.backward import _grads_float64
from flashattn.reference import rel_error

OUT = os.environ.get("OUT", ".")
assert runtime.MODE == "gpu", "needs the GPU"


def case(dtype, N, causal, H=2, B=1, seed=0, **options):
    q, k, v = runtime.random_qkv(B, H, N, 128, dtype=dtype, seed_value=N + 128 + seed)
    do = runtime.random_qkv(B, H, N, 128, dtype=dtype, seed_value=N + 129 + seed)[0]
    o, lse = attention_v2(q, k, v, causal=causal, return_lse=True)
    g1 = attention_backward(q, k, v, o, lse, do, causal=causal, **options)
    g2 = attention_backward(q, k, v, o, lse, do, causal=causal, **options)
    torch.cuda.synchronize()
    ref = _grads_float64(q, k, v, do, causal)
    errs = [rel_error(g, r) for g, r in zip(g1, ref, strict=True)]
    same = all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))
    # where dK is wrong: per key row, |dk - ref| / ‖ref row‖ (first head)
    dk, rk = g1[1][0, 0].double(), ref[1][0, 0]
    row_err = ((dk - rk).norm(dim=-1) / rk.norm(dim=-1).clamp_min(1e-30)).cpu()
    worst = torch.topk(row_err, 8)
    bn = options["block_n"]
    info = {"dtype": str(dtype), "N": N, "causal": causal, "options": options, "rel_error": errs,
            "deterministic": same, "worst_rows": worst.indices.tolist(),
            "worst_row_err": [round(x, 5) for x in worst.values.tolist()],
            "worst_rows_mod_block_n": [i % bn for i in worst.indices.tolist()],
            "median_row_err": row_err.median().item()}
    return info


# the tiles that raced (the default then; default_options now runs one stage), and one change at a time from them
RACED = dict(block_m=32, block_n=64, num_warps=8, num_stages=2)
CASES = [RACED] + [{**RACED, **change} for change in (dict(num_stages=1), dict(num_warps=4), dict(block_m=64),
                                                      dict(block_n=32), dict(block_m=64, block_n=64))]
rows = []
t0 = time.time()
print(f"GPU {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
      f"default tiles {default_options(torch.float16, 128)}")
for dtype in (torch.float16, torch.bfloat16):
    for N in (1024, 4096):
        for opts in CASES if dtype == torch.float16 else CASES[:1]:
            for causal in (False,) if opts is not RACED else (False, True):
                try:
                    r = case(dtype, N, causal, **opts)
                except Exception as err:  # noqa: BLE001
                    r = {"dtype": str(dtype), "N": N, "causal": causal, "options": opts,
                         "error": f"{type(err).__name__}: {err}"[:300]}
                    traceback.print_exc()
                rows.append(r)
                print(json.dumps(r), flush=True)
# the recorded shape itself (B = 16, H = 16 at N = 1024), today's default tiles, error on the first two heads
try:
    q, k, v = runtime.random_qkv(16, 16, 1024, 128, dtype=torch.float16, seed_value=1024 + 128)
    do = runtime.random_qkv(16, 16, 1024, 128, dtype=torch.float16, seed_value=1024 + 129)[0]
    o, lse = attention_v2(q, k, v, return_lse=True)
    g = attention_backward(q, k, v, o, lse, do)
    sl = (slice(0, 1), slice(0, 2))
    ref = _grads_float64(q[sl], k[sl], v[sl], do[sl], False)
    rows.append({"dtype": "torch.float16", "N": 1024, "causal": False, "options": {"recorded shape": "B16 H16"},
                 "rel_error": [rel_error(a[sl], b) for a, b in zip(g, ref, strict=True)]})
except Exception as err:  # noqa: BLE001
    rows.append({"options": {"recorded shape": "B16 H16"}, "error": str(err)[:300]})
with open(os.path.join(OUT, "teaching_dk_d128.json"), "w") as f:
    json.dump(rows, f, indent=1)
print(f"\n=== summary ({time.time() - t0:.0f} s): relative error of dq, dk, dv against float64 (rounding: as SDPA's "
      f"in the recorded fast_backward_vs_sdpa)")
for r in rows:
    e = r.get("rel_error")
    print(f"{r.get('dtype', ''):<15}{r.get('N', ''):>6} causal={str(r.get('causal')):<6}{str(r.get('options')):<40}"
          + (" ".join(f"{x:.1e}" for x in e) if e else r.get("error", ""))
          + (f"  det={r['deterministic']} worst rows {r['worst_rows'][:4]} "
             f"(mod BLOCK_N {r['worst_rows_mod_block_n'][:4]})" if "deterministic" in r else ""))
