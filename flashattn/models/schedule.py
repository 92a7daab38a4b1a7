"""The schedule of ``fast``'s Gluon kernel (notebook 11), on paper: its loops as lists of operations, and a
small simulation of one SM running them.

``fast_gluon.py`` is written for the GPU and cannot run in the interpreter. What notebook 11 needs from it is
its *order of operations*: which warps issue which TMA copy, tensor-core product or softmax, and where each
one waits on an mbarrier or on a product. This module writes that order down, operation for operation, as
the kernel's functions do it (``_attend_tile`` and ``_step``: :func:`tile_ops`; ``_producer``:
:func:`producer_ops`; ``_one_warpgroup``: :func:`single_ops`; ``tests/test_schedule.py`` checks the order
against the kernel's source), and :func:`simulate` runs the programs against one SM's shared units:

* the TMA engine (copies), the tensor cores (``wgmma``) and the softmax units (MUFU exponentials and FMA)
  each serve one operation at a time, in the order they were issued;
* a product is *issued* and runs on its own; ``MmaWait(n)`` blocks its warpgroup until at most ``n`` of
  its products are still running (``warpgroup_mma_wait``);
* an mbarrier counts arrivals; when a phase has all its arrivals (a landed copy, or every consumer's
  release) the phase completes. ``Wait(bar, index, phase)`` passes once the phase of that parity has
  completed: it compares parities only, as the hardware does, so a wait that is a whole lap of the ring
  behind or ahead passes at the wrong time.

The simulation also checks the protocol and names what goes wrong: a deadlock, a product that reads a ring
slot before its tile landed (or a slot that holds another tile), and a copy into a slot whose tile is still
in use. Durations are in clocks of one SM, from per-clock rates (:func:`costs_for`): a model to see what
overlaps with what, not a prediction of the kernel's time.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import defaultdict

# Per SM and clock on Hopper (NVIDIA's H100 figures: dense fp16 989 TFLOP/s = 132 SMs x 1.83 GHz x 4096;
# the CUDA programming guide's throughput table for compute capability 9.0: 16 exponentials (MUFU) and
# 128 fp32 multiply-adds per clock per SM).
TENSOR_FLOPS_PER_CLOCK = 4096
EXP_PER_CLOCK = 16
FMA_PER_CLOCK = 128
# How fast a TMA copy fills shared memory, in bytes per clock per SM: an assumption (the course does not
# measure the L2's bandwidth), chosen so that a tile arrives faster than the consumers use it.
LOAD_BYTES_PER_CLOCK = 64

RESOURCES = ("TMA", "tensor cores", "softmax units")


# --- the operations ---------------------------------------------------------------------------------------

class _Op:
    """An operation; ``TEXT``, with its fields in braces, says it in words (``str(op)``)."""

    TEXT = ""

    def __str__(self):
        return self.TEXT.format(**vars(self))


@dataclasses.dataclass(frozen=True)
class Wait(_Op):
    """``mbarrier.wait(barrier[index], phase)``: block until the phase of this parity has completed."""

    TEXT = "wait {barrier}[{index}] phase {phase}"
    barrier: str
    index: int
    phase: int


@dataclasses.dataclass(frozen=True)
class Arrive(_Op):
    """``mbarrier.arrive(barrier[index])``: one arrival (a consumer releasing a slot)."""

    TEXT = "arrive {barrier}[{index}]"
    barrier: str
    index: int


@dataclasses.dataclass(frozen=True)
class MmaWait(_Op):
    """``warpgroup_mma_wait(pending)``: block until at most ``pending`` of this warpgroup's products still run."""

    TEXT = "wait until <= {pending} products run"
    pending: int


@dataclasses.dataclass(frozen=True)
class Load(_Op):
    """``mbarrier.expect`` + a TMA copy of one tile into slot ``slot`` of the ``tensor`` ring ("Q", "K" or "V");
    when it lands, it arrives on ``<tensor>_ready[slot]``. ``block``: the key block (K, V) of tile ``tile``."""

    tensor: str
    slot: int
    tile: int = 0
    block: int = 0

    def __str__(self):
        what = f"{self.tensor} of tile {self.tile}" if self.tensor == "Q" else f"{self.tensor} block {self.block}"
        return f"load {what} -> slot {self.slot}"


