"""Ring attention on several GPUs (issue 33): correctness, scaling efficiency, PyTorch's context_parallel side by
side, and a profiler timeline of the overlap, in one call.

    PYTHONPATH=$PWD torchrun --standalone --nproc_per_node=2 tools/gpu/ring/run.py          # 2 H200s (~5-8 min)
    PYTHONPATH=$PWD torchrun --standalone --nproc_per_node=2 tools/gpu/ring/run.py --cpu    # gloo, interpreter, tiny
    ... run.py --cpu --quick                                                               # fewer cases (the tests)
    PYTHONPATH=$PWD python tools/gpu/ring/run.py --merge OUT/ring_multi_gpu.json   # then: into figures/data/

NVLink multicast stays off: this script sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 in its own environment before torch starts, and refuses to start if any is set to another
value.

1. correctness: every rank's output and gradients (ring_attention, forward and backward) against one GPU's ``fast``
   on the whole sequence and against float64 attention (the first K/V head and its query heads), fp16 and bf16,
   contiguous and zigzag, causal and not, H=32 with 32 or 8 K/V heads, N_local 8192; then zigzag causal fp16 at
   N_local 32768 (N = W·32768: the largest this run also computes whole on one GPU; against that GPU only, the
   float64 scores of a head would take N² · 8 bytes); then N_local 131072, where
   the whole sequence is only checked on sampled query rows (o and dq of those rows against float64: a row's dq
   needs only its own scores; dk, dv need every row and are not checked there). One H200 would still hold that
   attention in memory (``fast`` stores O(N)); what it cannot do in this run's time is the whole reference.
2. scaling: ring forward and forward+backward on W GPUs (the slowest rank's time, median of interleaved rounds)
   against ``fast`` on one GPU for the whole problem, N_local 8192 and 32768, D 128, H 32, fp16: efficiency =
   one GPU's time / (W × the W-GPU time), as ring-flash-attention measures it. Targets (issue 33): >= 0.85
   forward+backward zigzag causal, >= 0.90 not causal, at N_local 32768 on 2 GPUs.
3. context_parallel: torch.distributed.tensor.experimental.context_parallel (ring attention over SDPA) on the same
   problems, both rotate methods: forward+backward time and peak memory, next to ours, and its output against ours.
Phases run in this order (after the N_local 8192 checks: scaling and context_parallel, the timeline, then the two
larger checks); past RING_BUDGET_S seconds (default 520) the rest is skipped and listed under "skipped".

4. overlap: a torch.profiler timeline of one zigzag causal forward+backward at N_local 32768 on every rank
   ($OUT/ring_trace_rank<r>.json): how much of the NCCL kernels' time runs under compute kernels.

Rank 0 writes $OUT/ring_multi_gpu.json (the measurement ``ring_multi_gpu`` that notebook 16 reads, with the GPU
count, NCCL version and ``nvidia-smi topo -m`` in its provenance) and prints a summary.
"""

from __future__ import annotations

import os
import sys

REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def guard_environment(env=os.environ) -> None:
    """Set the three variables that keep NVLink multicast off; refuse (SystemExit) if one is set otherwise."""
    for key, value in REQUIRED_ENV.items():
        if env.get(key, value) != value:
            raise SystemExit(f"run.py refuses to start: {key}={env[key]!r}, and this run keeps NVLink multicast off "
                             f"({key}={value}); unset it or set it to {value}")
        env[key] = value


guard_environment()
CPU = "--cpu" in sys.argv
if CPU:  # before torch and flashattn: Triton reads TRITON_INTERPRET when the kernels are defined
    os.environ.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")

import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

OUT = Path(os.environ.get("OUT", "probe_out"))
GPU = dict(dtypes=("float16", "bfloat16"), H=32, Hkv=(32, 8), D=128, n_check=8192, n_large=32768, n_beyond=131072,
           sampled_rows=64, n_scaling=(8192, 32768), rounds=3)
TINY = dict(dtypes=("float32", "float16"), H=2, Hkv=(2, 1), D=16, n_check=8, n_large=16, n_beyond=32,
            sampled_rows=4, n_scaling=(8, 16), rounds=2)
