"""GPU probe for who merges attention_with_kvcache's splits (issue 31): the merge kernel, a second launch, against
the last split program of each row block (decode_plan.MERGE = "last program": a ticket counter, one launch).

    OUT=... python tools/gpu/decode/merge.py      # about 2 minutes on an H200

1. correctness of the last program's merge at full size: fp16 and bf16, 32/8 and 32/32 heads, a 128k cache,
   contiguous and in shuffled pages, ragged lengths, Lq = 1 and 4, causal and not, 4 to 128 splits, against
   float64 (probe.check) and against the merge kernel's output; then one call captured in a CUDA graph and
   replayed 200 times with new lengths and queries written into its inputs each time (the tickets must be back at
   0 after every replay), against the same call made eagerly. (Its first run, 2026-12-03, compared the replays with
   the merge kernel's fp16 output instead and counted its 2.7e-5 as bad: the two merges sum in other orders.)
2. timing at the cells where decode_vs_sdpa (2026-12-03 09:25) is short of SDPA or of 1.25× SDPA (fp16, D = 128,
   Lq = 1, a full contiguous cache): both merges at the rule's number of splits and around it, and SDPA, each as a
   CUDA-graph replay (the GPU's time, as decode_vs_sdpa's replayed columns) and as a call, in interleaved rounds.
$OUT/decode_merge.json holds every number. Without a GPU: a dry run of its plumbing at tiny sizes in the
interpreter (no graphs).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import probe  # noqa: E402  (this folder's probe: its timer, interleaved rounds, check and log)
from probe import DEV, DRY, OUT, log  # noqa: E402

from flashattn import runtime  # noqa: E402
from flashattn.kernels import decode  # noqa: E402
from flashattn.measure.measurements.decode import cuda_graph_replay  # noqa: E402
from flashattn.reference import rel_error  # noqa: E402

MERGES = ("kernel", "last program")
# (B, Hkv, S, split choices besides the rule's)
CELLS = [(1, 8, 1024, (4, 8, 16)), (1, 8, 4096, (8, 16, 32)), (1, 32, 1024, (2, 4, 8)), (4, 8, 1024, (2, 4, 8)),
         (1, 32, 4096, (4, 8)), (4, 8, 4096, (4, 8)), (1, 8, 16384, (16, 32)), (1, 8, 32768, (16, 32)),
         (4, 32, 1024, (1, 2)), (16, 8, 1024, (1, 2)), (1, 8, 131072, (16,)), (1, 32, 131072, (4,)),
         (16, 32, 1024, (1, 2, 3)), (64, 8, 1024, (1, 2, 3))]  # the last two: 512 programs unsplit (not run yet)


def correctness() -> list[dict]:
    rows = []
    S, page = (128, 32) if DRY else (131072, 256)
    for q, k, v, kp, vp, table, seqlens, causal in probe.ragged_problems(S, page):
        for splits in ((2, 3) if DRY else (4, 16, 128)):
            for paged in (False, True):
                kk, vv, bt = (kp, vp, table) if paged else (k, v, None)
                row = probe.check(q, kk, vv, seqlens, block_table=bt, causal=causal, num_splits=splits,
                                  label=f"last program, {'paged' if paged else 'contiguous'}")
                outs = [decode.decode_attention(q, kk, vv, seqlens, block_table=bt, causal=causal,
                                                num_splits=splits, merge=m) for m in MERGES]
                row["vs_merge_kernel"] = rel_error(outs[1], outs[0])
                row["ok"] = row["ok"] and row["vs_merge_kernel"] < 1e-5
                rows.append(row)
    return rows


def graph_replays(replays: int = 200) -> dict:
    """One call captured; before each replay new lengths and queries are written into its inputs."""
    if DRY:
        return {"skipped": "no GPU"}
    k, v = probe.cache(4, 32768, 8, 128, torch.float16, seed=7)
    q = torch.randn(4, 1, 32, 128, device=DEV, dtype=torch.float16)
    seqlens = torch.tensor([32768, 1000, 17, 20000], dtype=torch.int32, device=DEV)
    out = {}
    replay = cuda_graph_replay(lambda: out.__setitem__("o", decode.decode_attention(q, k, v, seqlens, num_splits=16)))
    gen = torch.Generator(device=DEV).manual_seed(0)
    worst = 0.0
    for _ in range(replays):
        seqlens.copy_(torch.randint(1, 32769, (4,), generator=gen, device=DEV, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=gen, device=DEV, dtype=q.dtype))
        replay()
        eager = decode.decode_attention(q, k, v, seqlens, num_splits=16)  # the same launch, not captured
        worst = max(worst, rel_error(out["o"], eager))
    tickets = [p.tickets for p in decode._PREPARED.values() if p.tickets is not None]
    zero = all(int(t.abs().sum()) == 0 for t in tickets)
    log(f"  {'ok ' if worst < 1e-5 and zero else 'BAD'} {replays} CUDA-graph replays, new lengths and queries each: "
        f"worst rel_error against the eager call {worst:.1e}; tickets back at 0: {zero}")
    return {"replays": replays, "worst_rel_error": worst, "tickets_zero": zero, "ok": worst < 1e-5 and zero}


def time_cell(B: int, Hkv: int, S: int, D: int, choices: tuple, bandwidth: float) -> dict:
    """One cell: SDPA and both merges at each number of splits, replayed and called, in interleaved rounds."""
    k, v = probe.cache(B, S, Hkv, D, torch.float16, seed=S + B)
    Hq = 4 if DRY else 32
    q = torch.randn(B, 1, Hq, D, device=DEV, dtype=torch.float16)
    seqlens = torch.full((B,), S, dtype=torch.int32, device=DEV)
    nbytes = 2 * k.numel() * k.element_size()
    rule = decode.make_plan(B, 1, Hq, Hkv, D, S, torch.float16, 0, q.device).num_splits
    splits = sorted({n for n in (*choices, rule) if 1 <= n <= decode.MAX_SPLITS})
    fns = {("sdpa", 0): lambda: torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=Hkv != Hq)}
    for n in splits:
        for merge in MERGES if n > 1 else ("kernel",):
            fns[(merge, n)] = lambda n=n, merge=merge: decode.decode_attention(q, k, v, seqlens, num_splits=n,
                                                                               merge=merge)
    timed = {}
    for key, fn in fns.items():
        fn()
        timed[("call", *key)] = fn
        if not DRY:
            timed[("replay", *key)] = cuda_graph_replay(fn)
    ms = probe.interleaved(timed)
    for how in ("call",) if DRY else ("call", "replay"):
        sdpa = ms[(how, "sdpa", 0)]
        ratios = "  ".join(f"{m[:4]}×{n} {sdpa / t:.2f}" for (h, m, n), t in ms.items() if h == how and m != "sdpa")
        log(f"  B={B} Hkv={Hkv} S={S} ({how}, rule {rule}): SDPA {sdpa * 1e3:.1f} us "
            f"{nbytes / (sdpa * 1e-3) / 1e9 / bandwidth:.0%}; ×SDPA: {ratios}")
    return dict(B=B, Hkv=Hkv, S=S, D=D, rule=rule, splits=splits, cache_bytes=nbytes,
                ms={"|".join(map(str, key)): t for key, t in ms.items()})


def timing(bandwidth: float) -> list[dict]:
    rows = []
    for B, Hkv, S, choices in CELLS[:2] if DRY else CELLS:
        if probe.over_budget():
            log("(budget reached: the remaining cells are left out)")
            break
        rows.append(time_cell(*((1, 2, 128, 16) if DRY else (B, Hkv, S, 128)), choices, bandwidth))
        if not DRY:
            torch.cuda.empty_cache()
    return rows


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    log(runtime.describe())
    log("1. the last program's merge against float64 and against the merge kernel")
    rows = correctness()
    replays = graph_replays()
    bandwidth = probe.copy_gbps()
    log(f"2. timing (copy bandwidth {bandwidth:.0f} GB/s); per cell the ratio to SDPA of each merge × splits")
    times = timing(bandwidth)
    bad = [r for r in rows if not r["ok"]] + ([replays] if replays.get("ok") is False else [])
    log(f"{len(rows)} checks, {len(bad)} bad; {len(times)} cells timed in {time.perf_counter() - probe.T0:.0f} s; "
        f"median rel_error against the merge kernel {statistics.median(r['vs_merge_kernel'] for r in rows):.1e}")
    (OUT / "decode_merge.json").write_text(json.dumps(dict(bandwidth=bandwidth, correctness=rows, graph=replays,
                                                           timing=times, log=probe.LOG), indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
