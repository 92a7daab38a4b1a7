"""What ``torch.profiler`` shows on a GPU (notebook 09): the quick table of the profiling workflow, recorded so
that a learner without a GPU sees the kernels and their GPU times.

* ``torch_profile_table``  ``profile.torch_profile`` of naive, v1 and v2 (fp16) at the full size: one row per
                           label, PyTorch operator and GPU kernel
"""

from __future__ import annotations

import functools

import torch

from flashattn import runtime
from flashattn.kernels import VARIANTS
from flashattn.measure.profile import torch_profile
from flashattn.record import measurement

PROFILED = ("naive", "v1", "v2")
REPEAT = 3


@measurement("torch_profile_table", description="torch.profiler table of naive, v1 and v2 (fp16, full size)")
def torch_profile_table() -> dict:
    sizes = runtime.SIZES_BY_NAME["full"]
    q, k, v = runtime.random_qkv(sizes.B, sizes.H, sizes.N, sizes.D, dtype=torch.float16, device="cuda")
    calls = {name: functools.partial(VARIANTS[name], q, k, v) for name in PROFILED}
    rows = torch_profile(calls, repeat=REPEAT)
    del q, k, v
    torch.cuda.empty_cache()
    return {"rows": rows, "variants": list(PROFILED), "repeat": REPEAT, "dtype": "float16",
            "B": sizes.B, "H": sizes.H, "N": sizes.N, "D": sizes.D,
            "notes": f"flashattn.profile.torch_profile(calls, repeat={REPEAT}): one unprofiled warm-up call each "
                     "(Triton compiles), then each label's calls inside record_function(label); times are totals "
                     "over the calls, GPU times from the CUDA activity (kernels) and the GPU-side annotation of "
                     "each label"}
