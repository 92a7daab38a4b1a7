"""Ring attention (issue 32, notebook 16): the plan of steps, the merge, the ring simulated in one process, and
the ring on 2 and 3 gloo processes against attention on the whole sequence in one process.

The processes are spawned once per world size (``run_gloo``: a free port, a timeout, interpreter mode), each
running every case; the tests read their results.
"""

import itertools
import re
import time

import pytest
import torch
import torch.nn.functional as F

from flashattn.distributed import compare, layouts, processes, ring, ring_attention, shard, step_plan, steps, unshard
from flashattn.reference import rel_error

TOLERANCE = 1e-5  # float32: the ring and one process both sit near 2e-7 here; a wrong step or merge gives >= 1e-2


# --- the plan --------------------------------------------------------------------------------------------------


def _coverage(world_size, n_local, causal, layout):
    """How many times each (query position, key position) pair is computed over every rank's plan."""
    N = world_size * n_local
    count = torch.zeros(N, N, dtype=torch.int64)
    for rank in range(world_size):
        mine = torch.tensor(layouts.positions(rank, world_size, n_local, layout))
        for step in step_plan(rank, world_size, n_local, causal=causal, layout=layout):
            theirs = torch.tensor(layouts.positions(step.source, world_size, n_local, layout))
            qi, kj = mine[step.q], theirs[step.kv]
            keep = torch.ones(len(qi), len(kj), dtype=torch.bool)
            if step.causal:
                keep = keep.tril()
            count[qi[:, None].expand(-1, len(kj))[keep], kj[None, :].expand(len(qi), -1)[keep]] += 1
    return count


@pytest.mark.parametrize("world_size, layout, causal",
                         list(itertools.product((1, 2, 3, 5), layouts.LAYOUTS, (False, True))))
def test_plan_computes_every_needed_pair_once(world_size, layout, causal):
    for n_local in (2, 6):
        count = _coverage(world_size, n_local, causal, layout)
        N = count.shape[0]
        wanted = torch.ones(N, N, dtype=torch.int64)
        if causal:
            wanted = wanted.tril()
        assert torch.equal(count, wanted), (world_size, n_local, layout, causal)


def test_plan_steps_are_the_ones_the_layouts_promise():
    plan = step_plan(1, 4, 8, causal=True, layout="zigzag")
    assert [(st.source, st.kind) for st in plan] == [(1, "diagonal"), (0, "first key chunk"),
                                                      (3, "second query chunk"), (2, "second query chunk")]
    assert plan[1].q == slice(0, 8) and plan[1].kv == slice(0, 4)
    assert plan[2].q == slice(4, 8) and plan[2].kv == slice(0, 8)
    assert [st.kind for st in step_plan(1, 3, 8, causal=True, layout="contiguous")] == ["diagonal", "full", "skipped"]
    assert layouts.positions(1, 3, 4, "zigzag") == [2, 3, 8, 9]
    assert layouts.schedule(3, "zigzag")[0] == [(0, 5), (2, 3), (1, 4)]


@pytest.mark.parametrize("world_size", (2, 4, 8))
def test_zigzag_balances_the_work_per_rank(world_size):
    """Key blocks each rank's kernels visit, at GPU-like sizes (n = 8192 per rank, 128 × 128 tiles)."""
    def blocks(layout):
        return [layouts.plan_key_blocks(step_plan(r, world_size, 8192, causal=True, layout=layout), 128, 128)
                for r in range(world_size)]

    zigzag, contiguous = blocks("zigzag"), blocks("contiguous")
    assert len(set(zigzag)) == 1
    assert contiguous == sorted(contiguous) and contiguous[-1] / contiguous[0] > 2 * world_size - 2
    assert sum(zigzag) == sum(contiguous)  # the same work in all, spread differently
    assert sum(zigzag) == layouts.key_blocks(8192 * world_size, 8192 * world_size, True, 128, 128)


def test_plan_refuses_bad_arguments():
    with pytest.raises(ValueError, match="layout must be one of"):
        step_plan(0, 2, 4, causal=True, layout="zig-zag")
    with pytest.raises(ValueError, match="multiple of 2"):
        step_plan(0, 2, 5, causal=True, layout="zigzag")
    with pytest.raises(ValueError, match="rank must be in"):
        step_plan(2, 2, 4, causal=True, layout="contiguous")


# --- the merge ---------------------------------------------------------------------------------------------------


