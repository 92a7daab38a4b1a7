"""Ring attention on W processes against attention in one process (notebook 16 and the tests).

The workers here run inside ``processes.run_gloo``: every rank builds the same full q, k, v and dO from a seed,
takes its shard, runs ``ring_attention`` forward and backward, and compares its output and gradients with the
float64 attention of the whole sequence (torch's SDPA math in float64, autograd for the gradients), and with the
same step kernels run on the whole sequence in one process. They return plain numbers (errors, the calls the
ring made), so that a test or a notebook cell can read them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from flashattn import runtime
from flashattn.reference import rel_error

from . import layouts, steps
from .ring import ring_attention_with
from .sharding import shard, unshard

CASE = dict(B=2, Hq=2, Hkv=2, n_local=10, D=16, causal=False, layout="contiguous", kernels=None, dtype="float32",
            seed=0)
RESULTS = ("o", "dq", "dk", "dv")


def case(**settings) -> dict:
    """A case for :func:`ring_vs_single`: :data:`CASE` with ``settings`` over it."""
    unknown = sorted(set(settings) - set(CASE))
    if unknown:
        raise TypeError(f"unknown case settings {unknown}; accepted: {sorted(CASE)}")
    return {**CASE, **settings}


def inputs(c: dict, world_size: int, device=None):
    """The full q, k, v, dO of case ``c`` (the same on every rank: they come from its seed), on ``device`` (default
    the mode's: the GPU in GPU mode, the CPU in the interpreter and in ``run_gloo``'s processes)."""
    gen = torch.Generator().manual_seed(c["seed"])
    N, dtype = c["n_local"] * world_size, getattr(torch, c["dtype"])
    shapes = [(c["B"], c["Hq"], N, c["D"]), (c["B"], c["Hkv"], N, c["D"]), (c["B"], c["Hkv"], N, c["D"]),
              (c["B"], c["Hq"], N, c["D"])]
    device = runtime.DEVICE if device is None else device
    return [torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in shapes]


def reference_grads(q, k, v, do, causal):
    """Output and (dq, dk, dv) in float64, by torch's autograd through its SDPA (grouped heads: enable_gqa)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    o.backward(do.double())
    return [o.detach(), q64.grad, k64.grad, v64.grad]


class Recording:
    """Step kernels that run ``kernels`` and remember the (L, S, causal) of every forward call."""

    def __init__(self, kernels):
        self.inner, self.calls = steps.get(kernels), []

    def forward(self, q, k, v, *, causal, scale):
        self.calls.append((q.shape[2], k.shape[2], causal))
        return self.inner.forward(q, k, v, causal=causal, scale=scale)

    def kernels(self) -> steps.StepKernels:
        return steps.StepKernels(f"recording {self.inner.name}", self.forward, self.inner.backward,
                                 self.inner.head_dims)


def ring_vs_single(rank: int, world_size: int, cases: list[dict], single: bool = True) -> list[dict]:
    """For each case: this rank's errors of the ring's output and gradients against float64 attention on the whole
    sequence (``ring``), of ``unshard`` of them (``gathered``, the whole sequence on every rank), with ``single``
    of the same kernels on the whole sequence in one process (``single``), and the forward calls the ring made
    (``calls``)."""
    rows = []
    for c in cases:
        q, k, v, do = inputs(c, world_size)
        ref = reference_grads(q, k, v, do, c["causal"])
        local = [shard(t, 2, c["layout"]).requires_grad_() for t in (q, k, v)]
        recording = Recording(c["kernels"])
        o = ring_attention_with(recording.kernels(), *local, causal=c["causal"], layout=c["layout"])
        o.backward(shard(do, 2, c["layout"]))
        mine = [o.detach(), *(t.grad for t in local)]
        pairs = list(zip(RESULTS, mine, ref, strict=True))
        rows.append({
            "ring": {name: rel_error(x, shard(r, 2, c["layout"])) for name, x, r in pairs},
            "gathered": {name: rel_error(unshard(x, 2, c["layout"]), r) for name, x, r in pairs},
            "calls": recording.calls,
            "positions": layouts.positions(rank, world_size, c["n_local"], c["layout"]),
        })
        if single:
            one = steps.get(c["kernels"])
            o1, lse1 = one.forward(q, k, v, causal=c["causal"], scale=q.shape[-1] ** -0.5)
            grads1 = one.backward(q, k, v, o1, lse1, do, causal=c["causal"], scale=q.shape[-1] ** -0.5)
            rows[-1]["single"] = {name: rel_error(x, r) for name, x, r in zip(RESULTS, (o1, *grads1), ref,
                                                                              strict=True)}
    return rows


def suite(rank: int, world_size: int, cases: list[dict]) -> dict:
    """The tests' one run per world size: :func:`ring_vs_single` on ``cases`` (without the one-process kernels),
    then :func:`refusals`."""
    return {"cases": ring_vs_single(rank, world_size, cases, single=False), "refusals": refusals(rank, world_size)}


def _attempt(fn) -> tuple[str, str] | None:
    try:
        fn()
    except (TypeError, ValueError) as err:
        return type(err).__name__, str(err)
    return None


def refusals(rank: int, world_size: int) -> dict:
    """Bad inputs, some on one rank only: for each, the (error type, message) this rank raised (None: no error).
    Ends with a good call, to show that the group is still usable after the errors."""
    gen = torch.Generator().manual_seed(1)

    def qkv(n, H=2, D=16):
        return [torch.randn(1, H, n, D, generator=gen) for _ in range(3)]

    good = qkv(8)
    full = torch.randn(1, 2, 10, 16, generator=gen)
    out = {
        "lengths differ": _attempt(lambda: ring_attention_with(None, *qkv(8 if rank == 0 else 10))),
        "bad layout": _attempt(lambda: ring_attention_with(None, *good, layout="zig-zag")),
        "layout on one rank": _attempt(lambda: ring_attention_with(None, *good,
                                                                   layout="zigzag" if rank == 0 else "contiguous")),
        "causal on one rank": _attempt(lambda: ring_attention_with(None, *good, causal=rank == 0)),
        "odd zigzag shard": _attempt(lambda: ring_attention_with(None, *qkv(7), layout="zigzag")),
        "not a tensor on one rank": _attempt(lambda: ring_attention_with(
            None, good[0] if rank else good[0].tolist(), good[1], good[2])),
        "bfloat16": _attempt(lambda: ring_attention_with(None, *(t.bfloat16() for t in good))),
        "shard: N not divisible": _attempt(lambda: shard(full, 2, "zigzag")),
        "unshard: shapes differ": _attempt(lambda: unshard(torch.zeros(1, 2, 4 + rank, 16), 2)),
    }
    out["good call"] = list(ring_attention_with(None, *good).shape)
    return out


def fail_on_rank_one(rank: int, world_size: int) -> None:
    """Rank 1 raises while the others wait for it in a collective (what ``run_gloo`` must not hang on)."""
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.barrier()
