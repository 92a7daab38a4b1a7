"""flashattn.models.schedule: the Gluon kernel's loops as operations, the simulation of one SM, and the
order of operations checked against fast_gluon.py's own source."""

import ast
import inspect
import itertools
import textwrap

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashattn.models import schedule  # noqa: E402
from flashattn.models.schedule import Arrive, Load, Mma, MmaWait, Rescale, Softmax, Store, Wait  # noqa: E402

fast_gluon = pytest.importorskip("flashattn.kernels.fast_gluon", reason="Triton without Gluon")

COSTS = schedule.costs_for(128, 64, 128)


# --- the order of operations, against the kernel's source ---------------------------------------------------

CALLS = {"mbarrier.wait": "wait", "warpgroup_mma": "mma", "warpgroup_mma_wait": "mma_wait", "_free": "free",
         "_softmax": "softmax", "tma_load": "load", "_load_tile": "load", "_step": "step", "_attend_tile": "attend",
         "_store": "store"}
ARG_NAMES = {"q_bar": "q_ready", "qi": "QK", "pij": "PV"}


def _name(node) -> str:
    return f"{_name(node.value)}.{node.attr}" if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _first_arg(call) -> str:
    """The name a call's first argument starts from: ``k_ready`` of ``k_ready.index(slot)``, ``K``, ``qi``."""
    node = call.args[0] if call.args else None
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    name = getattr(node, "id", "")
    return ARG_NAMES.get(name, name)


def source_events(fn, env: dict) -> list:
    """The known calls of ``fn``'s body in order, as (kind, what): ``if`` statements resolved with ``env``,
    each loop body visited once; ``acc = acc * ...`` is the rescale."""
    body = ast.parse(textwrap.dedent(inspect.getsource(fn.fn))).body[0].body
    out = []

    def visit(stmts):
        for st in stmts:
            if isinstance(st, ast.If):
                visit(st.body if eval(compile(ast.Expression(st.test), "<if>", "eval"), dict(env)) else st.orelse)
            elif isinstance(st, ast.For):
                visit(st.body)
            else:
                calls = [n for n in ast.walk(st) if isinstance(n, ast.Call) and _name(n.func) in CALLS]
                for call in sorted(calls, key=lambda n: n.col_offset):
                    kind = CALLS[_name(call.func)]
                    if kind == "free":  # _free("k", ...) or _free("v", ...)
                        kind = f"free_{call.args[0].value}"
                    out.append((kind, _first_arg(call) if kind in ("wait", "mma", "load") else ""))
                if (isinstance(st, ast.Assign) and isinstance(st.value, ast.BinOp) and isinstance(st.value.op, ast.Mult)
                        and getattr(st.value.left, "id", "") == "acc"):
                    out.append(("rescale", ""))
    visit(body)
    return out


def model_events(ops, refill: bool) -> list:
    """The same (kind, what) for the model's operations; a release (or refill) and its q_empty are one call."""
    out = []
    for op in ops:
        if isinstance(op, Wait):
            out.append(("wait", op.barrier))
        elif isinstance(op, Mma):
            out.append(("mma", op.product))
        elif isinstance(op, MmaWait):
            out.append(("mma_wait", ""))
        elif isinstance(op, Softmax):
            out.append(("softmax", ""))
        elif isinstance(op, Rescale):
            out.append(("rescale", ""))
        elif isinstance(op, Store):
            out.append(("store", ""))
        elif isinstance(op, Arrive) and op.barrier == "q_empty":
            continue
        elif isinstance(op, Arrive):
            out.append((f"free_{op.barrier[0]}", ""))
        elif isinstance(op, Load) and refill and op.tensor in "KV":
            out.append((f"free_{op.tensor.lower()}", ""))
        elif isinstance(op, Load):
            out.append(("load", op.tensor))
    return out


@pytest.mark.parametrize("overlap, refill", list(itertools.product((True, False), (False, True))))
def test_step_follows_the_kernels_step(overlap, refill):
    env = {"OVERLAP": overlap, "refill": object() if refill else None, "KEY_MASK": False}  # (the model has no mask)
    ops = schedule.step_ops(1, 1, n_blocks=8, stages=2, overlap=overlap, refill=refill)
    assert model_events(ops, refill) == source_events(fast_gluon._step, env)


@pytest.mark.parametrize("refill", (False, True))
def test_tile_follows_the_kernels_attend_tile(refill):
    n_blocks, stages = 3, 2
    ops = schedule.tile_ops(0, n_blocks, stages, refill=refill)
    steps = sum(len(schedule.step_ops(j, j, n_blocks, stages, refill=refill)) for j in range(1, n_blocks))
    first = ops.index(Softmax(0, 0)) + 1  # block 0 ends with its softmax
    model = model_events(ops[:first], refill) + [("step", "")] + model_events(ops[first + steps:], refill)
    assert model == source_events(fast_gluon._attend_tile, {"refill": object() if refill else None, "KEY_MASK": False})