def test_merge_is_exact_and_safe_for_far_apart_lse():
    """Float32 lse far past exp's range (exp(89) overflows float32): the merge stays finite and exact up to the
    rounding of lse itself (its last bit, eps · |lse|, is a relative error of the weights)."""
    gen = torch.Generator().manual_seed(0)
    o_a, o_b = (torch.randn(3, 5, 8, generator=gen, dtype=torch.float64).half() for _ in range(2))
    for shift_a, shift_b in ((0.0, 0.0), (0.0, 80.0), (300.0, 303.0), (-200.0, 200.0), (1e4, 1e4 + 3.0)):
        lse_a = (torch.randn(3, 5, generator=gen, dtype=torch.float64) + shift_a).float()
        lse_b = (torch.randn(3, 5, generator=gen, dtype=torch.float64) + shift_b).float()
        o, lse = steps.merge_partial(o_a, lse_a, o_b, lse_b)
        assert o.dtype == lse.dtype == torch.float32
        share_a = torch.sigmoid(lse_a.double() - lse_b.double())  # e^lse_a / (e^lse_a + e^lse_b), in float64
        expected = share_a[..., None] * o_a.double() + (1 - share_a)[..., None] * o_b.double()
        rounding = torch.finfo(torch.float32).eps * max(1.0, abs(shift_a), abs(shift_b))
        assert rel_error(o, expected) < 1e-6 + 4 * rounding, (shift_a, shift_b)
        assert rel_error(lse, torch.logaddexp(lse_a.double(), lse_b.double())) < 1e-7


# --- the ring, simulated in one process (every rank's steps, transfers as copies) --------------------------------


SIMULATED = [(1, "zigzag", True, "teaching"), (4, "contiguous", True, "teaching"), (4, "zigzag", True, "fast"),
             (3, "zigzag", False, "teaching"), (3, "contiguous", False, "fast")]


@pytest.mark.parametrize("world_size, layout, causal, kernels", SIMULATED)
def test_simulated_ring_matches_float64_attention(world_size, layout, causal, kernels):
    c = compare.case(B=2, Hq=4, Hkv=2, n_local=4, causal=causal, layout=layout, kernels=kernels)
    q, k, v, do = compare.inputs(c, world_size)
    expected = compare.reference_grads(q, k, v, do, causal)
    o, grads = ring.simulate_attention(q, k, v, world_size, causal=causal, layout=layout, kernels=kernels, do=do)
    for name, got, want in zip(compare.RESULTS, (o, *grads), expected, strict=True):
        assert rel_error(got, want) < TOLERANCE, name


def test_simulated_ring_in_float16():
    c = compare.case(B=1, Hq=2, Hkv=1, n_local=8, causal=True, layout="zigzag", dtype="float16")
    q, k, v, do = compare.inputs(c, 3)
    expected = compare.reference_grads(q, k, v, do, True)
    o, grads = ring.simulate_attention(q, k, v, 3, causal=True, layout="zigzag", do=do)
    o1, lse1 = steps.get(None).forward(q, k, v, causal=True, scale=q.shape[-1] ** -0.5)
    single = [o1, *steps.get(None).backward(q, k, v, o1, lse1, do, causal=True, scale=q.shape[-1] ** -0.5)]
    for name, got, one, want in zip(compare.RESULTS, (o, *grads), single, expected, strict=True):
        assert got.dtype == torch.float16
        assert rel_error(got, want) < 3 * rel_error(one, want) + 1e-3, name  # as close as one process gets


def test_ring_steps_keep_their_running_sums_in_float32():
    """Float16 shards: each rank's forward returns its output and lse in float32, its backward dq, dk and dv in float32
    (the sums over the W steps; rounding them to float16 at every step would lose precision), and they match
    float64 attention."""
    W, n, layout = 4, 4, "zigzag"
    c = compare.case(B=1, Hq=2, Hkv=1, n_local=n, causal=True, layout=layout, dtype="float16")
    q, k, v, do = compare.inputs(c, W)
    expected = compare.reference_grads(q, k, v, do, True)
    kernels, scale = steps.get(None), q.shape[-1] ** -0.5
    shards = [[layouts.local_rows(t, r, W, layout) for t in (q, k, v, do)] for r in range(W)]
    plans = [step_plan(r, W, n, causal=True, layout=layout) for r in range(W)]
    forward = ring.simulate([ring.forward_steps(*sh[:3], plan, scale, kernels)
                             for sh, plan in zip(shards, plans, strict=True)])
    backward = ring.simulate([ring.backward_steps(*sh[:3], o.half(), lse, sh[3], plan, scale, kernels)
                              for sh, (o, lse), plan in zip(shards, forward, plans, strict=True)])
    for rank, results in enumerate(zip(forward, backward, strict=True)):
        assert [t.dtype for part in results for t in part] == [torch.float32] * 5, rank
    got = [layouts.gather_rows([res[i] for res in results], layout) for results, i in
           ((forward, 0), (backward, 0), (backward, 1), (backward, 2))]
    for name, x, want in zip(compare.RESULTS, got, expected, strict=True):
        assert rel_error(x, want) < 3e-3, name  # float16 inputs (tests/helpers.py: TOL[float16])


