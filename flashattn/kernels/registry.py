"""The registry of attention variants: one record per variant, from which every list of variants is derived.

``VARIANTS`` (name → function), ``default_options``, ``launch_tiles``, the variants the bench table
times, the kernels compiled facts and Nsight Compute look for, the plots' colours and labels, and the
variants the traffic model covers all read these records. Adding a variant is its kernel file and one
``register(Variant(...))`` call at the end of this file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashattn.validate import TILE_KEYS

from . import backward, fast, fast_backward, naive, v1, v2

# Which formula of ``flashattn.traffic.hbm_bytes`` a variant's global-memory requests follow.
TRAFFIC_FORMULAS = (
    "naive",  # three kernels, S and P through HBM
    "v1",  # K/V outer loop: O, l and m re-read and re-written per K/V block
    "v2",  # one program per Q block: Q once, K and V once per Q block, O once
    "v2_kt",  # as v2, plus a transposed copy of K made on the host
)


@dataclass(frozen=True)
class Variant:
    """One attention variant of the course.

    ``fn(q, k, v, *, causal=False, scale=None, **options)`` computes it; ``default_options(dtype, D,
    mode)`` gives the options it uses when none are given; ``jit_kernels`` are the ``@triton.jit``
    functions a call may compile and launch (in launch order), ``launches`` how many kernels one call
    launches; ``color`` and ``label`` (default: the name) are what plots draw it with; ``notebooks``
    the notebooks that teach it ("05"); ``traffic`` the formula of the traffic model its requests follow
    (one of ``TRAFFIC_FORMULAS``, or None: not modelled); ``in_bench``: timed by ``python -m
    flashattn.bench`` by default; ``backward``: the function computing its gradients, or None.
    """

    name: str
    fn: Callable
    default_options: Callable
    jit_kernels: tuple
    color: str
    notebooks: tuple[str, ...]
    traffic: str | None = None
    in_bench: bool = False
    launches: int = 1
    label: str = ""
    backward: Callable | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a variant's name must be an identifier such as 'v2_kt', got {self.name!r}")
        for field in ("fn", "default_options"):
            if not callable(getattr(self, field)):
                raise TypeError(f"variant {self.name!r}: {field} must be callable, got {getattr(self, field)!r}")
        if not isinstance(self.jit_kernels, tuple) or not self.jit_kernels:
            raise ValueError(f"variant {self.name!r}: jit_kernels must be a non-empty tuple of @triton.jit functions")
        if not isinstance(self.color, str) or not re.fullmatch(r"#[0-9a-fA-F]{6}", self.color):
            raise ValueError(f"variant {self.name!r}: color must be '#rrggbb', got {self.color!r}")
        if not self.notebooks or not all(isinstance(n, str) and re.fullmatch(r"\d\d", n) for n in self.notebooks):
            raise ValueError(f"variant {self.name!r}: notebooks must name two-digit notebooks ('05'), "
                             f"got {self.notebooks!r}")
        if self.traffic not in (*TRAFFIC_FORMULAS, None):
            raise ValueError(f"variant {self.name!r}: traffic must be one of {TRAFFIC_FORMULAS} or None, "
                             f"got {self.traffic!r}")
        if isinstance(self.launches, bool) or not isinstance(self.launches, int) or self.launches < 1:
            raise ValueError(f"variant {self.name!r}: launches must be a positive int, got {self.launches!r}")
        if self.backward is not None and not callable(self.backward):
            raise TypeError(f"variant {self.name!r}: backward must be callable or None")
        if not self.label:
            object.__setattr__(self, "label", self.name)


REGISTRY: dict[str, Variant] = {}
VARIANTS: dict[str, Callable] = {}  # name -> function; flashattn.VARIANTS is this dict


def register(variant: Variant) -> Variant:
    """Add ``variant``; its name must be new (``unregister`` it first to replace it)."""
    if not isinstance(variant, Variant):
        raise TypeError(f"register takes a Variant, got {type(variant).__name__}")
    if variant.name in REGISTRY:
        raise ValueError(f"variant {variant.name!r} is already registered")
    REGISTRY[variant.name] = variant
    VARIANTS[variant.name] = variant.fn
    return variant


def unregister(name: str) -> Variant:
    """Remove the variant ``name`` and return its record."""
    record = get(name)
    del REGISTRY[name], VARIANTS[name]
    return record


def get(name: str) -> Variant:
    """The record of the variant ``name`` (ValueError naming the registered ones otherwise)."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"unknown variant {name!r}; accepted: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def names(*, traffic: bool | None = None, bench: bool | None = None, notebook: str | None = None) -> list[str]:
    """Registered names in registration order: all of them, or those with (``traffic=True``) or without a
    traffic formula, those timed by the bench table by default (``bench=True``), those a notebook teaches."""
    return [v.name for v in REGISTRY.values()
            if (traffic is None or (v.traffic is not None) == traffic)
            and (bench is None or v.in_bench == bench)
            and (notebook is None or notebook in v.notebooks)]


