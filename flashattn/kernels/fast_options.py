"""The launch options of ``fast`` (notebook 10): what a caller may ask for, the defaults, the autotuning
spaces, and the checks, made once per distinct call into a frozen :class:`FastOptions`.

The kernels are in ``fast.py`` (Triton) and ``fast_gluon.py`` (Gluon, Hopper); ``fast_launch.py`` runs them.
"""

from __future__ import annotations

import dataclasses

import torch
import triton

from flashattn import runtime
from flashattn.validate import TILE_KEYS, remembered, resolve_options

try:  # Gluon, Triton's lower-level language, is in recent releases only; without it, fast uses the Triton kernel
    from . import fast_gluon
except ImportError:
    fast_gluon = None

HEAD_DIMS = range(1, 257)  # any D up to 256: the Triton kernel pads it to a power of two >= 16

# The pruned search space of the autotuner, per (padded) head dimension: (BLOCK_M, BLOCK_N, warps, stages,
# register cap or None). Measured on the H200 (notebook 10): what pays is two programs per SM, so that
# one program's softmax runs while the other's matrix products keep the tensor cores busy. Small
# 64-row, 4-warp programs get there with room to spare; 128-row, 8-warp programs need their
# registers capped at 128 per thread (2 x 256 threads x 128 = the SM's 65536). D = 256 needs smaller
# tiles to fit registers and shared memory.
TUNING_SPACE = {
    16: [(128, 64, 4, 3), (128, 128, 4, 3), (64, 64, 4, 3)],
    32: [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
    64: [(64, 128, 4, 2), (64, 64, 4, 3), (64, 64, 4, 2), (128, 128, 8, 3, 128), (128, 64, 8, 3)],
    128: [(128, 64, 8, 2, 128), (128, 64, 4, 2), (64, 64, 4, 3), (128, 128, 8, 3)],
    256: [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2)],
}
FLOAT32_SPACE = [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2)]

# The Gluon kernel's space: (BLOCK_M, BLOCK_N, warps, K/V ring slots, schedule[, consumers]). Schedules:
#   "single":      one warpgroup (4 warps) per program, two or three programs per SM, each loading its own K/V;
#   "specialized": a producer warp and `consumers` (2, or 3 with D = 64) consumer warpgroups of BLOCK_M rows
#                  each per program, sharing K/V;
#   "persistent":  the same, one program per SM looping over the tiles.
# Kept from what was measured on the H200 (every candidate timed in interleaved rounds next to SDPA):
# 64 rows per warpgroup and 128 keys almost everywhere; single programs for short or causal problems
# (D = 128: a one-slot ring, so that two programs fit in shared memory); at D = 64 non-causal, three
# consumers (FlashAttention-3's 192-row tiles); at D = 128, two. Three consumers lose on causal problems
# (autotuning does not try them there: see fast_launch.candidates).
GLUON_SPACE = {
    64: [(64, 128, 4, 2, "single"), (64, 64, 4, 2, "single"),
         (64, 128, 4, 2, "specialized"), (64, 128, 4, 2, "persistent", 3)],
    128: [(64, 128, 4, 1, "single"), (64, 64, 4, 1, "single"),
          (64, 128, 4, 2, "specialized"), (64, 128, 4, 2, "persistent")],
}
SCHEDULES = ("auto", "single", "specialized", "persistent")
# Registers per thread at launch for the specialized schedules, by number of consumers: the program's warpgroups
# (the producer's warp counts as one) x 128 threads x this fit the SM's 65536; the kernel then moves them with
# setmaxnreg (2 consumers: 240 each, 3: 160 each; the producer keeps 24).
WS_MAXNREG = {2: 168, 3: 128}


@dataclasses.dataclass(frozen=True)
class FastOptions:
    """Every launch option of ``fast``, decided and checked. With ``autotune`` the tiles are only a first
    guess: the autotuner replaces them (and, for the Gluon kernel, an "auto" schedule) per problem."""

    gluon: bool  # the Gluon kernel (fast_gluon.py) rather than the Triton one (fast.py)
    autotune: bool
    block_m: int  # rows of Q per program (Gluon with a producer: per consumer warpgroup)
    block_n: int  # keys per block
    num_warps: int
    num_stages: int  # Triton: software-pipeline depth; Gluon: K/V ring slots
    maxnreg: int | None = None  # a cap on registers per thread (Triton kernel)
    use_tma: bool = False  # K/V tiles through TMA descriptors (the Gluon kernel always uses them)
    input_precision: str = "ieee"  # float32 only: "ieee" (CUDA cores) or "tf32"/"tf32x3" (tensor cores)
    overlap: bool = True  # Gluon: softmax overlapping the previous block's p · v
    schedule: str = "auto"  # Gluon: "single", "specialized", "persistent" ("auto": autotuning picks)
    consumers: int | None = None  # Gluon, specialized schedules: consumer warpgroups per program (2 or 3)

    def tiles(self) -> dict:
        """The options autotuning chooses, as a dict (``tuned_config``'s form)."""
        tiles = {k: getattr(self, k) for k in (*TILE_KEYS, "maxnreg")}
        if self.gluon:
            return {**tiles, "gluon": True, "schedule": self.schedule, "consumers": self.consumers}
        return {**tiles, "gluon": False}


