"""The attention kernels, one family per file, and the registry every list of variants comes from.

``VARIANTS`` maps each name to its function ``fn(q, k, v, *, causal, scale, **options)``; the records
behind it (default options, jitted kernels, colour, the notebook that teaches it, ...) are in
``registry.py``.
"""

from . import triton_compat  # noqa: F401, I001  (first: it records triton.language before any kernel runs)
from .registry import (
    REGISTRY,
    VARIANTS,
    Variant,
    default_options,
    get,
    jit_kernels,
    kernel_names,
    launch_tiles,
    names,
    register,
    unregister,
)

__all__ = ["REGISTRY", "VARIANTS", "Variant", "default_options", "get", "jit_kernels", "kernel_names",
           "launch_tiles", "names", "register", "unregister"]
