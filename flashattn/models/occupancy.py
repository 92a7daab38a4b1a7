"""How many programs (thread blocks) of a kernel fit on one SM at once, and why.

Each SM has fixed pools: registers, shared memory, warp slots and block slots. A kernel's program
needs ``num_warps`` warps, ``registers_per_thread`` registers for each of its threads and some
shared memory; the SM runs as many programs side by side as the scarcest pool allows. The
allocation rules below are those of NVIDIA's occupancy calculator for compute capability 9.0
(registers are handed out per warp in units of 256, shared memory per block in units of 128 bytes,
plus 1 KiB the driver reserves per block).
"""

from __future__ import annotations

from dataclasses import dataclass

REGISTER_UNIT = 256  # registers are allocated to a warp in multiples of this
SHARED_UNIT = 128  # bytes
SHARED_RESERVED_PER_BLOCK = 1024  # bytes the driver keeps per block (sm_80 and later)


@dataclass(frozen=True)
class SMLimits:
    registers: int = 65536
    shared_bytes: int = 233472  # the largest shared-memory carve-out per SM
    max_warps: int = 64
    max_blocks: int = 32
    max_registers_per_thread: int = 255

    @classmethod
    def from_properties(cls, props: dict) -> SMLimits:
        """From ``flashattn.recorded.get('device')['properties']`` (or the same keys measured live)."""
        return cls(registers=props["registers_per_sm"], shared_bytes=props["shared_memory_per_sm_bytes"],
                   max_warps=props["max_threads_per_sm"] // props.get("warp_size", 32))


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(*, registers_per_thread: int, shared_bytes: int, num_warps: int,
              limits: SMLimits = SMLimits()) -> dict:
    """Blocks per SM allowed by each resource, the binding one, and the resulting occupancy.

    Returns ``{"limits": {"registers", "shared_memory", "warps", "blocks"}, "blocks_per_sm",
    "warps_per_sm", "occupancy" (active warps / max warps), "limited_by"}``.
    """
    for name, value in (("registers_per_thread", registers_per_thread), ("num_warps", num_warps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(shared_bytes, bool) or not isinstance(shared_bytes, int) or shared_bytes < 0:
        raise ValueError(f"shared_bytes must be a non-negative integer, got {shared_bytes!r}")
    if registers_per_thread > limits.max_registers_per_thread:
        raise ValueError(f"registers_per_thread={registers_per_thread} exceeds the hardware's "
                         f"{limits.max_registers_per_thread}")
    if num_warps > limits.max_warps:
        raise ValueError(f"num_warps={num_warps} exceeds the SM's {limits.max_warps} warps")

    registers_per_warp = _round_up(registers_per_thread * 32, REGISTER_UNIT)
    shared_per_block = _round_up(shared_bytes, SHARED_UNIT) + SHARED_RESERVED_PER_BLOCK
    if shared_per_block > limits.shared_bytes:
        raise ValueError(f"a block needs {shared_per_block} bytes of shared memory; the SM has {limits.shared_bytes}")
    per_resource = {
        "registers": (limits.registers // registers_per_warp) // num_warps,
        "shared_memory": limits.shared_bytes // shared_per_block,
        "warps": limits.max_warps // num_warps,
        "blocks": limits.max_blocks,
    }
    blocks = min(per_resource.values())
    return {
        "limits": per_resource,
        "blocks_per_sm": blocks,
        "warps_per_sm": blocks * num_warps,
        "occupancy": blocks * num_warps / limits.max_warps,
        "limited_by": [name for name, n in per_resource.items() if n == blocks],
    }


def kernel_occupancy(resources: dict, limits: SMLimits = SMLimits()) -> dict:
    """:func:`occupancy` of a compiled kernel from its resources (``registers_per_thread``, ``shared_bytes``,
    ``num_warps``, as ``flashattn.measure.compiled.kernel_resources`` gives them); ``{"error": ...}`` when
    the kernel could not run on an SM with ``limits``."""
    try:
        return occupancy(registers_per_thread=resources["registers_per_thread"],
                         shared_bytes=resources["shared_bytes"], num_warps=resources["num_warps"], limits=limits)
    except ValueError as err:
        return {"error": str(err)}