def padded_head_dim(D: int) -> int:
    """The head dimension the Triton kernel computes with: the next power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, triton.next_power_of_2(D))


def gluon_available(dtype: torch.dtype, D: int, mode: str | None = None) -> bool:
    """Whether the Gluon kernel can run this problem here: a Hopper GPU (sm_90), 16-bit, D = 64 or 128."""
    return ((mode or runtime.MODE) == "gpu" and fast_gluon is not None and runtime.HAS_GPU
            and torch.cuda.get_device_capability()[0] == 9
            and dtype in fast_gluon.DTYPES and D in GLUON_SPACE)


def tuning_configs(D: int, dtype: torch.dtype, gluon: bool = False, schedule: str = "auto",
                   consumers: int | None = None) -> list[dict]:
    """The configurations autotuning tries for head dimension ``D`` (as option dicts, with ``maxnreg``),
    for the Gluon kernel if ``gluon``: those of ``schedule`` only, unless it is "auto", and with
    ``consumers`` consumer warpgroups, if given (the schedule's tiles with that many, if none has it)."""
    if gluon:
        if D not in GLUON_SPACE or dtype == torch.float32:
            raise ValueError(f"fast: the Gluon kernel takes 16-bit inputs and D in {sorted(GLUON_SPACE)}")
        configs = [dict(zip(TILE_KEYS, c[:4], strict=True), maxnreg=None, schedule=c[4],
                        consumers=None if c[4] == "single" else (c[5] if len(c) > 5 else 2))
                   for c in GLUON_SPACE[D] if schedule in ("auto", c[4])]
        if consumers is not None:
            configs = ([c for c in configs if c["consumers"] == consumers]
                       or [{**c, "consumers": consumers} for c in configs if c["consumers"] is not None])
        return configs
    D_pad = padded_head_dim(D)
    space = FLOAT32_SPACE if dtype == torch.float32 else TUNING_SPACE[D_pad]
    if dtype == torch.float32 and D_pad == 256:
        space = [c for c in space if c[0] == 64]
    return [dict(zip(TILE_KEYS, c[:4], strict=True), maxnreg=c[4] if len(c) > 4 else None) for c in space]


def default_options(dtype: torch.dtype, D: int, mode: str | None = None) -> dict:
    """Launch options of ``fast`` when none are given (for as many keys as queries, one K/V head per query
    head). On a GPU: autotuned tiles, TMA where the GPU has it (Hopper) and D is a power of two >= 16, and on
    Hopper for 16-bit inputs with D = 64 or 128 the Gluon kernel (``gluon=True``)."""
    gluon_opts = dict(overlap=True, schedule="auto", consumers=None)
    if (mode or runtime.MODE) == "interpreter":
        return dict(block_m=64, block_n=64, num_warps=4, num_stages=1, maxnreg=None, input_precision="ieee",
                    autotune=False, use_tma=False, gluon=False, **gluon_opts)
    hopper = runtime.HAS_GPU and torch.cuda.get_device_capability()[0] >= 9
    gluon = gluon_available(dtype, D, mode)
    tiles = {k: v for k, v in tuning_configs(D, dtype, gluon)[0].items() if k not in ("schedule", "consumers")}
    return {**tiles, "input_precision": "ieee", "autotune": True, "use_tma": hopper and D == padded_head_dim(D),
            "gluon": gluon, **gluon_opts}


def gluon_conflicts(opts: dict) -> list[str]:
    """The options in ``opts`` that the Gluon kernel cannot honour (empty: it can run them)."""
    found = ["use_tma=False"] if not opts["use_tma"] else []
    found += ["maxnreg"] if opts["maxnreg"] is not None else []
    bm, bn, warps = opts["block_m"], opts["block_n"], opts["num_warps"]
    if warps % 4 or bm % (16 * warps) or bm > 256 or bn > 256:
        found.append(f"block_m={bm}, block_n={bn}, num_warps={warps} (it needs whole warpgroups: num_warps a multiple "
                     "of 4, block_m a multiple of 16·num_warps, tiles of at most 256 rows)")
    if opts["schedule"] in ("specialized", "persistent") and warps != 4:
        found.append(f"schedule={opts['schedule']!r} with num_warps={warps} (each consumer is one warpgroup: 4 warps)")
    if opts["consumers"] is not None and opts["schedule"] not in ("specialized", "persistent"):
        found.append(f"consumers={opts['consumers']} with schedule={opts['schedule']!r} (consumer warpgroups belong to "
                     "the schedules 'specialized' and 'persistent': pass one of them)")
    return found


_resolved: dict = {}


def resolve(dtype: torch.dtype, D: int, causal: bool, options: dict, gluon_shapes: bool = True) -> FastOptions:
    """``options`` (a call's keyword options) after defaults and checks; bad options raise. ``gluon_shapes``:
    the problem has as many keys as queries and one K/V head per query head (the Gluon kernel's cases).
    Remembered per distinct call: checking costs as much as a short kernel."""
    return remembered(_resolved, (dtype, D, causal, gluon_shapes), options,
                      lambda: _check(dtype, D, causal, options, gluon_shapes))


def _check_values(opts: dict, dtype: torch.dtype, D: int, autotune: bool) -> None:
    """The checks that do not depend on which kernel runs."""
    cap = opts["maxnreg"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or not 24 <= cap <= 255):
        raise ValueError(f"fast: maxnreg must be None or an integer from 24 to 255 (registers per thread), got {cap!r}")
    if opts["schedule"] not in SCHEDULES:
        raise ValueError(f"fast: schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {opts['schedule']!r}")
    if opts["consumers"] not in (None, 2, 3) or isinstance(opts["consumers"], bool):
        raise ValueError(f"fast: consumers must be None, 2 or 3 (consumer warpgroups per program), got {opts['consumers']!r}")
    if opts["consumers"] == 3 and D != 64:
        raise ValueError(f"fast: consumers=3 needs D=64, got D={D} (three consumers get 160 registers per thread "
                         "each, too few for a larger accumulator)")
    if autotune and runtime.MODE != "gpu":
        raise ValueError("fast: autotune needs a GPU (the autotuner times the candidates)")
    if (opts["use_tma"] or opts["maxnreg"]) and runtime.MODE != "gpu":
        raise ValueError("fast: use_tma and maxnreg need a GPU (the interpreter has no TMA and no registers to cap)")
    if opts["use_tma"] and D != padded_head_dim(D):
        raise ValueError(f"fast: use_tma needs D a power of two >= 16 (a TMA tile is D wide), got D={D}; "
                         "pass use_tma=False")


def _check(dtype: torch.dtype, D: int, causal: bool, options: dict, gluon_shapes: bool) -> FastOptions:
    defaults = default_options(dtype, D)
    if not gluon_shapes and defaults["gluon"]:  # L != S or grouped heads: the Triton kernel, with its tiles
        defaults = {**defaults, **tuning_configs(D, dtype)[0], "gluon": False}
    opts = resolve_options("fast", options, defaults, dtype)
    # explicit tiles switch autotuning off (unless it is asked for explicitly)
    autotune = options.get("autotune", opts["autotune"] and not any(t in options for t in (*TILE_KEYS, "maxnreg")))
    _check_values(opts, dtype, D, autotune)
    if opts["gluon"] and "gluon" not in options and gluon_conflicts(opts):
        # the default gives way to options only the Triton kernel has, with the Triton kernel's default tiles
        opts = resolve_options("fast", options, {**defaults, **tuning_configs(D, dtype)[0], "gluon": False}, dtype)
    if opts["gluon"]:
        if not gluon_available(dtype, D) or not gluon_shapes:
            raise ValueError(f"fast: gluon=True needs a Hopper GPU (sm_90) with Triton's Gluon, float16 or bfloat16 "
                             f"inputs, D in {sorted(GLUON_SPACE)}, as many keys as queries and one K/V head per query "
                             f"head; got {dtype}, D={D}{'' if gluon_shapes else ', L != S or grouped K/V heads'} "
                             f"in {runtime.MODE} mode (pass gluon=False for the Triton kernel)")
        conflicts = gluon_conflicts(opts)
        if conflicts:
            raise ValueError(f"fast: gluon=True cannot run {'; '.join(conflicts)}: those are the Triton kernel's "
                             "(the Gluon kernel always loads through TMA); pass gluon=False with them")
        if not autotune:  # explicit tiles: the schedule asked for ("auto" means one warpgroup per program)
            schedule = "single" if opts["schedule"] == "auto" else opts["schedule"]
            opts = {**opts, "schedule": schedule, "consumers": None if schedule == "single" else opts["consumers"] or 2}
        return FastOptions(**{**opts, "autotune": autotune})
    if not opts["overlap"]:
        raise ValueError("fast: overlap=False (no softmax/p·v overlap) is an option of the Gluon kernel (gluon=True)")
    if opts["schedule"] != "auto" or opts["consumers"] is not None:
        raise ValueError(f"fast: schedule={opts['schedule']!r}, consumers={opts['consumers']!r}: the schedules and their "
                         "consumer warpgroups are options of the Gluon kernel (gluon=True, with schedule='specialized' or "
                         "'persistent'); the Triton kernel has one schedule")
    if not autotune and opts["block_n"] > opts["block_m"] and causal:
        raise ValueError(f"fast: causal needs block_n <= block_m, got {opts['block_n']} > {opts['block_m']}")
    return FastOptions(**{**opts, "autotune": autotune})
