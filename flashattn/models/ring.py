"""A model of ring attention's time on W devices (notebook 16), from one device's measured step times.

This is a model, not a measurement: it adds up kernel times measured on one GPU, step by step, and assumes that
each transfer runs behind the step it overlaps with (as ``flashattn.distributed.ring`` issues them) at a given
link bandwidth, with a fixed latency per transfer. What it leaves out: the copy engines and the link competing
with the kernels for memory bandwidth, the kernels slowing down when they share the GPU with a transfer, NCCL's
own scheduling, clocks. Issue 33's run on several GPUs measures the real thing.

Per step s the slowest rank sets the pace (a rank cannot start step s + 1 before the previous rank's shard has
arrived): c_s = max over ranks of (the step's kernel + its merge). With t_kv the time to pass a K/V shard on and
t_dkv that of a float32 dK/dV accumulator:

    forward   T = Σ_{s < W−1} max(c_s, t_kv) + c_{W−1}
    backward  T = max(c_0, t_kv) + Σ_{0 < s < W−1} max(c_s, t_kv + t_dkv) + max(c_{W−1}, t_dkv) + t_dkv

(in the backward the link carries the next K/V shard and the previous step's accumulator during a step; the last
accumulator hop runs after the last step). Scaling efficiency, as ring-flash-attention measures it: the time of
the whole problem on one GPU divided by W times the time on W GPUs.
"""

from __future__ import annotations

from flashattn.distributed import layouts

# Link bandwidths per direction (bytes/s) for the model, with where each number comes from.
LINKS = {
    "NVLink (H200 SXM)": (450e9, "NVIDIA H200 datasheet: NVLink 900 GB/s, counted both ways; 450 GB/s each way"),
    "PCIe 5.0 x16": (63e9, "PCIe 5.0: 32 GT/s per lane, 16 lanes, 128b/130b coding: about 63 GB/s each way"),
}
LATENCY_S = 20e-6  # per transfer: an assumption of the model (NCCL point-to-point latency is of order 10 µs)


def transfer_s(nbytes: float, link_bytes_per_s: float, latency_s: float = LATENCY_S) -> float:
    return latency_s + nbytes / link_bytes_per_s


def shard_bytes(B: int, Hkv: int, n_local: int, D: int, dtype_bytes: int) -> float:
    """Bytes of one K/V shard (K and V): what each step passes on."""
    return 2.0 * B * Hkv * n_local * D * dtype_bytes


def step_compute(world_size: int, layout: str, causal: bool, kernel_ms: dict, merge_ms: dict | None = None,
                 n_local: int = 2) -> list[float]:
    """c_s for each step: the slowest rank's kernel (``kernel_ms[kind]``, the kinds of ``layouts.step_plan``) plus
    its merge (``merge_ms["all rows"]`` or ``["half rows"]``, from the second step on), in ms."""
    merge_ms = merge_ms or {}
    plans = [layouts.step_plan(r, world_size, n_local, causal=causal, layout=layout) for r in range(world_size)]
    out = []
    for s in range(world_size):
        per_rank = []
        for plan in plans:
            st = plan[s]
            if not st.computes:
                per_rank.append(0.0)
                continue
            merge = 0.0
            if s > 0:
                merge = merge_ms.get("half rows" if layouts.rows(st.q) < n_local else "all rows", 0.0)
            per_rank.append(kernel_ms[st.kind] + merge)
        out.append(max(per_rank))
    return out


def forward_ms(compute: list[float], t_kv_ms: float) -> float:
    W = len(compute)
    return sum(max(c, t_kv_ms) for c in compute[:-1]) + compute[-1] if W > 1 else compute[0]


def backward_ms(compute: list[float], t_kv_ms: float, t_dkv_ms: float) -> float:
    W = len(compute)
    if W == 1:
        return compute[0]
    middle = sum(max(c, t_kv_ms + t_dkv_ms) for c in compute[1:-1])
    return max(compute[0], t_kv_ms) + middle + max(compute[-1], t_dkv_ms) + t_dkv_ms


def ring_model(world_size: int, layout: str, causal: bool, *, forward_kernel_ms: dict, backward_kernel_ms: dict,
               B: int, Hkv: int, n_local: int, D: int, dtype_bytes: int, link_bytes_per_s: float,
               merge_ms: dict | None = None, accumulate_ms: dict | None = None, latency_s: float = LATENCY_S) -> dict:
    """The modelled forward and forward+backward time (ms) of one ring on ``world_size`` devices, and what went in:
    each step's compute, the time of a K/V transfer and of a dK/dV transfer."""
    t_kv = transfer_s(shard_bytes(B, Hkv, n_local, D, dtype_bytes), link_bytes_per_s, latency_s) * 1e3
    t_dkv = transfer_s(shard_bytes(B, Hkv, n_local, D, 4), link_bytes_per_s, latency_s) * 1e3
    fwd_c = step_compute(world_size, layout, causal, forward_kernel_ms, merge_ms, n_local)
    bwd_c = step_compute(world_size, layout, causal, backward_kernel_ms, accumulate_ms, n_local)
    fwd = forward_ms(fwd_c, t_kv)
    return {"forward_ms": fwd, "forward_backward_ms": fwd + backward_ms(bwd_c, t_kv, t_dkv),
            "forward_compute_ms": fwd_c, "backward_compute_ms": bwd_c, "kv_transfer_ms": t_kv,
            "dkv_transfer_ms": t_dkv}


def efficiency(one_device_ms: float, world_size: int, ring_ms: float) -> float:
    """Scaling efficiency: one device's time for the whole problem / (W × the ring's time on W devices)."""
    return one_device_ms / (world_size * ring_ms)
