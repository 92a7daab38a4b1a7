"""Attention across devices (notebook 16): ring attention over ``torch.distributed``, NCCL on GPUs, gloo on CPUs.

* ``ring_attention(q, k, v, *, causal=False, scale=None, group=None, layout="contiguous")``: this rank's shard of
  the queries against the whole sequence, forward and backward (``ring.py``; ``simulate_attention`` runs the same
  steps for W ranks in one process);
* ``shard(x, dim, layout, group=None)`` and ``unshard(x, dim, layout, group=None)``: this rank's shard of a full
  tensor, and the full tensor back (``sharding.py``);
* the layouts and each rank's plan of steps (``layouts.py``), the per-step kernels and the merge (``steps.py``),
  the checks that fail on every rank (``checks.py``), W gloo processes on one machine (``processes.py``) and the
  workers that compare every rank with one process (``compare.py``).
"""

from .layouts import LAYOUTS, Step, key_blocks, plan_key_blocks, positions, schedule, step_plan
from .ring import ring_attention, ring_attention_with, simulate, simulate_attention
from .sharding import shard, unshard
from .steps import KERNELS, merge_partial

__all__ = ["KERNELS", "LAYOUTS", "Step", "key_blocks", "merge_partial", "plan_key_blocks", "positions",
           "ring_attention", "ring_attention_with", "schedule", "shard", "simulate", "simulate_attention",
           "step_plan", "unshard"]
