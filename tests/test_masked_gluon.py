"""A causal sliding window through fast's Gluon kernel (``fast_gluon.py`` with WINDOW, Hopper only): which calls
take it (on any machine), and on a Hopper GPU its output, log-sum-exp and gradients against float64."""

import pytest
import torch
from helpers import TOL, rel_error
from test_backward import grad_errors
from test_masked import torch_reference

import flashattn
from flashattn import masking, runtime
from flashattn.kernels import fast_options
from flashattn.kernels import mask_blocks as mb

HOPPER = pytest.mark.skipif(not fast_options.gluon_available(torch.float16, 64),
                            reason="needs a Hopper GPU and Triton's Gluon")


def test_which_windows_take_the_gluon_kernel(monkeypatch):
    """Only a causal window (left >= 0, right 0) over as many keys as queries, one K/V head per query head, inputs
    the kernel reads in place, no explicit tiles and no counts; everything else takes the Triton window kernel."""
    monkeypatch.setattr(masking, "gluon_available", lambda dtype, D: True)
    q = torch.randn(2, 4, 64, 64, dtype=torch.float16)
    window = masking.Spec(31, 0, True)
    assert masking.takes_gluon_window(q, q, q, window, None, None)
    assert masking.takes_gluon_window(q, q, q, masking.Spec(31, 0, False), None, None)  # (left, 0): the same mask
    wide = torch.randn(2, 4, 64, 128, dtype=torch.float16)[..., :64]  # rows 256 bytes apart: no layout it reads
    cu = torch.tensor([0, 64], dtype=torch.int32)
    for why, args in (("explicit tiles", (q, q, q, window, (64, 64, 4, 3), None)),
                      ("counts asked for", (q, q, q, window, None, {})),
                      ("no window (fast's causal)", (q, q, q, masking.Spec(-1, 0, True), None, None)),
                      ("a right side", (q, q, q, masking.Spec(31, 5, False), None, None)),
                      ("grouped K/V heads", (q, q[:, :2], q[:, :2], window, None, None)),
                      ("fewer keys than queries", (q, q[:, :, :32], q[:, :, :32], window, None, None)),
                      ("an input it cannot read in place", (wide, q, q, window, None, None)),
                      ("packed documents", (q, q, q, masking.Spec(31, 0, True, cu, cu, 64, 64), None, None)),
                      ("a dense mask", (q, q, q, masking.Spec(-1, -1, True, mask=torch.ones(2, 4, 64, 64) > 0),
                                        None, None))):
        assert not masking.takes_gluon_window(*args), why
    monkeypatch.setattr(masking, "gluon_available", lambda dtype, D: False)
    assert not masking.takes_gluon_window(q, q, q, window, None, None)


def _spy(monkeypatch) -> list:
    """The ``left`` of every Gluon window launch masking binds (once per problem; none bound or prepared before the
    test)."""
    from flashattn.kernels import fast_gluon

    calls, bind = [], fast_gluon.bind
    monkeypatch.setattr(masking, "_GLUON_RUNS", {})
    monkeypatch.setattr(masking, "_FORWARD_RUNS", {})
    monkeypatch.setattr(fast_gluon, "bind", lambda *a, **kw: calls.append(kw.get("left")) or bind(*a, **kw))
    return calls


@HOPPER
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gluon_window_against_float64(dtype, D, monkeypatch):
    """Odd lengths (1, 17, 100, 1000), windows from one key (left 0) to wider than the sequence, B and H > 1."""
    calls = _spy(monkeypatch)
    gen = torch.Generator().manual_seed(D)
    cases = [(N, left) for N in (1, 17, 100, 1000) for left in (0, 1, 63, 64, 255, 2000)]
    for N, left in cases:
        q, k, v = (torch.randn(2, 3, N, D, generator=gen).to(runtime.DEVICE, dtype) for _ in range(3))
        o, lse = masking.masked_forward(q, k, v, causal=True, window=(left, 0))
        keep = mb.window_mask(N, N, (left, 0), True, device=q.device)
        s = (q.double() @ k.double().transpose(-1, -2) * D ** -0.5).masked_fill(~keep, float("-inf"))
        assert rel_error(o, (torch.softmax(s, -1) @ v.double()).to(dtype)) < TOL[dtype], (N, left)
        assert rel_error(lse, torch.logsumexp(s, -1).float()) < 1e-5, (N, left)
    # one bind per problem; a window wider than the sequence goes as its length (so it is the same problem)
    problems = list(dict.fromkeys((N, min(left, N)) for N, left in cases))
    assert calls == [left for _, left in problems]


@HOPPER
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gluon_window_gradients_at_full_size(dtype, monkeypatch):
    """``flashattn.attention(..., window=...)`` forward (Gluon) and backward (the Triton window kernels, from the
    Gluon forward's log-sum-exp), N = 4096 with a window of 1000 keys, and (B, N, H, D) inputs seen through
    ``transpose`` (read in place)."""
    calls = _spy(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 4096, 4, 128, generator=gen).to(runtime.DEVICE, dtype).transpose(1, 2)
                   for _ in range(4))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flashattn.attention(*leaves, variant="fast", causal=True, window=(999, 0))
    out.backward(do)
    ref_out, ref_grads = torch_reference(q, k, v, do, mb.window_mask(4096, 4096, (999, 0), True, device=q.device))
    assert calls == [999]
    assert rel_error(out, ref_out.to(dtype)) < TOL[dtype]
    assert max(grad_errors([t.grad for t in leaves], ref_grads)) < TOL[dtype]


@HOPPER
def test_a_bound_window_launch_serves_new_tensors_of_its_problem(monkeypatch):
    """The second call of a problem launches the launch bound by the first (no new bind) on its own tensors: its
    output is its inputs' attention, not the first call's; another window is another problem."""
    calls = _spy(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    N, D, dtype = 777, 64, torch.float16
    keep = mb.window_mask(N, N, (100, 0), True, device=runtime.DEVICE)
    for _ in range(3):
        q, k, v = (torch.randn(2, 3, N, D, generator=gen).to(runtime.DEVICE, dtype) for _ in range(3))
        o, lse = masking.masked_forward(q, k, v, causal=True, window=(100, 0))
        s = (q.double() @ k.double().transpose(-1, -2) * D ** -0.5).masked_fill(~keep, float("-inf"))
        assert rel_error(o, (torch.softmax(s, -1) @ v.double()).to(dtype)) < TOL[dtype]
        assert rel_error(lse, torch.logsumexp(s, -1).float()) < 1e-5
    assert calls == [100]
    masking.masked_forward(q, k, v, causal=True, window=(101, 0))
    assert calls == [100, 101]
