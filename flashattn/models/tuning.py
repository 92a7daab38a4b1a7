"""Block sizes, warps and stages on paper: sweep spaces, a shared-memory estimate, pruning, the FA1 rule.

* ``sweep_configs(space)``: every combination of ``block_m``, ``block_n``, ``num_warps``, ``num_stages``;
* ``estimate_shared_bytes(...)``: the shared memory a v2 program needs (Q once, K and V per stage), and
  ``prune_autotune_space(...)``: what an autotuner need not try;
* ``fa1_block_sizes(sram_bytes, D, elem_bytes)``: the FlashAttention-1 paper's rule, Bc = ⌈M / 4d⌉,
  Br = min(Bc, d), and the power-of-two tiles Triton can use;
* ``heatmap_table(rows)``: a sweep's rows as a TFLOP/s grid, failures marked.

Running the sweep and ``triton.autotune`` on a GPU is ``flashattn.measure.autotune``'s job; drawing the
grid is ``flashattn.plots.plot_sweep_heatmap``'s.
"""

from __future__ import annotations

import itertools
import math

from flashattn.validate import TILE_KEYS

# --- the problems and the spaces swept ---------------------------------------------------------

# The two paths of the course (the same problems as 'compiled_layouts' in measurements_hw).
PATHS = {
    "fp16_tc": {"dtype": "float16", "Ds": (64, 128), "B": 4, "H": 16, "N": 4096, "options": {}},
    "fp32_ieee": {"dtype": "float32", "Ds": (32, 64), "B": 4, "H": 16, "N": 2048,
                  "options": {"input_precision": "ieee"}},
}

# What the block sweep tries on each path. The float32 (CUDA-core) space is smaller: its kernels are slow
# and register-hungry, and large tiles only spill.
SWEEP_SPACES = {
    "fp16_tc": {"block_m": (64, 128), "block_n": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3, 4)},
    "fp32_ieee": {"block_m": (32, 64), "block_n": (32, 64), "num_warps": (4, 8), "num_stages": (1, 2)},
}

# The space triton.autotune searches in notebook 08 (before pruning): the one Triton's fused-attention
# tutorial uses, less the 5 and 6 stages, which is also the fp16 sweep's.
AUTOTUNE_SPACE = SWEEP_SPACES["fp16_tc"]


def sweep_configs(space: dict) -> list[dict]:
    """Every combination of the values in ``space`` (keys ``block_m``, ``block_n``, ``num_warps``, ``num_stages``)."""
    missing = [k for k in TILE_KEYS if k not in space]
    if missing:
        raise ValueError(f"space lacks {', '.join(missing)}; it needs {', '.join(TILE_KEYS)}")
    combos = itertools.product(*(space[k] for k in TILE_KEYS))
    return [dict(zip(TILE_KEYS, values, strict=True)) for values in combos]


def config_label(cfg: dict) -> str:
    return f"{cfg['block_m']}×{cfg['block_n']}, {cfg['num_warps']} warps, {cfg['num_stages']} stages"


# --- shared memory and the rule of thumb -------------------------------------------------------

def estimate_shared_bytes(*, block_m: int, block_n: int, d_pad: int, elem_bytes: int, num_stages: int) -> int:
    """Shared memory of one v2 program: the Q tile once, a K and a V tile for each pipeline stage.

    It matches the tensor-core kernels Triton compiles exactly (e.g. fp16, 128×64, D = 64, 3 stages:
    3·(8 + 8) KiB + 16 KiB = 64 KiB). On the float32 CUDA-core path the compiler reuses buffers and adds
    small scratch areas, so there it is an estimate within a few KiB.
    """
    stages = max(1, num_stages)
    return (stages * 2 * block_n + block_m) * d_pad * elem_bytes


def config_dict(config) -> dict:
    """A ``triton.Config`` as the course's option dict."""
    return {"block_m": config.kwargs["BLOCK_M"], "block_n": config.kwargs["BLOCK_N"],
            "num_warps": config.num_warps, "num_stages": config.num_stages}


def prune_configs(configs: list, *, d_pad: int, elem_bytes: int, shared_limit: int) -> list:
    """The configurations (dicts or ``triton.Config``) whose estimated shared memory fits ``shared_limit``.

    Keeps at least one (the smallest), as ``triton.autotune`` requires.
    """
    def shared(c):
        d = c if isinstance(c, dict) else config_dict(c)
        return estimate_shared_bytes(block_m=d["block_m"], block_n=d["block_n"], d_pad=d_pad, elem_bytes=elem_bytes,
                                     num_stages=d["num_stages"])

    kept = [c for c in configs if shared(c) <= shared_limit]
    if not kept and configs:
        kept = [min(configs, key=shared)]
    return kept