@dataclasses.dataclass(frozen=True)
class Mma(_Op):
    """``warpgroup_mma(..., is_async=True)``: issue a product that reads slot ``slot``: "QK" (scores of key block
    ``block``, from the K ring and this warpgroup's Q) or "PV" (``acc += p · v``, from the V ring)."""

    TEXT = "issue {product}{block} (slot {slot})"
    product: str
    slot: int
    tile: int
    block: int


@dataclasses.dataclass(frozen=True)
class _BlockWork(_Op):
    """Work of one warpgroup on key block ``block`` of tile ``tile``, on the softmax units."""

    tile: int
    block: int


class Softmax(_BlockWork):
    """Block ``block``'s online softmax (``_softmax``): exponentials and sums, on the softmax units."""

    TEXT = "softmax {block}"


class Rescale(_BlockWork):
    """``acc *= alpha`` after block ``block``'s softmax (FMA units)."""

    TEXT = "rescale acc ({block})"


@dataclasses.dataclass(frozen=True)
class Store(_Op):
    """Normalize and store the warpgroup's rows of tile ``tile`` (``_store``)."""

    TEXT = "store tile {tile}"
    tile: int


# --- the kernel's loops as programs --------------------------------------------------------------------------

def _free_k(slot: int, tile: int, j: int, n_blocks: int, stages: int, wg: int, refill: bool) -> list:
    """``_free("k", ...)``: a lone warpgroup refills the K slot with block j + STAGES; a consumer releases it (and,
    after its last block, its Q tile)."""
    if refill:
        return [Load("K", slot, tile, j + stages)] if j + stages < n_blocks else []
    return [Arrive("k_empty", slot)] + ([Arrive("q_empty", wg)] if j == n_blocks - 1 else [])


def _free_v(slot: int, tile: int, j: int, n_blocks: int, stages: int, refill: bool) -> list:
    """``_free("v", ...)``: refill the V slot with block j + STAGES, or release it."""
    if refill:
        return [Load("V", slot, tile, j + stages)] if j + stages < n_blocks else []
    return [Arrive("v_empty", slot)]


