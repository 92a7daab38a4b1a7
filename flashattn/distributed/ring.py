"""Ring attention over ``torch.distributed`` (notebook 16): forward and backward, one rank's side.

Each rank holds a shard (B, H, n, D) of q, k and v along the sequence. The forward runs W steps; at step s the
rank attends its queries to the K/V shard of rank (r − s) mod W, with the course's kernel returning the
log-sum-exp, and merges the partial output into its running output (``steps.merge_partial``, float32). Before
computing, it hands the K/V shard it holds to the next rank and receives the previous rank's
(``dist.batch_isend_irecv``), so the transfer runs while the kernel does. Only the Hkv heads of K and V travel.

The backward runs the ring again. It recomputes each step from the saved *global* output and log-sum-exp
(never an N×N tensor), keeps dQ at home, and sends a float32 dK/dV accumulator around the ring behind the K/V
shard it belongs to: at each step a rank adds its share of the gradient of the shard it holds and passes the
accumulator on, overlapping the next step; after W hops every accumulator is back with its shard's owner
(FlashAttention's ring backward, as ring-flash-attention writes it).

Both passes are written once, as generators (:func:`forward_steps`, :func:`backward_steps`) that *yield* their
communication: ``Start(channel, tensors)`` (send these to the next rank, receive the same shapes from the
previous one) and ``Finish(channel)`` (wait; the received tensors come back). :func:`run_p2p` drives one rank's
generator over a process group; :func:`simulate` drives the W ranks' generators in one process in lock step,
with copies for transfers (the measurement of notebook 16 checks one GPU's steps at full size that way).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from . import layouts, steps
from .checks import check_ring_inputs

KV, DKV = "kv", "dkv"  # the channels: K/V shards (both passes), dK/dV accumulators (backward)
TAGS = {KV: 0, DKV: 1}  # gloo matches messages by tag (NCCL by order; both orders agree on every rank)


class Start(NamedTuple):
    channel: str
    tensors: tuple


class Finish(NamedTuple):
    channel: str


def _rows(t: torch.Tensor, sl: slice) -> torch.Tensor:
    return t if sl.start == 0 and sl.stop == t.shape[2] else t[:, :, sl]


def forward_steps(q, k, v, plan, scale, kernels: steps.StepKernels):
    """One rank's forward over its ``plan`` (``layouts.step_plan``); returns the float32 output and lse."""
    kv, o, lse = (k, v), None, None
    for s, step in enumerate(plan):
        more = s + 1 < len(plan)
        if more:
            yield Start(KV, kv)  # pass on the shard we hold while we compute with it
        if step.computes:
            o_s, lse_s = kernels.forward(_rows(q, step.q), _rows(kv[0], step.kv), _rows(kv[1], step.kv),
                                         causal=step.causal, scale=scale)
            if o is None:  # the first step is the rank's own shard: every row
                o, lse = o_s.float(), lse_s.float()
            else:
                o[:, :, step.q], lse[:, :, step.q] = steps.merge_partial(_rows(o, step.q), _rows(lse, step.q),
                                                                         o_s, lse_s)
        if more:
            kv = yield Finish(KV)
    return o, lse


def backward_steps(q, k, v, o, lse, do, plan, scale, kernels: steps.StepKernels):
    """One rank's backward: returns (dq, dk, dv) in float32, dk and dv those of the rank's own K/V shard."""
    world_size = len(plan)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv, dkv = (k, v), None
    for s, step in enumerate(plan):
        more = s + 1 < world_size
        if more:
            yield Start(KV, kv)
        if step.computes:
            dq_s, dk_s, dv_s = kernels.backward(_rows(q, step.q), _rows(kv[0], step.kv), _rows(kv[1], step.kv),
                                                _rows(o, step.q), _rows(lse, step.q), _rows(do, step.q),
                                                causal=step.causal, scale=scale)
            dq[:, :, step.q] += dq_s
        if s == 0 and step.computes and step.kv == slice(0, k.shape[2]):
            dkv = (dk_s.float(), dv_s.float())  # step 0: our own shard, every key
        else:
            if s > 0:  # the accumulator of the shard we hold now, sent by the previous rank one step ago
                dkv = yield Finish(DKV)
            else:
                dkv = tuple(torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in (k, v))
            if step.computes:
                dkv[0][:, :, step.kv] += dk_s
                dkv[1][:, :, step.kv] += dv_s
        if more:
            kv = yield Finish(KV)
        if world_size > 1:
            yield Start(DKV, dkv)  # on to the next rank, behind the K/V shard it belongs to
    if world_size > 1:
        dkv = yield Finish(DKV)  # the W-th hop: our own shard's accumulator comes home
    return dq, dkv[0], dkv[1]


class Ring:
    """The ring of a process group, as seen from this rank: who is next, who is previous (global ranks)."""

    def __init__(self, group=None):
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        self.next, self.previous = (to_global((self.rank + d) % self.world_size) for d in (1, -1))


def run_p2p(generator, ring: Ring):
    """Drive one rank's generator: ``Start`` posts the sends to the next rank and the receives from the previous one
    as one batch (``dist.batch_isend_irecv``) and goes on at once; ``Finish`` waits and hands the received tensors in.
    Returns the generator's result."""
    pending = {}
    try:
        event = next(generator)
        while True:
            if isinstance(event, Start):
                sent = tuple(t.contiguous() for t in event.tensors)
                received = tuple(torch.empty_like(t) for t in sent)
                tag = TAGS[event.channel]
                ops = ([dist.P2POp(dist.isend, t, ring.next, ring.group, tag) for t in sent]
                       + [dist.P2POp(dist.irecv, t, ring.previous, ring.group, tag) for t in received])
                pending[event.channel] = (dist.batch_isend_irecv(ops), received, sent)
                event = generator.send(None)
            else:
                requests, received, _ = pending.pop(event.channel)
                for request in requests:
                    request.wait()
                event = generator.send(received)
    except StopIteration as stop:
        return stop.value


