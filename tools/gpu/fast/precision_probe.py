"""The drop-in's errors under the installed Triton (issue 27: an error said to grow 30-fold under Triton 3.9).

    python tools/gpu/fast/precision_probe.py     # $OUT/precision_<triton version>.json

For the cases of tests/test_precision.py, and at the issue's size (B = 4, H = 16, the cell of fast_vs_sdpa), each
relative error against the float64 reference (output, dQ, dK, dV) of the drop-in and of SDPA, the output dtype's
own rounding floor (``rel_error(ref.to(dtype), ref)``), and the distance between the two outputs. Run it under
each Triton and compare: a real loss shows as ours growing against SDPA's, not as a change of the distance.
"""

import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import torch  # noqa: E402
import triton  # noqa: E402
from helpers import qkv  # noqa: E402
from test_precision import errors, reference_grads  # noqa: E402

import flashattn  # noqa: E402
from flashattn.reference import rel_error  # noqa: E402

CASES = [(2, 4, N, D) for N, D in ((1024, 64), (1024, 128), (4096, 128))] + [(4, 16, 1024, 128)]


def main() -> None:
    rows = []
    for B, H, N, D in CASES:
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                q, k, v = qkv(B, H, N, D, dtype, seed=N + D)
                do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(q)
                refs = reference_grads(q, k, v, do, causal)
                ours = errors(flashattn.scaled_dot_product_attention, q, k, v, do, causal, refs)
                theirs = errors(torch.nn.functional.scaled_dot_product_attention, q, k, v, do, causal, refs)
                with torch.no_grad():
                    distance = rel_error(flashattn.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                         torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
                row = dict(B=B, H=H, N=N, D=D, dtype=str(dtype)[6:], causal=causal,
                           ours=dict(zip(("out", "dq", "dk", "dv"), ours, strict=True)),
                           sdpa=dict(zip(("out", "dq", "dk", "dv"), theirs, strict=True)),
                           floor=rel_error(refs[0].to(dtype), refs[0]), ours_vs_sdpa_out=distance)
                print(json.dumps(row), flush=True)
                rows.append(row)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, f"precision_{triton.__version__}.json"), "w") as f:
        json.dump({"triton": triton.__version__, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
