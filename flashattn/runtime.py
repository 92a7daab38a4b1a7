"""Which mode the course runs in, on what device, at what problem sizes.

Two modes, chosen automatically:

* ``gpu``: a CUDA GPU is visible; kernels are compiled by Triton and timed live.
* ``interpreter``: no GPU; kernels run on the CPU through Triton's interpreter
  (``TRITON_INTERPRET=1``) at small sizes, and timings come from the recorded GPU files.

This module must be imported before any ``@triton.jit`` function is defined: Triton reads
``TRITON_INTERPRET`` when the decorator runs. ``import flashattn`` takes care of that.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

HAS_GPU = torch.cuda.is_available()

# The repository (an editable install): figures/ and figures/data/ live here.
REPO_ROOT = Path(__file__).resolve().parent.parent

# Triton 3.9 warns at the first compile that its default of fusing a*b+c into one FMA will change in 3.10, unless this
# is set: keep fusion on, as it is in every release before and in every recorded GPU run (the user may set it).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

# The user may force either mode with TRITON_INTERPRET=0/1; otherwise no GPU means interpreter.
if "TRITON_INTERPRET" not in os.environ and not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton.language" in sys.modules:  # too late for Triton's own jit functions (tl.max, tl.softmax, ...)
        warnings.warn("flashattn: triton was imported before flashattn, so Triton's own @triton.jit functions "
                      "(tl.max, tl.softmax, ...) were made for a GPU, and a kernel run in the interpreter that calls "
                      "them from a function of its own can fail with \"Cannot call @triton.jit'd outside of the "
                      "scope of a kernel\". Import flashattn first, or set TRITON_INTERPRET=1 before importing "
                      "triton.", stacklevel=2)

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")
MODE = "interpreter" if INTERPRET else "gpu"
DEVICE = torch.device("cuda" if MODE == "gpu" and HAS_GPU else "cpu")
# the GPU's compute capability, e.g. (9, 0) for an H200 (None without one); flashattn.kernels.device says what
# each capability has (tensor cores from (8, 0), bfloat16 from (8, 0), TMA and wgmma at (9, 0))
CAPABILITY = tuple(torch.cuda.get_device_capability(0)) if HAS_GPU else None
# the dtypes the kernels take in this mode: bfloat16 needs a GPU of sm_80 or newer, and the interpreter refuses it
# (its bfloat16 dot is wrong); HALF is the 16-bit type a model trains in here (bfloat16 where there is one)
_BF16 = MODE == "gpu" and CAPABILITY is not None and CAPABILITY >= (8, 0)
DTYPES = (torch.float32, torch.float16) + ((torch.bfloat16,) if _BF16 else ())
HALF = torch.bfloat16 if _BF16 else torch.float16


@dataclass(frozen=True)
class Sizes:
    """Problem sizes for one mode. Notebooks and tests read sizes from here, never from literals."""

    name: str
    B: int  # batch
    H: int  # heads
    N: int  # sequence length
    D: int  # head dimension
    N_sweep: tuple[int, ...]  # sequence lengths for "against N" plots


SIZES_BY_NAME = {
    "small": Sizes("small", B=1, H=2, N=128, D=32, N_sweep=(16, 32, 64, 128, 256)),
    "full": Sizes("full", B=4, H=16, N=4096, D=64, N_sweep=(512, 1024, 2048, 4096, 8192, 16384)),
}


def _choose_sizes() -> Sizes:
    wanted = os.environ.get("FLASHATTN_SIZE", "").strip().lower()
    if wanted:
        if wanted not in SIZES_BY_NAME:
            raise ValueError(f"FLASHATTN_SIZE={wanted!r}: accepted values are 'small' and 'full'")
        return SIZES_BY_NAME[wanted]
    return SIZES_BY_NAME["full" if MODE == "gpu" else "small"]


SIZES = _choose_sizes()


def seed(value: int = 0) -> torch.Generator:
    """Seed Python, NumPy (if present) and torch; return a torch generator for ``value``."""
    random.seed(value)
    try:
        import numpy as np

        np.random.seed(value)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    torch.manual_seed(value)
    return torch.Generator().manual_seed(value)


def random_qkv(B=None, H=None, N=None, D=None, *, dtype=torch.float32, seed_value=0, device=None):
    """Fresh random q, k, v of shape (B, H, N, D) on the course device (sizes default to SIZES)."""
    B = SIZES.B if B is None else B
    H = SIZES.H if H is None else H
    N = SIZES.N if N is None else N
    D = SIZES.D if D is None else D
    gen = torch.Generator().manual_seed(seed_value)
    device = DEVICE if device is None else device
    q, k, v = (torch.randn(B, H, N, D, generator=gen, dtype=torch.float32) for _ in range(3))
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def gpu_name() -> str | None:
    return torch.cuda.get_device_name(0) if HAS_GPU else None


def describe() -> str:
    """One line: the mode, the GPU or the interpreter, the versions, the sizes."""
    import triton

    if MODE == "gpu":
        major, minor = CAPABILITY
        where = f"GPU mode on {gpu_name()} (sm_{major}{minor})"
    else:
        where = "interpreter mode (Triton interpreter on the CPU" + (
            ", a GPU is present but TRITON_INTERPRET=1)" if HAS_GPU else ", no GPU found)"
        )
    s = SIZES
    return (
        f"{where} | torch {torch.__version__} | triton {triton.__version__} | "
        f"sizes '{s.name}': B={s.B} H={s.H} N={s.N} D={s.D}"
    )
