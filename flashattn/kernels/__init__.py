"""Every attention variant of the course, by name. Each takes (q, k, v, *, causal, scale, **options)."""

import torch

from flashattn.validate import TILE_KEYS

from . import fast, naive, v1, v2
from .fast import attention_fast
from .naive import naive_attention
from .v1 import attention_v1
from .v2 import attention_v2, attention_v2_kt, attention_v2_kt_view, attention_v2_padded

VARIANTS = {
    "naive": naive_attention,
    "v1": attention_v1,
    "v2": attention_v2,
    "v2_kt": attention_v2_kt,
    "v2_kt_view": attention_v2_kt_view,
    "v2_padded": attention_v2_padded,
    "fast": attention_fast,
}

_DEFAULTS = {
    "naive": naive.default_options,
    "v1": v1.default_options,
    "v2": v2.default_options,
    "v2_kt": v2.default_options,
    "v2_kt_view": v2.default_options,
    "v2_padded": v2.padded_default_options,
    "fast": fast.default_options,
}


def default_options(variant: str, dtype, D: int, mode: str | None = None) -> dict:
    """The options ``variant`` uses when none are given, in ``mode`` ("gpu"/"interpreter"; default: current)."""
    if variant not in _DEFAULTS:
        raise ValueError(f"unknown variant {variant!r}; accepted: {', '.join(_DEFAULTS)}")
    return _DEFAULTS[variant](dtype, D, mode)


def launch_tiles(variant: str, dtype, D: int, mode: str | None = "gpu") -> dict:
    """Tile sizes, warps and stages ``variant`` launches with by default (on a GPU unless ``mode`` says
    otherwise); ``dtype`` a torch dtype or its name (``"float16"``)."""
    opts = default_options(variant, getattr(torch, dtype) if isinstance(dtype, str) else dtype, D, mode)
    return {k: opts[k] for k in TILE_KEYS}
