"""flashattn.kernels.launch_cache: a launch that skips Triton's per-call bookkeeping must never reuse a kernel
compiled for arguments that specialize it differently."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from flashattn import runtime
from flashattn.kernels import launch_cache
from flashattn.kernels.fast_backward import bwd_preprocess_fast

GPU = pytest.mark.skipif(runtime.MODE != "gpu", reason="needs a GPU")
DEVICE = "cuda" if runtime.MODE == "gpu" else "cpu"


def test_key_tells_apart_what_specializes_a_kernel():
    from triton.tools.tensor_descriptor import TensorDescriptor

    key = launch_cache._key
    base = torch.empty(64, dtype=torch.float16, device=DEVICE)
    assert key(base) != key(base[1:])  # 16-byte aligned or not
    assert key(base) != key(base.float())  # dtype
    assert key(16) != key(17) and key(1) != key(2) and key(True) != key(None)  # integers exactly
    assert key(0.5) == key(2.0)  # floats do not specialize
    rows = torch.empty(128, 64, dtype=torch.float16, device=DEVICE)
    desc = TensorDescriptor(rows, shape=[128, 64], strides=[64, 1], block_shape=[64, 64])
    assert key(desc) == key(TensorDescriptor(rows.clone(), shape=[128, 64], strides=[64, 1], block_shape=[64, 64]))
    assert key(desc) != key(TensorDescriptor(rows, shape=[128, 64], strides=[64, 1], block_shape=[32, 64]))
    assert key(desc) != key(TensorDescriptor(rows, shape=[64, 64], strides=[64, 1], block_shape=[64, 64]))


def _delta(o, do):
    return (o.float() * do.float()).sum(-1)


def _launch_preprocess(o, do, rows):
    """delta of (rows, 64) o and do, as one head of ``rows`` rows."""
    delta = torch.full((rows,), float("nan"), dtype=torch.float32, device=o.device)
    block = 64
    launch_cache.launch(bwd_preprocess_fast, ((rows + block - 1) // block, 1),
                        (o, do, delta, delta, 1, rows, 0, 0, o.stride(0), 0, 0, do.stride(0), 0, 0, 0),
                        dict(D=o.shape[-1], D_PAD=o.shape[-1], BLOCK=block, ZERO_DQ=False))
    return delta


def test_launch_matches_the_ordinary_launch_whatever_the_arguments():
    """Aligned and misaligned pointers, row counts divisible by 16 and not, in every order: each launch is right."""
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for rows, offset in ((32, 0), (17, 0), (32, 1), (17, 1), (32, 0), (1, 0), (17, 1)):
        flat_o, flat_do = (torch.randn(rows * 64 + 1, dtype=torch.float16, device=DEVICE, generator=gen)
                           for _ in range(2))
        o = flat_o[offset:offset + rows * 64].view(rows, 64)  # offset 1: two bytes past a 16-byte boundary
        do = flat_do[:rows * 64].view(rows, 64)
        got = _launch_preprocess(o, do, rows)
        torch.testing.assert_close(got, _delta(o, do), rtol=1e-3, atol=1e-3,
                                   msg=lambda m, rows=rows, offset=offset: f"rows={rows}, offset={offset}: {m}")


@GPU
def test_repeated_calls_reuse_one_entry_and_new_specializations_add_one():
    launch_cache._runners.clear()
    o, do = (torch.randn(32, 64, dtype=torch.float16, device="cuda") for _ in range(2))
    for _ in range(3):
        _launch_preprocess(o, do, 32)
    assert len(launch_cache._runners) == 1
    _launch_preprocess(o[:17], do[:17], 17)  # another row count: another entry
    misaligned = torch.randn(32 * 64 + 1, dtype=torch.float16, device="cuda")[1:].view(32, 64)
    torch.testing.assert_close(_launch_preprocess(misaligned, do, 32), _delta(misaligned, do), rtol=1e-3, atol=1e-3)
    assert len(launch_cache._runners) == 3


@GPU
def test_constexprs_that_do_not_match_the_kernel_raise():
    o = torch.randn(32, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(TypeError, match="BLOCK"):
        launch_cache.launch(bwd_preprocess_fast, (1, 1), (o, o, o, o, 1, 32, 0, 0, 64, 0, 0, 64, 0, 0, 0),
                            dict(D=64, D_PAD=64, BLOK=64, ZERO_DQ=False))


@triton.jit
def _fill(out, value, BLOCK: tl.constexpr, TWICE: tl.constexpr = False):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.full((BLOCK,), value, tl.float32) * (2.0 if TWICE else 1.0))


def test_a_parameter_left_to_its_default_is_refused_in_every_mode():
    """The compiled kernel is called with every parameter after the positional ones, so a launch must name each one,
    defaults included; checked in the interpreter and in a capture too (a decode launch once passed this only on the
    CPU, and every call of it failed on the GPU)."""
    out = torch.zeros(16, dtype=torch.float32, device=DEVICE)
    with pytest.raises(TypeError, match="takes BLOCK, TWICE; got BLOCK"):
        launch_cache.launch(_fill, (1,), (out, 3.0), dict(BLOCK=16))
    with launch_cache.capturing(), pytest.raises(TypeError, match="takes BLOCK, TWICE; got BLOCK"):
        launch_cache.launch(_fill, (1,), (out, 3.0), dict(BLOCK=16))
    run = launch_cache.bind(_fill, (1,), dict(BLOCK=16))
    with pytest.raises(TypeError, match="takes BLOCK, TWICE; got BLOCK"):
        run(out, 3.0)
    launch_cache.launch(_fill, (1,), (out, 3.0), dict(BLOCK=16, TWICE=True))
    assert torch.equal(out.cpu(), torch.full((16,), 6.0))