QUICK = dict(TINY, dtypes=("float32",), Hkv=(1,), n_scaling=(8,), rounds=1,  # --cpu --quick: the tests' run
             context_parallel=False)
TARGETS = {True: 0.85, False: 0.90}  # forward+backward efficiency at N_local 32768 on 2 GPUs: causal (zigzag), not
LOG = []


def log(line: str) -> None:
    if dist.get_rank() == 0:
        print(line, flush=True)
        LOG.append(line)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seeded(shape, dtype, seed, device):
    """The same random tensor on every rank (a seeded generator on this rank's device)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def problem(B, H, Hkv, N, D, dtype, seed, device):
    return (seeded((B, H, N, D), dtype, seed, device), seeded((B, Hkv, N, D), dtype, seed + 1, device),
            seeded((B, Hkv, N, D), dtype, seed + 2, device), seeded((B, H, N, D), dtype, seed + 3, device))


def max_over_ranks(values: dict, device) -> dict:
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(values, t.tolist(), strict=True))


def ring_fwd_bwd(q, k, v, do, causal, layout):
    """This rank's output and gradients through ``ring_attention`` (q, k, v: this rank's shards)."""
    from flashattn.distributed import ring_attention

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = ring_attention(*leaves, causal=causal, layout=layout)
    o.backward(do)
    return [o.detach(), *(t.grad for t in leaves)]


def single_fwd_bwd(q, k, v, do, causal):
    """One GPU (this rank's): the ring's own kernels on the whole sequence."""
    from flashattn.distributed import steps

    kernels, scale = steps.get(None), q.shape[-1] ** -0.5
    o, lse = kernels.forward(q, k, v, causal=causal, scale=scale)
    return [o, *kernels.backward(q, k, v, o, lse, do, causal=causal, scale=scale)]


def float64_heads(q, k, v, do, causal):
    """Float64 output and gradients of the first K/V head and its query heads."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t[:, :n].double().requires_grad_() for t, n in ((q, group), (k, 1), (v, 1)))
    o64 = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, enable_gqa=group > 1)
    o64.backward(do[:, :group].double())
    return [o64.detach(), q64.grad, k64.grad, v64.grad], group


