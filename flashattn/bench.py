"""Timing and throughput.

FLOP convention (the one FlashAttention papers use): a forward pass does two matrix products of
2·N·N·D multiply-adds per (batch, head), so 4·B·H·N²·D FLOP; causal attention does half of that.
Times are medians of ``triton.testing.do_bench`` (GPU only).
"""

from __future__ import annotations

import torch

from . import runtime


def attention_flops(B: int, H: int, N: int, D: int, causal: bool = False) -> float:
    flops = 4.0 * B * H * N * N * D
    return flops / 2 if causal else flops


def tflops(B: int, H: int, N: int, D: int, ms: float, causal: bool = False) -> float:
    return attention_flops(B, H, N, D, causal) / (ms * 1e-3) / 1e12


def time_ms(fn, *, warmup: int = 25, rep: int = 100) -> float:
    """Median time of ``fn()`` in milliseconds, by ``triton.testing.do_bench`` (needs a GPU)."""
    if runtime.MODE != "gpu":
        raise RuntimeError(
            "live timings need a GPU: in interpreter mode the course shows the recorded results "
            "(flashattn.recorded) instead"
        )
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def sdpa(q, k, v, *, causal=False, scale=None):
    """PyTorch's own attention, the baseline every kernel is compared with."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def peak_memory(fn) -> int:
    """Peak bytes allocated on the GPU while ``fn()`` runs, above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before