def test_simulated_ring_refuses_a_sequence_it_cannot_cut():
    q = torch.randn(1, 2, 12, 16, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="multiple of 8; got N=12"):
        ring.simulate_attention(q, q, q, 4, layout="zigzag")


def test_no_process_group_is_a_clear_error():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="no process group is initialised"):
        ring_attention(q, q, q)
    with pytest.raises(ValueError, match="no process group"):
        shard(q, 2, "zigzag")


# --- the ring on 2 and 3 gloo processes --------------------------------------------------------------------------

CASES = [compare.case(B=1, layout=layout, causal=causal, Hq=2, Hkv=hkv, n_local=10)
         for (layout, causal), hkv in zip(itertools.product(layouts.LAYOUTS, (False, True)), (2, 1, 1, 2), strict=True)]
CASES += [compare.case(B=1, layout="zigzag", causal=True, Hq=2, Hkv=1, n_local=10, kernels="fast", seed=1)]
RUNS = {}


def _run(world_size):
    if world_size not in RUNS:
        t0 = time.perf_counter()
        RUNS[world_size] = (processes.run_gloo(compare.suite, world_size, CASES, timeout=150),
                            time.perf_counter() - t0)
    return RUNS[world_size]


@pytest.mark.parametrize("world_size", (2, 3))
@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{c['layout']}-{'causal' if c['causal'] else 'full'}-Hq{c['Hq']}Hkv{c['Hkv']}-"
                              f"{c['kernels'] or 'default'}" for c in CASES])
def test_every_rank_matches_one_process(world_size, index):
    results, _ = _run(world_size)
    for rank, got in enumerate(results):
        row = got["cases"][index]
        for name in compare.RESULTS:
            assert row["ring"][name] < TOLERANCE, (rank, name, row["ring"])
            assert row["gathered"][name] < TOLERANCE, (rank, name, row["gathered"])  # unshard, on every rank
        assert row["positions"] == layouts.positions(rank, world_size, 10, CASES[index]["layout"])