def check_case(dtype_name, layout, causal, H, Hkv, n_local, D, device, seed, float64: bool = True) -> dict:
    """Every rank's output and gradients against one GPU on the whole sequence, and (``float64``) both against
    float64 attention of the first K/V head and its query heads. Without ``float64`` (a sequence whose float64
    scores would not fit: N² numbers per head), ``ok`` asks the ring to agree with one GPU within 1e-2 (16-bit
    rounding is ~1e-3; a wrong step or merge is off by far more); ``check_beyond`` then compares sampled rows
    with float64."""
    from flashattn.distributed import shard
    from flashattn.reference import rel_error

    W, dtype = dist.get_world_size(), getattr(torch, dtype_name)
    q, k, v, do = problem(1, H, Hkv, W * n_local, D, dtype, seed, device)
    mine = ring_fwd_bwd(*(shard(t, 2, layout) for t in (q, k, v)), shard(do, 2, layout), causal, layout)
    one = single_fwd_bwd(q, k, v, do, causal)
    names, keys = ("o", "dq", "dk", "dv"), ["ring_vs_single"]
    errors = {f"ring_vs_single.{name}": rel_error(x, shard(single, 2, layout))
              for name, x, single in zip(names, mine, one, strict=True)}
    if float64:
        keys += ["ring_vs_float64", "single_vs_float64"]
        ref, group = float64_heads(q, k, v, do, causal)
        for name, x, single, r, h in zip(names, mine, one, ref, [group, group, 1, 1], strict=True):
            errors[f"ring_vs_float64.{name}"] = rel_error(x[:, :h], shard(r, 2, layout))
            errors[f"single_vs_float64.{name}"] = rel_error(single[:, :h], r)
        del ref
    errors = max_over_ranks(errors, device)
    row = {"dtype": dtype_name, "layout": layout, "causal": causal, "Hq": H, "Hkv": Hkv, "N": W * n_local,
           "n_local": n_local, **{key: {n: errors[f"{key}.{n}"] for n in names} for key in keys}}
    if float64:
        row["ok"] = all(row["ring_vs_float64"][n] <= 3 * row["single_vs_float64"][n] + 1e-4 for n in names)
    else:
        row["ok"] = all(row["ring_vs_single"][n] < 1e-2 for n in names)
    del q, k, v, do, mine, one
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def check_beyond(n_local, H, Hkv, D, rows, device, seed) -> dict:
    """Zigzag causal fp16 (fp32 on the CPU) at N = W·n_local: o and dq of ``rows`` sampled query rows per rank."""
    from flashattn.distributed import layouts, shard
    from flashattn.reference import rel_error

    W, rank = dist.get_world_size(), dist.get_rank()
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    q, k, v, do = problem(1, H, Hkv, W * n_local, D, dtype, seed, device)
    o, dq, _, _ = ring_fwd_bwd(*(shard(t, 2, "zigzag") for t in (q, k, v)), shard(do, 2, "zigzag"), True, "zigzag")
    positions = torch.tensor(layouts.positions(rank, W, n_local, "zigzag"), device=device)
    pick = torch.linspace(0, n_local - 1, rows, device=device).round().long()  # local rows, early and late
    group = H // Hkv
    q64 = q[:, :group, positions[pick]].double().requires_grad_()
    k64, v64 = k[:, :1].double(), v[:, :1].double()
    scores = (q64 @ k64.transpose(-1, -2).expand(1, group, -1, -1)) * D ** -0.5
    scores = scores.masked_fill(torch.arange(W * n_local, device=device)[None, :] > positions[pick][:, None],
                                float("-inf"))
    o64 = torch.softmax(scores, -1) @ v64
    o64.backward(do[:, :group, positions[pick]].double())
    errors = max_over_ranks({"o": rel_error(o[:, :group, pick], o64), "dq": rel_error(dq[:, :group, pick], q64.grad)},
                            device)
    return {"N": W * n_local, "n_local": n_local, "layout": "zigzag", "causal": True, "dtype": str(dtype)[6:],
            "sampled_rows_per_rank": rows, "ring_vs_float64": errors, "ok": max(errors.values()) < 1e-2}


def time_rounds(fns: dict, device, rounds: int) -> dict:
    """Median ms of each function over interleaved rounds; every rank times, the slowest rank's time is kept."""
    for fn in fns.values():  # warm up: compile, tune
        fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append((time.perf_counter() - t0) * 1e3)
    return max_over_ranks({name: statistics.median(t) for name, t in times.items()}, device)


def peak_bytes(fn, device) -> float:
    if device.type != "cuda":
        return float("nan")
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    _sync(device)
    return float(torch.cuda.max_memory_allocated(device) - before)


