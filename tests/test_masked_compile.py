"""The masked kernels (notebook 14) compiled for the GPU without one (``kernels.aot``), as the launches of
``flashattn.masking`` would compile them at their default tiles: what the interpreter cannot see (a GPU-only
compile error, shared memory past the target's limit, a register file that does not fit) fails here."""

import torch

from flashattn import masking, runtime
from flashattn.kernels import aot, launch_cache, mask_blocks, masked, masked_backward


def captured(run) -> list[tuple]:
    """The launches ``run()`` makes, recorded instead of run: (kernel, args, constexprs, options)."""
    with launch_cache.capturing() as found:
        run()
    return [(kernel, args, constexprs, options) for kernel, _, args, constexprs, options in found]


def launches(D: int, dtype=torch.float16) -> dict:
    """Every masked kernel once, as the forward and backward launch it for a GPU (its default tiles there)."""
    dev = runtime.DEVICE  # the launches are captured, not run, but the checks before them want this mode's tensors
    q, k, v, do = (torch.randn(1, 2, 256, D, dtype=dtype, device=dev) for _ in range(4))
    o, lse = torch.empty_like(q), torch.zeros(1, 2, 256, device=dev)
    cu = mask_blocks.cu_seqlens([100, 156], device=dev)
    packed = [t[0].transpose(0, 1) for t in (q, k, v, do, o)]
    mask = torch.rand(256, 256, device=dev) < 0.5
    cases = {
        "window": dict(causal=True, window=(63, 0)),
        "documents": dict(causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=156, max_seqlen_k=156),
        "attn_mask": dict(causal=True, attn_mask=mask.expand(1, 2, 256, 256)),
    }
    found = {}
    for name, kw in cases.items():
        args = packed[:3] if name == "documents" else (q, k, v)
        out = (packed[4], lse[0]) if name == "documents" else (o, lse)
        grad = packed[3] if name == "documents" else do
        fwd, dkdv, dq = masking.default_tiles(dtype, D, torch.bool if name == "attn_mask" else None, mode="gpu")
        runs = captured(lambda args=args, kw=kw, out=out, grad=grad, fwd=fwd, dkdv=dkdv, dq=dq: (
            masking.masked_forward(*args, tiles=fwd, **kw),
            masking.masked_backward(*args, *out, grad, dkdv_tiles=dkdv, dq_tiles=dq, **kw)))
        for kernel, a, c, options in runs:
            if kernel in (*masked.JIT_KERNELS, *masked_backward.JIT_KERNELS):  # not fast_backward's delta
                found.setdefault(f"{kernel.fn.__name__} ({name})", (kernel, a, c, options))
    return found


def test_every_masked_kernel_compiles_and_fits_on_sm90():
    """At D = 128, the largest tiles of the default configurations (compiling takes a few seconds a kernel)."""
    found = launches(128)
    assert {key.split()[0] for key in found} == {k.fn.__name__ for k in (*masked.JIT_KERNELS,
                                                                         *masked_backward.JIT_KERNELS)}
    for label, (kernel, args, constexprs, options) in found.items():
        result = aot.compile_for(kernel, args, constexprs, (9, 0), name=label, **options)
        assert result.error is None, f"{label}: {result.error}"
        assert result.fits, f"{label}: {result.verdict()}"