def step_ops(j: int, c: int, n_blocks: int, stages: int, *, tile: int = 0, wg: int = 0, overlap: bool = True,
             refill: bool = False) -> list:
    """``_step``: key block j >= 1, the c-th block through the rings (slot c % STAGES, lap c // STAGES)."""
    slot, prev = c % stages, (c - 1) % stages
    ops = [Wait("k_ready", slot, (c // stages) & 1), Mma("QK", slot, tile, j)]
    if not overlap:
        ops.append(MmaWait(0))
    ops += [Wait("v_ready", prev, ((c - 1) // stages) & 1), Mma("PV", prev, tile, j - 1)]
    if not overlap:
        ops.append(MmaWait(0))
    ops.append(MmaWait(1))  # the scores are done; p · v may still run
    ops += _free_k(slot, tile, j, n_blocks, stages, wg, refill)
    ops += [Softmax(tile, j), MmaWait(0)]
    if not refill:  # a consumer hands the V slot back at once
        ops += _free_v(prev, tile, j - 1, n_blocks, stages, refill)
    ops.append(Rescale(tile, j))
    if refill:  # a lone warpgroup issues its own copy after the rescale
        ops += _free_v(prev, tile, j - 1, n_blocks, stages, refill)
    return ops


def tile_ops(c0: int, n_blocks: int, stages: int, *, tile: int = 0, wg: int = 0, overlap: bool = True,
             refill: bool = False) -> list:
    """``_attend_tile``: one warpgroup's rows against ``n_blocks`` key blocks, block j in ring position c0 + j."""
    slot = c0 % stages
    ops = [Wait("k_ready", slot, (c0 // stages) & 1), Mma("QK", slot, tile, 0), MmaWait(0)]
    ops += _free_k(slot, tile, 0, n_blocks, stages, wg, refill)
    ops.append(Softmax(tile, 0))
    for j in range(1, n_blocks):
        ops += step_ops(j, c0 + j, n_blocks, stages, tile=tile, wg=wg, overlap=overlap, refill=refill)
    c = c0 + n_blocks - 1  # the last block's p · v
    ops += [Wait("v_ready", c % stages, (c // stages) & 1), Mma("PV", c % stages, tile, n_blocks - 1), MmaWait(0)]
    if not refill:
        ops += _free_v(c % stages, tile, n_blocks - 1, n_blocks, stages, refill)
    return ops


def single_ops(n_blocks: int, stages: int, *, overlap: bool = True) -> list:
    """``_one_warpgroup``: one warpgroup that loads its own Q, fills the rings, runs the tile and stores."""
    ops = [Load("Q", 0)]
    for i in range(min(stages, n_blocks)):
        ops += [Load("K", i, 0, i), Load("V", i, 0, i)]
    ops.append(Wait("q_ready", 0, 0))
    ops += tile_ops(0, n_blocks, stages, overlap=overlap, refill=True)
    return ops + [Store(0)]


def consumer_ops(blocks_per_tile, stages: int, wg: int, *, overlap: bool = True) -> list:
    """``_consumer``: warpgroup ``wg``'s rows of each tile, on the producer's rings."""
    ops, cnt = [], 0
    for it, n_blocks in enumerate(blocks_per_tile):
        ops.append(Wait("q_ready", wg, it & 1))
        ops += tile_ops(cnt, n_blocks, stages, tile=it, wg=wg, overlap=overlap)
        ops.append(Store(it))
        cnt += n_blocks
    return ops


def producer_ops(blocks_per_tile, stages: int, consumers: int) -> list:
    """``_producer``: every TMA copy. Each consumer's Q once it let go of the last; then K and V of every key
    block, each into its ring slot once every consumer has released the slot."""
    ops, cnt = [], 0
    for it, n_blocks in enumerate(blocks_per_tile):
        for c in range(consumers):
            ops += [Wait("q_empty", c, (it & 1) ^ 1), Load("Q", c, it)]  # a fresh barrier passes a wait on parity 1
        for j in range(n_blocks):
            slot, lap = cnt % stages, (cnt // stages) & 1
            ops += [Wait("k_empty", slot, lap ^ 1), Load("K", slot, it, j),
                    Wait("v_empty", slot, lap ^ 1), Load("V", slot, it, j)]
            cnt += 1
    return ops


@dataclasses.dataclass(frozen=True)
class Agent:
    """One warp role of one program: ``role`` is "producer", "consumer" (warpgroup ``wg``) or "single"."""

    name: str
    role: str
    ops: tuple
    program: int = 0
    wg: int = 0


def single_program(n_blocks: int, stages: int, *, overlap: bool = True, program: int = 0) -> list[Agent]:
    """A "single" program: one warpgroup, loading its own tiles."""
    return [Agent(f"program {program}", "single",
                  tuple(single_ops(n_blocks, stages, overlap=overlap)), program)]


def specialized_program(blocks_per_tile, stages: int, consumers: int, *, overlap: bool = True, program: int = 0,
                        producer=None) -> list[Agent]:
    """A warp-specialized program: ``consumers`` consumer warpgroups and a producer warp (``producer``: a
    function like :func:`producer_ops`, the kernel's if None)."""
    producer = producer or producer_ops
    agents = [Agent(f"consumer {wg}", "consumer", tuple(consumer_ops(blocks_per_tile, stages, wg, overlap=overlap)),
                    program, wg) for wg in range(consumers)]
    return agents + [Agent("producer", "producer", tuple(producer(list(blocks_per_tile), stages, consumers)),
                           program)]


# --- durations --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Costs:
    """Clocks of one SM for each operation of one warpgroup's block."""

    qk: float
    pv: float
    softmax: float
    rescale: float
    load_q: float
    load_kv: float
    store: float


def costs_for(D: int, block_m: int, block_n: int, dtype_bytes: int = 2, *,
              load_bytes_per_clock: float = LOAD_BYTES_PER_CLOCK) -> Costs:
    """Durations from per-clock rates: each product 2·BLOCK_M·BLOCK_N·D FLOP on the tensor cores, the softmax
    BLOCK_M·BLOCK_N exponentials (the max, sums and conversions are left out), the rescale BLOCK_M·D
    multiplies, a copy its bytes at ``load_bytes_per_clock``, the store its bytes at the same rate."""
    for name, value in (("D", D), ("block_m", block_m), ("block_n", block_n), ("dtype_bytes", dtype_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"costs_for: {name} must be a positive integer, got {value!r}")
    if not load_bytes_per_clock > 0:
        raise ValueError(f"costs_for: load_bytes_per_clock must be positive, got {load_bytes_per_clock!r}")
    product = 2 * block_m * block_n * D / TENSOR_FLOPS_PER_CLOCK
    return Costs(qk=product, pv=product, softmax=block_m * block_n / EXP_PER_CLOCK,
                 rescale=block_m * D / FMA_PER_CLOCK, load_q=block_m * D * dtype_bytes / load_bytes_per_clock,
                 load_kv=block_n * D * dtype_bytes / load_bytes_per_clock,
                 store=block_m * D * dtype_bytes / load_bytes_per_clock)


# --- the simulation ---------------------------------------------------------------------------------------------

class ProtocolError(Exception):
    """The programs broke the ring protocol (the message says how)."""


@dataclasses.dataclass
class _Buffer:
    content: tuple | None = None  # (tile, block) that landed last
    landing: tuple | None = None  # (tile, block) of a copy in flight into it
    released: set = dataclasses.field(default_factory=set)  # consumers done with the content
    reading: int = 0  # products in flight that read it


@dataclasses.dataclass
class Result:
    """What :func:`simulate` saw. ``intervals``: dicts with ``agent``, ``row`` (a resource, or the agent's own
    row), ``label``, ``kind``, ``start``, ``end``; ``error``: the first protocol error (None: none);
    ``end``: when the last operation finished."""

    intervals: list
    error: str | None
    end: float

    def busy(self, row: str) -> float:
        """Clocks during which ``row`` (e.g. "tensor cores") was busy."""
        return sum(i["end"] - i["start"] for i in self.intervals if i["row"] == row)


def _buffer_name(tensor: str, slot: int) -> str:
    return f"{tensor} slot {slot}"


class _Simulation:
    def __init__(self, agents, costs: Costs):
        self.agents, self.costs, self.t = list(agents), costs, 0.0
        self.pc = [0] * len(self.agents)
        self.busy_until = [0.0] * len(self.agents)
        self.waiting_since: list[float | None] = [None] * len(self.agents)
        self.running = [[] for _ in self.agents]  # per agent: the products in flight (their Mma)
        self.free_at = dict.fromkeys(RESOURCES, 0.0)
        self.completed = defaultdict(int)  # (program, barrier, index) -> completed phases
        self.arrivals = defaultdict(int)  # arrivals in the current phase
        self.buffers = defaultdict(_Buffer)  # (program, tensor, slot)
        self.reads = defaultdict(int)  # (program, tensor, tile, block) -> products that read it
        self.loaded = []  # (program, tensor, tile, block, agent name) of every copy
        self.events, self.seq = [], 0
        self.intervals = []
        self.consumers = defaultdict(set)
        for i, a in enumerate(self.agents):
            if a.role == "consumer":
                self.consumers[a.program].add(i)

    # barriers
    def _count(self, program, barrier) -> int:
        return max(1, len(self.consumers[program])) if barrier in ("k_empty", "v_empty") else 1

    def _arrive(self, program, barrier, index):
        key = (program, barrier, index)
        self.arrivals[key] += 1
        if self.arrivals[key] == self._count(program, barrier):
            self.arrivals[key] = 0
            self.completed[key] += 1

    def _passes(self, program, op: Wait) -> bool:
        return self.completed[(program, op.barrier, op.index)] % 2 != op.phase

    # operations
    def _schedule(self, resource, duration, agent, label, kind) -> float:
        start = max(self.t, self.free_at[resource])
        end = start + duration
        self.free_at[resource] = end
        self.intervals.append({"agent": agent.name, "program": agent.program, "row": resource, "label": label,
                               "kind": kind, "start": start, "end": end})
        return end

    def _push(self, time, action):
        heapq.heappush(self.events, (time, self.seq, action))
        self.seq += 1

    def _load(self, i, op: Load):
        agent = self.agents[i]
        buf = self.buffers[(agent.program, op.tensor, op.slot)]
        where, what = _buffer_name(op.tensor, op.slot), f"{op}"
        if buf.landing is not None:
            raise ProtocolError(f"{agent.name}: '{what}' while the copy before it into the {where} (tile "
                                f"{buf.landing[0]}, block {buf.landing[1]}) has not landed: refilling a slot still "
                                "in use")
        if buf.reading:
            raise ProtocolError(f"{agent.name}: '{what}' while a product still reads the {where} (tile "
                                f"{buf.content[0]}, block {buf.content[1]}): refilling a slot still in use")
        owners = {c for c in self.consumers[agent.program] if op.tensor != "Q" or self.agents[c].wg == op.slot}
        waiting = sorted(self.agents[c].name for c in owners - buf.released)
        if agent.role == "producer" and buf.content is not None and waiting:
            raise ProtocolError(f"{agent.name}: '{what}' before {' and '.join(waiting)} released the {where} "
                                f"(it holds tile {buf.content[0]}, block {buf.content[1]}): refilling a slot still in "
                                f"use (wait on its empty barrier first)")
        duration = self.costs.load_q if op.tensor == "Q" else self.costs.load_kv
        label = f"Q{op.tile}" if op.tensor == "Q" else f"{op.tensor}{op.block}"
        end = self._schedule("TMA", duration, agent, label, op.tensor)
        buf.landing = (op.tile, op.block)
        self.loaded.append((agent.program, op.tensor, op.tile, op.block, agent.name))

        def land():
            buf.content, buf.landing, buf.released = (op.tile, op.block), None, set()
            self._arrive(agent.program, f"{op.tensor.lower()}_ready", op.slot)
        self._push(end, land)

    def _check_read(self, agent, tensor, slot, expected, what):
        buf = self.buffers[(agent.program, tensor, slot)]
        if buf.content == expected:
            return buf
        where = _buffer_name(tensor, slot)
        if buf.landing == expected:
            raise ProtocolError(f"{agent.name}: {what} reads the {where} before its tile landed (the copy is still in "
                                "flight): reading a slot before it landed")
        holds = "nothing" if buf.content is None else f"tile {buf.content[0]}, block {buf.content[1]}"
        raise ProtocolError(f"{agent.name}: {what} expects tile {expected[0]}, block {expected[1]} in the {where}, "
                            f"which holds {holds}: reading a slot before it landed (or a tile that was put in the "
                            "wrong slot)")

    def _mma(self, i, op: Mma):
        agent = self.agents[i]
        what = f"{op.product}{op.block}"
        reads = [("K", op.slot, (op.tile, op.block)), ("Q", agent.wg, (op.tile, 0))] if op.product == "QK" else [
            ("V", op.slot, (op.tile, op.block))]
        bufs = [self._check_read(agent, tensor, slot, expected, what) for tensor, slot, expected in reads]
        for (tensor, _, (tile, block)), buf in zip(reads, bufs, strict=True):
            buf.reading += 1
            self.reads[(agent.program, tensor, tile, block)] += 1
        end = self._schedule("tensor cores", self.costs.qk if op.product == "QK" else self.costs.pv, agent, what,
                             op.product)
        self.running[i].append((op, bufs))

        def done():
            self.running[i] = [r for r in self.running[i] if r[0] is not op]
            for buf in bufs:
                buf.reading -= 1
        self._push(end, done)

    def _release(self, i, op: Arrive):
        agent = self.agents[i]
        tensor = op.barrier[0].upper()
        buf = self.buffers[(agent.program, tensor, op.index)]
        if any(buf is b for _, bufs in self.running[i] for b in bufs):
            raise ProtocolError(f"{agent.name}: '{op}' while its own product still reads the "
                                f"{_buffer_name(tensor, op.index)}: releasing a slot still in use")
        buf.released.add(i)
        self._arrive(agent.program, op.barrier, op.index)

    def _try(self, i) -> bool:
        """Run agent i's next operation if it can go now; True if it did."""
        agent, op = self.agents[i], self.agents[i].ops[self.pc[i]]
        if isinstance(op, Wait | MmaWait):
            ready = (self._passes(agent.program, op) if isinstance(op, Wait)
                     else len(self.running[i]) <= op.pending)
            if not ready:
                if self.waiting_since[i] is None:
                    self.waiting_since[i] = self.t
                return False
            if self.waiting_since[i] is not None and self.t > self.waiting_since[i]:
                self.intervals.append({"agent": agent.name, "program": agent.program, "row": agent.name,
                                       "label": str(op), "kind": "wait", "start": self.waiting_since[i], "end": self.t})
            self.waiting_since[i] = None
        elif isinstance(op, Arrive):
            self._release(i, op)
        elif isinstance(op, Load):
            self._load(i, op)
        elif isinstance(op, Mma):
            self._mma(i, op)
        elif isinstance(op, Softmax | Rescale):
            kind = "softmax" if isinstance(op, Softmax) else "rescale"
            label = f"s{op.block}" if kind == "softmax" else "α"
            self.busy_until[i] = self._schedule("softmax units", getattr(self.costs, kind), agent, label, kind)
        elif isinstance(op, Store):
            self.busy_until[i] = self.t + self.costs.store
            self.intervals.append({"agent": agent.name, "program": agent.program, "row": agent.name,
                                   "label": "store", "kind": "store", "start": self.t, "end": self.busy_until[i]})
        else:
            raise TypeError(f"{agent.name}: not an operation: {op!r}")
        self.pc[i] += 1
        return True

    def _deadlock(self) -> str:
        stuck = []
        for i, agent in enumerate(self.agents):
            if self.pc[i] < len(agent.ops):
                op = agent.ops[self.pc[i]]
                state = (f" (phases completed so far: {self.completed[(agent.program, op.barrier, op.index)]})"
                         if isinstance(op, Wait) else "")
                stuck.append(f"{agent.name} waits at '{op}'{state}")
        return "deadlock: nothing can move: " + "; ".join(stuck)

    def run(self) -> Result:
        try:
            while True:
                progressed = True
                while progressed:
                    progressed = False
                    for i, agent in enumerate(self.agents):
                        while (self.pc[i] < len(agent.ops) and self.busy_until[i] <= self.t and self._try(i)):
                            progressed = True
                if all(self.pc[i] == len(a.ops) for i, a in enumerate(self.agents)) and not self.events:
                    break
                times = [e[0] for e in self.events[:1]] + [b for b in self.busy_until if b > self.t]
                if not times:
                    raise ProtocolError(self._deadlock())
                self.t = min(times)
                while self.events and self.events[0][0] <= self.t:
                    heapq.heappop(self.events)[2]()
            self._check_unread()
        except ProtocolError as err:
            return Result(self.intervals, str(err), self.t)
        return Result(self.intervals, None, max([self.t] + [iv["end"] for iv in self.intervals]))

    def _check_unread(self):
        for program, tensor, tile, block, name in self.loaded:
            if tensor != "Q" and not self.reads[(program, tensor, tile, block)]:
                raise ProtocolError(f"{name}: loaded {tensor} block {block} of tile {tile}, which no warpgroup read: "
                                    "a copy too many (or into the wrong slot)")


def simulate(agents, costs: Costs) -> Result:
    """Run the programs of ``agents`` (one SM's warps) with ``costs``; see the module docstring."""
    if not agents:
        raise ValueError("simulate: give at least one agent")
    return _Simulation(agents, costs).run()