def default_options(variant: str, dtype, D: int, mode: str | None = None) -> dict:
    """The options ``variant`` uses when none are given, in ``mode`` ("gpu"/"interpreter"; default: current)."""
    return get(variant).default_options(dtype, D, mode)


def launch_tiles(variant: str, dtype, D: int, mode: str | None = "gpu") -> dict:
    """Tile sizes, warps and stages ``variant`` launches with by default (on a GPU unless ``mode`` says
    otherwise); ``dtype`` a torch dtype or its name (``"float16"``)."""
    opts = default_options(variant, getattr(torch, dtype) if isinstance(dtype, str) else dtype, D, mode)
    return {k: opts[k] for k in TILE_KEYS}


def jit_kernels(variant: str) -> list:
    """The ``@triton.jit`` functions of ``variant``, unwrapped from any ``triton.autotune``/``heuristics``
    (a ``JITFunction`` on a GPU, an ``InterpretedFunction`` in interpreter mode)."""
    from .triton_compat import Autotuner, Heuristics

    out = []
    for kernel in get(variant).jit_kernels:
        while isinstance(kernel, (Autotuner, Heuristics)):
            kernel = kernel.fn
        out.append(kernel)
    return out


def kernel_names(variant: str) -> tuple[str, ...]:
    """The names of ``variant``'s kernels, as a profiler shows them (naive: three; v2: one)."""
    return tuple(kernel.fn.__name__ for kernel in jit_kernels(variant))


# --- the course's variants ------------------------------------------------------------------------

register(Variant("naive", naive.naive_attention, naive.default_options,
                 (naive.scores_kernel, naive.softmax_kernel, naive.pv_kernel), "#7f7f7f", ("02",),
                 traffic="naive", launches=3))
register(Variant("v1", v1.attention_v1, v1.default_options, (v1.attn_kernel_v1,), "#d62728", ("04",),
                 traffic="v1"))
register(Variant("v2", v2.attention_v2, v2.default_options, (v2.attn_kernel_v2,), "#1f77b4", ("05", "06"),
                 traffic="v2", in_bench=True, backward=backward.attention_backward))
register(Variant("v2_kt", v2.attention_v2_kt, v2.default_options, (v2.attn_kernel_v2,), "#2ca02c", ("06",),
                 traffic="v2_kt"))
register(Variant("v2_kt_view", v2.attention_v2_kt_view, v2.default_options, (v2.attn_kernel_v2,), "#17becf",
                 ("06",), traffic="v2"))
register(Variant("v2_padded", v2.attention_v2_padded, v2.padded_default_options, (v2.attn_kernel_v2,), "#9467bd",
                 ("06",), traffic="v2"))
register(Variant("fast", fast.attention_fast, fast.default_options, tuple(fast.JIT_KERNELS), "#ff7f0e",
                 ("10",), in_bench=True, backward=fast_backward.attention_backward_fast))
