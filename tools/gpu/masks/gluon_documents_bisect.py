"""GPU probe (issue 30): which packed-documents problems the Gluon backward (``fast_backward_gluon.py``'s DOCS)
fails on. Stop 53 saw it stop with "illegal instruction"; each case here runs in a process of its own (a failed
launch leaves the context unusable), with CUDA_LAUNCH_BLOCKING=1, and its gradients are compared with the Triton
kernels'. Then the first failing case again under compute-sanitizer.

    python tools/gpu/masks/gluon_documents_bisect.py          # one case: ... one LENGTHS CAUSAL D
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASES = [((128,), False, 64), ((256,), False, 64), ((256,), True, 64), ((64,), False, 64), ((192,), False, 64),
         ((128, 128), False, 64), ((1,), False, 64), ((100, 28), False, 64), ((256,), False, 128),
         ((1, 127, 128, 129, 0, 300, 2000), False, 64), ((1, 127, 128, 129, 0, 300, 2000), True, 128)]


def one(lengths, causal, D):
    import torch

    from flashattn import masking
    from flashattn.kernels import mask_blocks as mb
    from flashattn.kernels import masked
    from flashattn.reference import rel_error

    gen = torch.Generator().manual_seed(D)
    total, cu = sum(lengths), mb.cu_seqlens(lengths, "cuda")
    q, k, v, do = (torch.randn(total, 3, D, generator=gen).to("cuda", torch.float16) for _ in range(4))
    kw = dict(causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths))
    masked.GLUON_DOCUMENTS_DIMS = masked.GLUON_DOCUMENTS_BACKWARD_DIMS = ()  # the reference: the Triton kernels
    o, lse = masking.masked_forward(q, k, v, **kw)
    ref = masking.masked_backward(q, k, v, o, lse, do, **kw)
    masked.GLUON_DOCUMENTS_BACKWARD_DIMS = (D,)
    got = masking.masked_backward(q, k, v, o, lse, do, **kw)
    torch.cuda.synchronize()
    print(json.dumps({"errors": [rel_error(g, r) for g, r in zip(got, ref, strict=True)]}))


def main():
    out = os.environ.get("OUT", ".")
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    rows, first_bad = [], None
    for lengths, causal, D in CASES:
        cmd = [sys.executable, __file__, "one", ",".join(map(str, lengths)), str(int(causal)), str(D)]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
        rows.append({"lengths": lengths, "causal": causal, "D": D, "rc": r.returncode, "tail": tail})
        print(rows[-1], flush=True)
        if r.returncode and first_bad is None:
            first_bad = cmd
    if first_bad:
        r = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--show-backtrace", "device", *first_bad],
                           env=env, capture_output=True, text=True, timeout=400)
        rows.append({"sanitizer": (r.stdout + r.stderr)[-6000:]})
        print(rows[-1]["sanitizer"], flush=True)
    with open(os.path.join(out, "gluon_documents_bisect.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["one"]:
        one(tuple(int(x) for x in sys.argv[2].split(",")), bool(int(sys.argv[3])), int(sys.argv[4]))
    else:
        main()