def simulate(generators: list) -> list:
    """Drive the W ranks' generators in one process, in lock step; a transfer is a copy from rank r − 1 to rank r.
    Returns each rank's result."""
    W = len(generators)
    results, pending = [None] * W, {}
    replies, events = [None] * W, [None] * W  # send(None) starts a generator, and answers a Start
    while True:
        finished = 0
        for r, g in enumerate(generators):
            try:
                events[r] = g.send(replies[r])
            except StopIteration as stop:
                results[r], events[r] = stop.value, None
                finished += 1
        if finished == W:
            return results
        kinds = {"done" if e is None else f"{type(e).__name__}:{e.channel}" for e in events}
        if len(kinds) != 1:
            raise RuntimeError(f"the ranks' steps went out of lock step: {sorted(kinds)}")
        if isinstance(events[0], Start):
            pending[events[0].channel] = [e.tensors for e in events]
            replies = [None] * W
        else:
            sent = pending.pop(events[0].channel)
            replies = [tuple(t.clone() for t in sent[(r - 1) % W]) for r in range(W)]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, ring, layout, kernels):
        plan = layouts.step_plan(ring.rank, ring.world_size, q.shape[2], causal=causal, layout=layout)
        o, lse = run_p2p(forward_steps(q, k, v, plan, scale, kernels), ring)
        o = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.plan, ctx.scale, ctx.ring, ctx.kernels = plan, scale, ring, kernels
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = run_p2p(backward_steps(q, k, v, o, lse, do.contiguous(), ctx.plan, ctx.scale, ctx.kernels),
                             ctx.ring)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


def ring_attention_with(kernels, q, k, v, *, causal=False, scale=None, group=None, layout="contiguous"):
    """:func:`ring_attention` with a choice of step kernels: ``"fast"``, ``"teaching"``, a ``steps.StepKernels`` or
    None (the mode's default, ``steps.default_kernels``). The tests run both sets in the interpreter."""
    step_kernels = steps.get(kernels)
    scale = check_ring_inputs(q, k, v, causal=causal, scale=scale, group=group, layout=layout,
                              head_dims=step_kernels.head_dims)
    ring = Ring(group)
    q, k, v = (t.contiguous() for t in (q, k, v))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _RingAttention.apply(q, k, v, causal, scale, ring, layout, step_kernels)
    plan = layouts.step_plan(ring.rank, ring.world_size, q.shape[2], causal=causal, layout=layout)
    return run_p2p(forward_steps(q, k, v, plan, scale, step_kernels), ring)[0].to(q.dtype)


def ring_attention(q, k, v, *, causal=False, scale=None, group=None, layout="contiguous"):
    """Attention of this rank's shard of the queries against the whole sequence's keys, by ring attention.

    q (B, Hq, n, D), k and v (B, Hkv, n, D): this rank's shards of sequences split along N over the ranks of
    ``group`` (the default group if None) in ``layout`` (``"contiguous"`` or ``"zigzag"``, see ``shard``);
    Hq a multiple of Hkv (grouped-query attention: only the Hkv heads travel). ``causal`` as torch's ``is_causal``
    on the *whole* sequence (position i sees positions j <= i); ``scale`` defaults to 1/sqrt(D). Returns this
    rank's shard of the output, differentiable with respect to q, k and v. Every rank of the group must call it
    with shards of one shape, dtype and the same arguments: a mismatch raises an error on every rank (checked by
    one small all_gather before any transfer), never a hang.
    """
    return ring_attention_with(None, q, k, v, causal=causal, scale=scale, group=group, layout=layout)


def simulate_attention(q, k, v, world_size: int, *, causal=False, scale=None, layout="contiguous", kernels=None,
                       do=None):
    """The ring on ``world_size`` simulated ranks in this process (:func:`simulate`): full q (B, Hq, N, D), k, v
    (B, Hkv, N, D) are sharded as ``layout`` says, every rank's forward (and, given ``do``, backward) runs its
    steps, transfers are copies. Returns the output and, with ``do``, (dq, dk, dv), in sequence order, gathered
    from the ranks' shards."""
    step_kernels = steps.get(kernels)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    shards = [[layouts.local_rows(t, r, world_size, layout) for t in (q, k, v)] for r in range(world_size)]
    n = shards[0][0].shape[2]
    plans = [layouts.step_plan(r, world_size, n, causal=causal, layout=layout) for r in range(world_size)]
    results = simulate([forward_steps(*shards[r], plans[r], scale, step_kernels) for r in range(world_size)])
    outs = [o.to(q.dtype) for o, _ in results]
    o = layouts.gather_rows(outs, layout)
    if do is None:
        return o
    grads = simulate([backward_steps(*shards[r], outs[r], results[r][1], layouts.local_rows(do, r, world_size, layout),
                                     plans[r], scale, step_kernels) for r in range(world_size)])
    return o, tuple(layouts.gather_rows([g[i].to(t.dtype) for g in grads], layout) for i, t in enumerate((q, k, v)))