@pytest.mark.parametrize("world_size", (2, 3))
def test_zigzag_ranks_compute_the_same_scores(world_size):
    """The scores each rank's kernels computed (from the calls the ring made): equal under zigzag, growing with
    the rank under the contiguous layout."""
    results, _ = _run(world_size)

    def scores(layout):
        index = next(i for i, c in enumerate(CASES) if c["layout"] == layout and c["causal"] and c["kernels"] is None)
        return [sum(L * (L + 1) // 2 if causal else L * S for L, S, causal in got["cases"][index]["calls"])
                for got in results]

    n = 10
    assert scores("zigzag") == [n * (n + 1) // 2 + (world_size - 1) * n * n // 2] * world_size
    assert scores("contiguous") == [n * (n + 1) // 2 + r * n * n for r in range(world_size)]


REFUSALS = {  # bad input -> (error type, what every rank's message must say)
    "lengths differ": ("ValueError", r"same shard length n.*rank 0: shard length n = 8; rank 1: shard length n = 10"),
    "bad layout": ("ValueError", "layout must be one of 'contiguous', 'zigzag', got 'zig-zag'"),
    "layout on one rank": ("ValueError", "same layout.*rank 0: layout = zigzag"),
    "causal on one rank": ("ValueError", "same causal.*rank 0: causal = True"),
    "odd zigzag shard": ("ValueError", "shard length must be even; got n=7"),
    "not a tensor on one rank": ("TypeError", "rank 0: q must be a torch.Tensor, got list"),
    "bfloat16": ("TypeError", "bfloat16 is refused in interpreter mode"),
    "shard: N not divisible": ("ValueError", "length must be a multiple of"),
    "unshard: shapes differ": ("ValueError", "same size of dim 2.*rank 0: size of dim 2 = 4"),
}


@pytest.mark.parametrize("world_size", (2, 3))
@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_bad_input_raises_on_every_rank(world_size, name):
    results, _ = _run(world_size)
    refusals = [got["refusals"] for got in results]
    kind, message = REFUSALS[name]
    for rank, got in enumerate(refusals):
        assert got[name] is not None, (rank, name)
        assert got[name][0] == kind, (rank, got[name])
        assert re.search(message, got[name][1]), (rank, got[name][1])
    assert all(got["good call"] == [1, 2, 8, 16] for got in refusals)  # and the group still works afterwards


def ring_extras(rank, world_size):
    """Run by each gloo process (:func:`_extras`): a scale other than 1/sqrt(D), the forward without autograd,
    shard and unshard along dim 1, and bad inputs on one rank that ``compare.refusals`` does not try."""
    c = compare.case(B=1, Hq=2, Hkv=1, n_local=6, causal=True, layout="zigzag")
    q, k, v, do = compare.inputs(c, world_size)
    scale = 0.3
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o64 = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True, scale=scale, enable_gqa=True)
    o64.backward(do.double())
    local = [shard(t, 2, "zigzag").requires_grad_() for t in (q, k, v)]
    o = ring_attention(*local, causal=True, scale=scale, layout="zigzag")
    o.backward(shard(do, 2, "zigzag"))
    pairs = zip(compare.RESULTS, (o.detach(), *(t.grad for t in local)), (o64.detach(), q64.grad, k64.grad, v64.grad),
                strict=True)
    errors = {f"{name}, scale {scale}": rel_error(x, shard(r, 2, "zigzag")) for name, x, r in pairs}
    with torch.no_grad():
        o_plain = ring_attention(*(t.detach() for t in local), causal=True, layout="zigzag")
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)
    errors["o without autograd"] = rel_error(o_plain, shard(want, 2, "zigzag"))

    x = torch.randn(2, 6 * world_size, 3, 4, generator=torch.Generator().manual_seed(2))  # (B, N, H, D)
    mine = shard(x, 1, "zigzag")
    sharding = {"shard": torch.equal(mine, x[:, layouts.positions(rank, world_size, 6, "zigzag")]),
                "unshard": torch.equal(unshard(mine, 1, "zigzag"), x)}

    gen = torch.Generator().manual_seed(1)
    good = [torch.randn(1, 2, 8, 16, generator=gen) for _ in range(3)]
    refusals = {
        "scale on one rank": compare._attempt(lambda: ring_attention(*good, scale=0.3 if rank == 0 else None)),
        "dtype on one rank": compare._attempt(lambda: ring_attention(*(t.half() if rank == 0 else t for t in good))),
        "key/value heads on one rank": compare._attempt(lambda: ring_attention(
            good[0], *(t[:, :1] if rank == 0 else t for t in good[1:]))),
        "q and k lengths differ": compare._attempt(lambda: ring_attention(good[0], good[1][:, :, :6],
                                                                          good[2][:, :, :6])),
    }
    return {"errors": errors, "sharding": sharding, "refusals": refusals}


EXTRAS = {}


def _extras():
    """:func:`ring_extras` on 3 gloo processes, once."""
    if not EXTRAS:
        EXTRAS["results"] = processes.run_gloo(ring_extras, 3, timeout=120)
    return EXTRAS["results"]


def test_custom_scale_and_forward_without_autograd_match_float64():
    for rank, got in enumerate(_extras()):
        for name, error in got["errors"].items():
            assert error < TOLERANCE, (rank, name, error)


def test_shard_and_unshard_along_another_dim():
    for rank, got in enumerate(_extras()):
        assert got["sharding"] == {"shard": True, "unshard": True}, rank


MORE_REFUSALS = {
    "scale on one rank": r"same scale.*rank 0: scale = 0.3",
    "dtype on one rank": r"same dtype.*rank 0: dtype = torch.float16",
    "key/value heads on one rank": r"same key/value heads.*rank 0: key/value heads = 1",
    "q and k lengths differ": r"shards of one sequence, of one length n",
}


@pytest.mark.parametrize("name", sorted(MORE_REFUSALS))
def test_more_bad_inputs_raise_on_every_rank(name):
    for rank, got in enumerate(_extras()):
        assert got["refusals"][name] is not None, (rank, name)
        assert got["refusals"][name][0] == "ValueError", (rank, got["refusals"][name])
        assert re.search(MORE_REFUSALS[name], got["refusals"][name][1]), (rank, got["refusals"][name][1])


@pytest.mark.parametrize("world_size", (2, 3))
def test_processes_stay_within_budget(world_size):
    """Each world size's run (every case, then the refusals) takes well under its timeout."""
    assert _run(world_size)[1] < 75


# --- the process runner ------------------------------------------------------------------------------------------


def test_run_gloo_refuses_functions_it_cannot_import():
    with pytest.raises(ValueError, match="import fn by name"):
        processes.run_gloo(lambda rank, world_size: rank, 2)


def test_a_failing_rank_stops_the_run_instead_of_hanging():
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="(?s)rank 1 of 2 raised:.*rank 1 fails on purpose"):
        processes.run_gloo(compare.fail_on_rank_one, 2, timeout=60)
    assert time.perf_counter() - t0 < 30  # rank 0 was waiting in a collective: stopped, not waited for