def scaling(n_local, causal, cfg, device) -> tuple[dict, dict]:
    """Ring forward and forward+backward on W devices against one device on the whole problem."""
    from flashattn.distributed import shard

    W, layout = dist.get_world_size(), "zigzag" if causal else "contiguous"
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    q, k, v, do = problem(1, cfg["H"], cfg["H"], W * n_local, cfg["D"], dtype, 7, device)
    local = [shard(t, 2, layout) for t in (q, k, v, do)]

    def forward():
        from flashattn.distributed import ring_attention

        with torch.no_grad():
            ring_attention(*local[:3], causal=causal, layout=layout)

    ring = time_rounds({"forward": forward, "forward_backward": lambda: ring_fwd_bwd(*local, causal, layout)},
                       device, cfg["rounds"])
    ours_peak = max_over_ranks({"peak": peak_bytes(lambda: ring_fwd_bwd(*local, causal, layout), device)},
                               device)["peak"]
    one = {}
    if dist.get_rank() == 0:  # one GPU, the whole problem (the others wait)
        from flashattn.distributed import steps

        kernels, scale = steps.get(None), cfg["D"] ** -0.5
        fns = {"forward": lambda: kernels.forward(q, k, v, causal=causal, scale=scale),
               "forward_backward": lambda: single_fwd_bwd(q, k, v, do, causal)}
        for fn in fns.values():
            fn()
        for name, fn in fns.items():
            times = []
            for _ in range(cfg["rounds"]):
                _sync(device)
                t0 = time.perf_counter()
                fn()
                _sync(device)
                times.append((time.perf_counter() - t0) * 1e3)
            one[name] = statistics.median(times)
    dist.barrier()
    shared = [one]
    dist.broadcast_object_list(shared, src=0)
    one = shared[0]
    row = {"n_local": n_local, "N": W * n_local, "layout": layout, "causal": causal, "H": cfg["H"], "D": cfg["D"],
           "dtype": str(dtype)[6:], "ring_forward_ms": ring["forward"],
           "ring_forward_backward_ms": ring["forward_backward"], "one_gpu_forward_ms": one["forward"],
           "one_gpu_forward_backward_ms": one["forward_backward"], "ours_peak_bytes": ours_peak,
           "efficiency_forward": one["forward"] / (W * ring["forward"]),
           "efficiency_forward_backward": one["forward_backward"] / (W * ring["forward_backward"])}
    if n_local == max(cfg["n_scaling"]) and W == 2:
        row["target_forward_backward"] = TARGETS[causal]
        row["meets_target"] = row["efficiency_forward_backward"] >= TARGETS[causal]
    return row, {"local": local}


_MESHES = {}


def context_parallel_row(n_local, causal, cfg, device, ours_row, local) -> list[dict]:
    """PyTorch's context_parallel (ring attention over SDPA) on the same problem, each rotate method."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

    from flashattn.distributed import ring_attention
    from flashattn.reference import rel_error

    W = dist.get_world_size()
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    if device.type not in _MESHES:
        _MESHES[device.type] = init_device_mesh(device.type, (W,))
    mesh = _MESHES[device.type]
    rows = []
    for rotate in ("allgather", "alltoall"):
        row = {"n_local": n_local, "causal": causal, "rotate": rotate, **{k: ours_row[k] for k in (
            "ours_peak_bytes", "ring_forward_backward_ms", "ring_forward_ms")}}
        row["ours_forward_backward_ms"] = ours_row["ring_forward_backward_ms"]
        saved_balance = _cp_options.enable_load_balance
        try:
            set_rotate_method(rotate)
            _cp_options.enable_load_balance = causal  # torch refuses load balancing without a causal mask
            q, k, v, do = problem(1, cfg["H"], cfg["H"], W * n_local, cfg["D"], dtype, 7, device)
            with context_parallel(mesh, buffers=[q, k, v, do], buffer_seq_dims=[2, 2, 2, 2]):
                def step(q=q, k=k, v=v, do=do):
                    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                    out.backward(do)
                    return out.detach()

                def forward(q=q, k=k, v=v):
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                theirs = step()
                with torch.no_grad():
                    ours = ring_attention(*local[:3], causal=causal, layout="zigzag" if causal else "contiguous")
                row["torch_vs_ours"] = max_over_ranks({"o": rel_error(theirs, ours)}, device)["o"]
                t = time_rounds({"forward": forward, "forward_backward": step}, device, cfg["rounds"])
                row["torch_forward_ms"], row["torch_forward_backward_ms"] = t["forward"], t["forward_backward"]
                row["torch_peak_bytes"] = max_over_ranks({"p": peak_bytes(step, device)}, device)["p"]
        except Exception as err:  # noqa: BLE001  (recorded: one failing comparison must not lose the run)
            row["error"] = f"{type(err).__name__}: {err}"[:500]
        finally:
            _cp_options.enable_load_balance = saved_balance
        rows.append(row)
    return rows


def overlap(n_local, cfg, device, local) -> dict:
    """A profiler timeline of one zigzag causal forward+backward; the share of NCCL kernel time under compute."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    ring_fwd_bwd(*local, True, "zigzag")
    _sync(device)
    with profile(activities=activities) as prof:
        ring_fwd_bwd(*local, True, "zigzag")
        _sync(device)
    path = OUT / f"ring_trace_rank{dist.get_rank()}.json"
    prof.export_chrome_trace(str(path))
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    comm = [(e.time_range.start, e.time_range.end) for e in kernels if "nccl" in e.name.lower()]
    compute = [(e.time_range.start, e.time_range.end) for e in kernels if "nccl" not in e.name.lower()]
    comm_us, compute_us = _union(comm), _union(compute)
    hidden_us = _intersection(comm, compute)
    values = max_over_ranks({"comm_ms": comm_us / 1e3, "compute_ms": compute_us / 1e3,
                             "exposed_comm_ms": (comm_us - hidden_us) / 1e3}, device)
    return {"n_local": n_local, "layout": "zigzag", "causal": True, "trace": path.name, **values,
            "hidden_fraction": 1 - values["exposed_comm_ms"] / values["comm_ms"] if values["comm_ms"] else None,
            "notes": "NCCL kernels include the time they wait for the peer; hidden = under a compute kernel"}