def test_producer_consumer_and_single_follow_the_kernel():
    producer = schedule.producer_ops([1], stages=1, consumers=1)
    assert model_events(producer, False) == source_events(fast_gluon._producer, {})
    consumer = schedule.consumer_ops([1], stages=1, wg=0)
    assert [e for e in model_events(consumer, False) if e[0] in ("wait", "store")][:1] == [("wait", "q_ready")]
    assert source_events(fast_gluon._consumer, {}) == [("wait", "q_ready"), ("attend", ""), ("store", "")]
    single = schedule.single_ops(1, stages=1)  # its Q, the ring's first K and V, the wait for Q, the tile, the store
    assert source_events(fast_gluon._one_warpgroup, {"CAUSAL": False}) == (
        model_events(single[:4], False) + [("attend", ""), ("store", "")])
    assert isinstance(single[-1], Store)


# --- the operations ------------------------------------------------------------------------------------------

def test_ring_positions_run_on_across_tiles():
    ops = schedule.consumer_ops([3, 2], stages=2, wg=0)
    ready = [op for op in ops if isinstance(op, Wait) and op.barrier == "k_ready"]
    # blocks 0..4 of the program: slots 0 1 0 1 0, laps 0 0 1 1 0 (phase = lap parity)
    assert [(w.index, w.phase) for w in ready] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 0)]
    producer = schedule.producer_ops([3, 2], stages=2, consumers=2)
    empty = [op for op in producer if isinstance(op, Wait) and op.barrier == "k_empty"]
    assert [(w.index, w.phase) for w in empty] == [(0, 1), (1, 1), (0, 0), (1, 0), (0, 1)]
    assert [str(op) for op in producer[:2]] == ["wait q_empty[0] phase 1", "load Q of tile 0 -> slot 0"]


def test_each_block_has_two_products_and_a_softmax():
    for overlap in (True, False):
        ops = schedule.consumer_ops([5], stages=2, wg=1, overlap=overlap)
        assert sum(isinstance(op, Mma) for op in ops) == 10 and sum(isinstance(op, Softmax) for op in ops) == 5
        assert [op.block for op in ops if isinstance(op, Mma) and op.product == "PV"] == [0, 1, 2, 3, 4]
    single = schedule.single_ops(5, stages=2)
    loads = [(op.tensor, op.block) for op in single if isinstance(op, Load) and op.tensor == "K"]
    assert loads == [("K", j) for j in (0, 1, 2, 3, 4)]  # two to fill the ring, then a refill per block


def test_costs_by_hand():
    c = schedule.costs_for(128, 64, 128)
    assert (c.qk, c.pv, c.softmax, c.rescale) == (512.0, 512.0, 512.0, 64.0)  # 2·64·128·128 / 4096, 64·128 / 16
    assert c.load_kv == 128 * 128 * 2 / schedule.LOAD_BYTES_PER_CLOCK and c.load_q == c.store
    assert schedule.costs_for(64, 64, 128, load_bytes_per_clock=16).load_kv == 1024.0
    for bad in (dict(D=0), dict(block_m=64.0), dict(block_n=True)):
        with pytest.raises(ValueError, match="positive integer"):
            schedule.costs_for(**{"D": 64, "block_m": 64, "block_n": 64, **bad})
    with pytest.raises(ValueError, match="load_bytes_per_clock"):
        schedule.costs_for(64, 64, 64, load_bytes_per_clock=0)


# --- the simulation ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("consumers, stages, tiles", [(1, 1, [1]), (2, 2, [5]), (3, 2, [4, 4, 3]), (2, 3, [2, 7]),
                                                      (2, 1, [3, 2])])
def test_the_kernels_programs_run_without_protocol_errors(consumers, stages, tiles):
    result = schedule.simulate(schedule.specialized_program(tiles, stages, consumers), COSTS)
    assert result.error is None
    products = [iv for iv in result.intervals if iv["row"] == "tensor cores"]
    assert len(products) == 2 * consumers * sum(tiles)
    assert result.end >= result.busy("tensor cores") == pytest.approx(len(products) * COSTS.qk)


def test_units_serve_one_operation_at_a_time():
    result = schedule.simulate(schedule.specialized_program([6], 2, 3), schedule.costs_for(64, 64, 128))
    for row in schedule.RESOURCES:
        spans = sorted((iv["start"], iv["end"]) for iv in result.intervals if iv["row"] == row)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))


