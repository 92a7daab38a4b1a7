"""FlashAttention in Triton, a course: the package every notebook imports.

``runtime`` is imported first: it sets TRITON_INTERPRET=1 when there is no GPU, and Triton reads
that variable when each kernel's ``@triton.jit`` runs.
"""

from . import runtime  # noqa: I001  (must come before the kernels)
from .kernels import VARIANTS
from .reference import reference
from .runtime import describe

__all__ = ["VARIANTS", "attention", "describe", "reference", "runtime"]


def attention(q, k, v, *, variant: str = "v2", causal: bool = False, scale=None, **options):
    """Run one variant by name: ``attention(q, k, v, variant="v1", causal=True)``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; accepted: {', '.join(VARIANTS)}")
    return VARIANTS[variant](q, k, v, causal=causal, scale=scale, **options)