def register_estimate(*, block_m: int, block_n: int, d_pad: int, num_warps: int) -> float:
    """float32 values each thread holds for the score tile and the accumulator: (BM·BN + BM·D) / threads.

    A rough gauge of register pressure (the compiler needs more: addresses, row statistics, operands).
    """
    return (block_m * block_n + block_m * d_pad) / (32 * num_warps)


MAX_VALUES_PER_THREAD = 160  # above this, the compiled v2 kernels spill (255 registers is the ceiling)
PRUNE_RULE = ("keep a configuration when its estimated shared memory (stages·2·BLOCK_N + BLOCK_M)·D·bytes fits "
              "the per-block limit and (BLOCK_M·BLOCK_N + BLOCK_M·D)/(32·warps) <= "
              f"{MAX_VALUES_PER_THREAD} float32 values per thread")


def prune_autotune_space(configs: list[dict], *, d_pad: int, elem_bytes: int, shared_limit: int,
                         max_values_per_thread: float = MAX_VALUES_PER_THREAD) -> list[dict]:
    """The autotuner's space before it runs: configurations that fit shared memory and do not obviously spill."""
    fit = prune_configs(configs, d_pad=d_pad, elem_bytes=elem_bytes, shared_limit=shared_limit)
    kept = [c for c in fit if register_estimate(block_m=c["block_m"], block_n=c["block_n"], d_pad=d_pad,
                                                num_warps=c["num_warps"]) <= max_values_per_thread]
    return kept or fit[:1]


def _pow2_floor(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(x)))) if x >= 1 else 1


def fa1_block_sizes(sram_bytes: int, D: int, elem_bytes: int, *, min_block: int = 16, max_block: int = 256) -> dict:
    """The FlashAttention-1 paper's rule (Algorithm 1): with M elements of on-chip memory,
    Bc = ⌈M / (4·d)⌉ and Br = min(Bc, d).

    Returns the raw values and the tiles Triton can use: rounded *down* to a power of two (so the tiles
    still fit), clamped to [min_block, max_block]. ``block_n`` is Bc (keys per K/V block), ``block_m`` Br.
    """
    if sram_bytes <= 0 or D <= 0 or elem_bytes <= 0:
        raise ValueError(f"sram_bytes, D and elem_bytes must be positive, got {sram_bytes}, {D}, {elem_bytes}")
    M = sram_bytes // elem_bytes
    bc = math.ceil(M / (4 * D))
    br = min(bc, D)

    def tile(x):
        return min(max_block, max(min_block, _pow2_floor(x)))

    return {"sram_elements": M, "bc": bc, "br": br, "block_n": tile(bc), "block_m": tile(br)}


# --- the sweep as a grid -----------------------------------------------------------------------

def short_error(err: BaseException | str, limit: int = 200) -> str:
    """A one-line description of a failed configuration; shared-memory failures say so plainly."""
    text = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    text = " ".join(text.split())
    if "OutOfResources" in text and "shared" in text.lower():
        return "out of shared memory: " + text[:limit]
    return text[:limit]


def is_shared_memory_error(row: dict) -> bool:
    return "error" in row and "shared" in row["error"].lower()


def successful(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "error" not in r and r.get("tflops") is not None]


def best_row(rows: list[dict]) -> dict | None:
    ok = successful(rows)
    return max(ok, key=lambda r: r["tflops"]) if ok else None


def heatmap_table(rows: list[dict], value: str = "tflops") -> dict:
    """Rows of a sweep as a grid: one line per (block_m, block_n), one column per (num_warps, num_stages).

    Returns ``{"row_labels", "col_labels", "values" (floats, None where missing or failed), "status"
    ('ok', 'smem' for out of shared memory, 'error', or '' where not run)}``.
    """
    tiles = sorted({(r["block_m"], r["block_n"]) for r in rows})
    launch = sorted({(r["num_warps"], r["num_stages"]) for r in rows})
    values = [[None] * len(launch) for _ in tiles]
    status = [[""] * len(launch) for _ in tiles]
    for r in rows:
        i, j = tiles.index((r["block_m"], r["block_n"])), launch.index((r["num_warps"], r["num_stages"]))
        if "error" in r:
            status[i][j] = "smem" if is_shared_memory_error(r) else "error"
        else:
            status[i][j] = "ok"
            values[i][j] = r.get(value)
    return {"row_labels": [f"{m}×{n}" for m, n in tiles], "col_labels": [f"{w}w/{s}s" for w, s in launch],
            "values": values, "status": status, "tiles": tiles, "launch": launch}
