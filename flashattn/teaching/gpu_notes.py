"""What the live GPU lacks of what a notebook teaches, said from the device itself (README: "Where it runs").

The course was measured on an H200. On another GPU the notebooks still run live, but some of what they teach is
not there: below sm_80 Triton's ``tl.dot`` multiplies on the CUDA cores (no ``mma``, so no tensor-core story),
bfloat16 needs sm_80, and TMA, ``wgmma`` and the Gluon kernels of notebooks 11 and 12 need sm_90. A notebook
calls :func:`say` with the features it teaches; on a GPU that lacks one it prints which, and that the numbers
and listings it shows for it are the recorded H200's. In interpreter mode it prints nothing (every GPU number
there is recorded, and labelled so).
"""

from __future__ import annotations

from flashattn import runtime
from flashattn.kernels import device

FEATURES = {
    "tensor cores": ("tensor_cores", "Triton's tl.dot runs on the CUDA cores here (tensor cores from sm_80 on): the "
                                     "tensor-core timings, layouts and SASS this notebook discusses are the recorded "
                                     "H200's; the live 16-bit runs below use CUDA cores"),
    "bfloat16": ("bf16", "bfloat16 needs sm_80 or newer: the live runs use float16, the bfloat16 rows are the "
                         "recorded H200's"),
    "hopper": ("hopper", "TMA, wgmma and the warp-specialized Gluon kernels need sm_90 (H100/H200): fast runs its "
                         "Triton kernels here, and what this notebook shows of the Hopper path is the recorded H200's"),
}


def lacking(*features: str) -> list[str]:
    """The sentences for each of ``features`` the live GPU lacks (empty without a GPU, or on an H100/H200)."""
    unknown = [f for f in features if f not in FEATURES]
    if unknown:
        raise ValueError(f"unknown feature(s) {unknown}; known: {', '.join(FEATURES)}")
    live = device.target()
    if live is None:
        return []
    return [text for f in features for attr, text in [FEATURES[f]] if not getattr(live, attr)]


def say(*features: str) -> None:
    """Print what the live GPU lacks of ``features``, naming the GPU; nothing when it has them all."""
    missing = lacking(*features)
    if missing:
        live = device.target()
        print(f"On this {runtime.gpu_name()} ({live.name}):")
        for text in missing:
            print(f"  - {text}.")
