"""W gloo processes on this machine (notebook 16 and the tests): ``run_gloo(fn, world_size, *args)``.

Each process is a fresh Python (``torch.multiprocessing``'s spawn), joins a gloo process group on a free local
port, runs ``fn(rank, world_size, *args)`` and sends back what it returns. The processes run in interpreter mode
on the CPU whatever this machine has (gloo moves CPU tensors; one GPU cannot hold several NCCL ranks), with one
thread each. Nothing can hang the caller: a rank that raises stops them all and its traceback is raised here, and
a run that takes longer than ``timeout`` seconds is stopped and raises TimeoutError.

``fn`` must be importable by name (defined in a module, not in a notebook cell or ``__main__``): a spawned process
imports it afresh.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_module
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CHILD_ENV = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
GRACE_S = 3.0  # how long a process may be gone before its result must have arrived


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, fn, args, results, timeout):
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        results.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:  # noqa: BLE001  (everything goes back to the caller, which raises it)
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _stop(processes) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


def run_gloo(fn, world_size: int, *args, timeout: float = 120.0) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes of one gloo group; returns their
    results in rank order. Return plain values (numbers, strings, lists, dicts): a tensor sent from a process
    that exits at once may not arrive (``tensor.tolist()`` it)."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not callable(fn) or getattr(fn, "__module__", "__main__") == "__main__" or "<locals>" in fn.__qualname__:
        raise ValueError(f"run_gloo starts new Python processes, which import fn by name: define {fn!r} at the top "
                         "level of a module (not in a notebook cell, __main__ or another function)")
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    saved = {key: os.environ.get(key) for key in CHILD_ENV}
    os.environ.update(CHILD_ENV)  # inherited by the children as they start
    try:
        processes = [context.Process(target=_entry, args=(rank, world_size, port, fn, args, results, timeout),
                                     daemon=True) for rank in range(world_size)]
        for p in processes:
            p.start()
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    done, gone_since = {}, {}
    deadline = time.monotonic() + timeout
    try:
        while len(done) < world_size:
            if time.monotonic() > deadline:
                missing = sorted(set(range(world_size)) - set(done))
                raise TimeoutError(f"run_gloo: rank(s) {missing} of {world_size} did not finish within {timeout} s "
                                   "(a collective waiting for a rank that never came?); the processes were stopped")
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue_module.Empty:
                for rank, p in enumerate(processes):
                    if rank not in done and p.exitcode is not None:
                        if time.monotonic() - gone_since.setdefault(rank, time.monotonic()) > GRACE_S:
                            raise RuntimeError(f"run_gloo: rank {rank} of {world_size} exited with code {p.exitcode} "
                                               "without a result") from None
                continue
            if not ok:
                raise RuntimeError(f"run_gloo: rank {rank} of {world_size} raised:\n{value}")
            done[rank] = value
        for p in processes:
            p.join(10)
    finally:
        _stop(processes)
        results.close()
    return [done[rank] for rank in range(world_size)]