def _merged(intervals):
    out = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _union(intervals) -> float:
    return sum(hi - lo for lo, hi in _merged(intervals))


def _intersection(a, b) -> float:
    a, b, total, i, j = _merged(a), _merged(b), 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def provenance(device) -> dict:
    import triton

    def shell(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError) as err:
            return f"unavailable ({type(err).__name__})"

    cuda = device.type == "cuda"
    return {"world_size": dist.get_world_size(), "backend": dist.get_backend(),
            "gpu": torch.cuda.get_device_name(device) if cuda else "none (CPU, gloo)",
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "topology": shell(["nvidia-smi", "topo", "-m"]) if cuda else None,
            "driver": shell(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if cuda else None,
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "env": {k: os.environ.get(k) for k in REQUIRED_ENV},
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "torchrun --nproc_per_node=" + str(dist.get_world_size()) + " " + " ".join(sys.argv)}


def main() -> int:
    cfg = (QUICK if "--quick" in sys.argv else TINY) if CPU else GPU
    if CPU:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=device)
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result = {"run_provenance": provenance(device), "correctness": [], "beyond": [], "scaling": [],
              "context_parallel": [], "overlap": None}
    log(f"[ring] {result['run_provenance']['world_size']} × {result['run_provenance']['gpu']}, "
        f"NCCL {result['run_provenance']['nccl']}")
    budget = float(os.environ.get("RING_BUDGET_S", "520"))  # a run tool call is cut at 600 s
    result["skipped"] = []

    def within_budget(what: str) -> bool:
        if time.perf_counter() - t0 < budget:
            return True
        result["skipped"].append(what)
        log(f"[budget] skipped {what}: {time.perf_counter() - t0:.0f} s of {budget:.0f} s used")
        return False

    seed = 0
    for dtype in cfg["dtypes"]:
        for layout in ("contiguous", "zigzag"):
            for causal in (False, True):
                for Hkv in cfg["Hkv"]:
                    seed += 10
                    row = check_case(dtype, layout, causal, cfg["H"], Hkv, cfg["n_check"], cfg["D"], device, seed)
                    result["correctness"].append(row)
                    log(f"[check] {dtype:9} {layout:10} {'causal' if causal else 'full':6} Hkv={Hkv:<2} "
                        f"N={row['N']}: ring vs one GPU " + " ".join(f"{x} {row['ring_vs_single'][x]:.1e}"
                                                                     for x in ("o", "dq", "dk", "dv"))
                        + f" {'ok' if row['ok'] else 'NOT OK'} ({time.perf_counter() - t0:.0f} s)")
    last_local = None
    for n_local in sorted(cfg["n_scaling"], reverse=True):  # the targets' N_local first
        for causal in (True, False):
            if not within_budget(f"scaling and context_parallel at N_local={n_local}, causal={causal}"):
                continue
            row, extra = scaling(n_local, causal, cfg, device)
            result["scaling"].append(row)
            log(f"[scaling] N_local={n_local} {row['layout']:10} {'causal' if causal else 'full':6}: ring "
                f"{row['ring_forward_ms']:.2f} / {row['ring_forward_backward_ms']:.2f} ms, one GPU "
                f"{row['one_gpu_forward_ms']:.2f} / {row['one_gpu_forward_backward_ms']:.2f} ms: efficiency "
                f"{row['efficiency_forward']:.2f} / {row['efficiency_forward_backward']:.2f}"
                + (f" (target {row['target_forward_backward']}: {'met' if row['meets_target'] else 'NOT met'})"
                   if "target_forward_backward" in row else "") + f" ({time.perf_counter() - t0:.0f} s)")
            if cfg.get("context_parallel", True):
                cp_rows = context_parallel_row(n_local, causal, cfg, device, row, extra["local"])
            else:  # on the CPU torch's context_parallel fails anyway (it dispatches SDPA's CUDA kernels), slowly
                cp_rows = [{"n_local": n_local, "causal": causal, "rotate": rotate,
                            "error": "skipped (--cpu --quick): context_parallel needs CUDA"}
                           for rotate in ("allgather", "alltoall")]
            result["context_parallel"].extend(cp_rows)
            for cp in cp_rows:
                log(f"[context_parallel] N_local={n_local} {'causal' if causal else 'full'} {cp['rotate']}: "
                    + (cp["error"] if "error" in cp else
                       f"{cp['torch_forward_backward_ms']:.2f} ms (ours {cp['ours_forward_backward_ms']:.2f}), peak "
                       f"{cp['torch_peak_bytes'] / 2**30:.2f} GiB (ours {cp['ours_peak_bytes'] / 2**30:.2f}), "
                       f"vs ours {cp['torch_vs_ours']:.1e}") + f" ({time.perf_counter() - t0:.0f} s)")
            if causal and n_local == max(cfg["n_scaling"]):
                last_local = extra["local"]
    if last_local is not None and within_budget("the profiler timeline"):
        result["overlap"] = overlap(max(cfg["n_scaling"]), cfg, device, last_local)
        log(f"[overlap] {result['overlap']} ({time.perf_counter() - t0:.0f} s)")
    del last_local
    if within_budget(f"the check at N_local={cfg['n_large']}"):
        row = check_case(cfg["dtypes"][0], "zigzag", True, cfg["H"], cfg["Hkv"][0], cfg["n_large"], cfg["D"], device,
                         999, float64=False)
        result["correctness"].append(row)
        log(f"[check] largest whole: N={row['N']} {'ok' if row['ok'] else 'NOT OK'} ({time.perf_counter() - t0:.0f} s)")
    if within_budget(f"the sampled check at N_local={cfg['n_beyond']}"):
        result["beyond"].append(check_beyond(cfg["n_beyond"], cfg["H"], cfg["Hkv"][0], cfg["D"], cfg["sampled_rows"],
                                             device, 1234))
        log(f"[check] beyond: N={result['beyond'][-1]['N']} sampled rows {result['beyond'][-1]['ring_vs_float64']} "
            f"({time.perf_counter() - t0:.0f} s)")
    result["seconds"] = time.perf_counter() - t0
    if dist.get_rank() == 0:
        (OUT / "ring_multi_gpu.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        (OUT / "log.txt").write_text("\n".join(LOG) + "\n")
        print(f"[ring] wrote {OUT / 'ring_multi_gpu.json'} in {result['seconds']:.0f} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def merge(path: Path) -> int:
    """Put a run's JSON into figures/data/<gpu>.json as the measurement ``ring_multi_gpu`` (the lead's step)."""
    from flashattn.measure.recorded import DATA_DIR
    from flashattn.record import slug

    run = json.loads(Path(path).read_text())
    target = DATA_DIR / f"{slug(run['run_provenance']['gpu'])}.json"
    doc = json.loads(target.read_text())
    run["recorded_at"] = run["run_provenance"]["date"]
    doc["measurements"]["ring_multi_gpu"] = run
    target.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"merged {path} into {target} as ring_multi_gpu")
    return 0


if __name__ == "__main__":
    if "--merge" in sys.argv:
        sys.exit(merge(Path(sys.argv[sys.argv.index("--merge") + 1])))
    sys.exit(main())