def test_overlap_and_more_warpgroups_keep_the_tensor_cores_busier():
    serial = schedule.simulate(schedule.single_program(8, 1, overlap=False), COSTS)
    overlapped = schedule.simulate(schedule.single_program(8, 1), COSTS)
    assert overlapped.end < serial.end  # issue now, wait later
    # with the overlap, block j's softmax runs while block j-1's p·v is on the tensor cores
    pv = next(iv for iv in overlapped.intervals if iv["label"] == "PV2")
    s3 = next(iv for iv in overlapped.intervals if iv["label"] == "s3")
    assert s3["start"] < pv["end"] and pv["start"] < s3["end"]
    two = schedule.simulate(schedule.single_program(8, 1) + schedule.single_program(8, 1, program=1), COSTS)
    busy = [r.busy("tensor cores") / r.end for r in (serial, overlapped, two)]
    assert busy == sorted(busy)


def test_a_fresh_barrier_passes_parity_1_and_blocks_parity_0():
    passes = schedule.Agent("w", "single", (Wait("k_ready", 0, 1),))
    assert schedule.simulate([passes], COSTS).error is None
    blocks = schedule.Agent("w", "single", (Wait("k_ready", 0, 0),))
    error = schedule.simulate([blocks], COSTS).error
    assert error.startswith("deadlock") and "w waits at 'wait k_ready[0] phase 0' (phases completed so far: 0)" in error


def _spoiled_producer(drop=(), phase_flip=()):
    def producer(tiles, stages, consumers):
        ops = schedule.producer_ops(tiles, stages, consumers)
        ops = [op for op in ops if not (isinstance(op, Wait) and op.barrier in drop)]
        return [Wait(op.barrier, op.index, op.phase ^ 1) if isinstance(op, Wait) and op.barrier in phase_flip else op
                for op in ops]
    return producer


def test_protocol_errors_are_named():
    def run(producer, tiles=(5,), consumers=2, stages=2):
        return schedule.simulate(schedule.specialized_program(list(tiles), stages, consumers, producer=producer),
                                 COSTS).error
    assert "deadlock" in run(_spoiled_producer(phase_flip=("k_empty", "v_empty")))
    assert "refilling a slot still in use" in run(_spoiled_producer(drop=("k_empty", "v_empty")))
    assert "refilling a slot still in use" in run(_spoiled_producer(drop=("v_empty",)))
    def extra(tiles, stages, consumers):  # one tile of one block: slot 1 stays free, and its copy is never read
        return schedule.producer_ops(tiles, stages, consumers) + [Wait("k_empty", 1, 1), Load("K", 1, 0, 9)]
    assert "a copy too many" in run(extra, tiles=(1,))
    assert "refilling a slot still in use" in run(lambda *args: extra(*args)[:-2] + [Load("K", 0, 0, 9)], tiles=(1,))


def test_a_consumer_that_reads_early_or_releases_early_is_caught():
    tiles, stages = [4], 2
    early_read = [Wait(op.barrier, op.index, op.phase ^ 1) if isinstance(op, Wait) and op.barrier == "k_ready" else op
                  for op in schedule.consumer_ops(tiles, stages, 0)]
    agents = [schedule.Agent("consumer 0", "consumer", tuple(early_read)),
              schedule.Agent("producer", "producer", tuple(schedule.producer_ops(tiles, stages, 1)))]
    assert "reading a slot before it landed" in schedule.simulate(agents, COSTS).error
    ops = schedule.consumer_ops(tiles, stages, 0)  # wait Q, wait K, issue QK0, wait for it, release K slot 0, ...
    assert isinstance(ops[2], Mma) and isinstance(ops[3], MmaWait) and isinstance(ops[4], Arrive)
    early_release = ops[:3] + [ops[4], ops[3]] + ops[5:]  # released while QK0 still reads it
    agents[0] = schedule.Agent("consumer 0", "consumer", tuple(early_release))
    assert "releasing a slot still in use" in schedule.simulate(agents, COSTS).error


def test_simulate_refuses_nothing_and_non_operations():
    with pytest.raises(ValueError, match="at least one agent"):
        schedule.simulate([], COSTS)
    with pytest.raises(TypeError, match="not an operation"):
        schedule.simulate([schedule.Agent("w", "single", ("issue QK",))], COSTS)


# --- the pictures --------------------------------------------------------------------------------------------

def test_timeline_and_key_stage_pictures():
    from flashattn.exercises.fast import key_stages_solution
    from flashattn.teaching import schedule_plots

    result = schedule.simulate(schedule.specialized_program([3], 2, 2), COSTS)
    fig = schedule_plots.plot_timeline(result, "two consumers", note="a model")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:3] == list(schedule.RESOURCES) and "producer (waits)" in labels
    assert "tensor cores busy" in ax.get_title()
    plt.close(fig)
    fig = schedule_plots.plot_key_stages(key_stages_solution, 1000, 128, 64, causal=True)
    assert "56 blocks unmasked, 16 masked, 56 skipped" in fig.axes[0].get_title()  # 8 tiles x 16 blocks
    plt.close(fig)
