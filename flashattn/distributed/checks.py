"""Checks that fail on every rank, never hang one (notebook 16).

A rank that raises before a collective leaves the others waiting in it forever (until the process group's
timeout, half an hour by default). So every check that may differ from rank to rank ends in one collective
that all ranks reach: each rank checks its own arguments, catching the error instead of raising it, then the
ranks exchange one small row of numbers (:func:`agree`: a failure flag and what must match: shapes, dtype,
flags); if any rank failed, they exchange the messages and every rank raises the same error; if the rows differ
(shards of different lengths, a layout given differently), every rank raises an error that lists them. Only
then does any point-to-point transfer start.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from flashattn.validate import KERNEL_DTYPES, check_attention_inputs

from . import layouts


def process_group(group, what: str) -> tuple[int, int]:
    """(rank, world size) of ``group`` (the default group if None), or a ValueError if there is none."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"{what}: no process group is initialised; call torch.distributed.init_process_group "
                         "on every rank first (backend 'nccl' for CUDA tensors, 'gloo' for CPU tensors)")
    return dist.get_rank(group), dist.get_world_size(group)


def _collective_device(group) -> torch.device:
    backend = str(dist.get_backend(group))
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def agree(group, what: str, error: Exception | None, row: list[float], names: list, hint: str = "") -> None:
    """Every rank passes its own ``error`` (None if its checks passed) and ``row`` (the numbers that must be equal
    on every rank, named by ``names``: a name, or (name, the values a number indexes)); raises the same error on
    every rank if any rank failed or the rows differ (``hint`` says then what to do). One all_gather of
    len(row) + 1 numbers when all is well."""
    world_size = dist.get_world_size(group)
    if error is None and len(row) != len(names):
        raise AssertionError(f"{what}: {len(row)} numbers for {len(names)} names")  # a bug here, not the caller's
    mine = torch.tensor([float(error is not None), *([0.0] * len(names) if error is not None else row)],
                        dtype=torch.float64, device=_collective_device(group))
    rows = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(rows, mine, group=group)
    rows = [r.tolist() for r in rows]
    failed = [r for r, values in enumerate(rows) if values[0]]
    if failed:
        messages = [None] * world_size
        dist.all_gather_object(messages, None if error is None else (type(error).__name__, str(error)), group=group)
        kinds = {messages[r][0] for r in failed}
        by_message = {}
        for r in failed:
            by_message.setdefault(messages[r][1], []).append(r)
        told = "; ".join(f"{_ranks(ranks, world_size)}: {message}" for message, ranks in by_message.items())
        raise (TypeError if kinds == {"TypeError"} else ValueError)(f"{what} refused its arguments (raised on every "
                                                                    f"rank) — {told}")
    names = [(n, None) if isinstance(n, str) else n for n in names]
    differ = [i for i in range(len(names)) if len({values[i + 1] for values in rows}) > 1]
    if differ:
        table = "; ".join(f"rank {r}: " + ", ".join(f"{names[i][0]} = {_show(values[i + 1], names[i][1])}"
                                                    for i in differ) for r, values in enumerate(rows))
        raise ValueError(f"{what}: every rank must give the same {', '.join(names[i][0] for i in differ)}, and they "
                         f"do not — {table}{'. ' + hint if hint else ''}")


def _ranks(ranks: list[int], world_size: int) -> str:
    if len(ranks) == world_size:
        return "on every rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _show(value: float, choices):
    if choices is not None and float(value).is_integer() and 0 <= value < len(choices):
        return choices[int(value)]
    return int(value) if float(value).is_integer() else value


DTYPES = (*KERNEL_DTYPES, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def dtype_code(dtype) -> int:
    """A number for ``dtype`` that two ranks can compare (its index in :data:`DTYPES`, or -1)."""
    return DTYPES.index(dtype) if dtype in DTYPES else -1


def _backend_refusal(t: torch.Tensor, group) -> str | None:
    backend = str(dist.get_backend(group))
    if t.device.type == "cuda" and "nccl" not in backend:
        return (f"the tensors are on {t.device} but the process group's backend is {backend!r}; CUDA tensors travel "
                "by NCCL: init_process_group('nccl')")
    if t.device.type == "cpu" and "gloo" not in backend:
        return (f"the tensors are on the CPU but the process group's backend is {backend!r}; CPU tensors travel by "
                "gloo: init_process_group('gloo')")
    return None


def check_ring_inputs(q, k, v, *, causal, scale, group, layout, head_dims) -> float:
    """Everything ``ring_attention`` needs, checked on every rank together (see the module docstring). Returns
    the scale (1/sqrt(D) if None)."""
    what = "ring_attention"
    process_group(group, what)
    error, row = None, []
    try:
        layouts.check_layout(layout)
        B, Hq, Hkv, L, S, D, scale = check_attention_inputs(q, k, v, variant=what, causal=causal, scale=scale,
                                                            head_dims=head_dims)
        if L != S:
            raise ValueError(f"q, k and v must be shards of one sequence, of one length n; got q {tuple(q.shape)}, "
                             f"k {tuple(k.shape)}")
        if layout == "zigzag" and L % 2:
            raise ValueError(f"the zigzag layout holds two chunks per rank, so the shard length must be even; got "
                             f"n={L} (shard the sequence with flashattn.distributed.shard, N a multiple of 2·W)")
        refusal = _backend_refusal(q, group)
        if refusal:
            raise ValueError(refusal)
        row = [B, Hq, Hkv, L, D, dtype_code(q.dtype), float(causal), layouts.LAYOUTS.index(layout), scale]
    except (TypeError, ValueError) as err:
        error = err
    agree(group, what, error, row, ["B", "query heads", "key/value heads", "shard length n", "head dimension D",
                                    ("dtype", DTYPES), ("causal", (False, True)), ("layout", layouts.LAYOUTS), "scale"],
          hint="Every rank holds a shard of the same length n = N / W of one sequence, and passes the same "
               "arguments; flashattn.distributed.shard cuts the shards")
    return scale


def check_dim(x, dim, what: str) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what}: x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"{what}: dim must be an integer in [-{x.dim()}, {x.dim()}) for a tensor of shape "
                         f"{tuple(x.shape)}, got {dim!r}")
    return dim % x.dim()
