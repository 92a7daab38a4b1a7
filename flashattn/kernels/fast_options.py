"""The launch options of ``fast``, forward (notebook 10) and backward (notebook 12): what a caller may ask for, the
defaults, the tuning spaces pruned to the live GPU, and the checks, made once per distinct call into one frozen
:class:`FastOptions` for either direction.

The kernels and their launchers are in ``fast.py`` and ``fast_gluon.py`` (forward), ``fast_backward.py`` and
``fast_backward_gluon.py`` (backward); ``tuner.py`` times the candidates this module lists.
"""

from __future__ import annotations

import dataclasses

import torch

from flashattn import runtime
from flashattn.validate import INPUT_PRECISIONS, TILE_KEYS, remembered, resolve_options

from . import device, triton_compat

HEAD_DIMS = range(1, 257)  # any D up to 256: the Triton kernels pad it to a power of two >= 16
GLUON_DTYPES = (torch.float16, torch.bfloat16)

# --- the forward's spaces ------------------------------------------------------------------------------------
# The pruned search space of the autotuner, per (padded) head dimension: (BLOCK_M, BLOCK_N, warps, stages,
# register cap or None). Measured on the H200 (notebook 10): what pays is two programs per SM, so that
# one program's softmax runs while the other's matrix products keep the tensor cores busy. Small
# 64-row, 4-warp programs get there with room to spare; 128-row, 8-warp programs need their
# registers capped at 128 per thread (2 x 256 threads x 128 = the SM's 65536). D = 256 needs smaller
# tiles to fit registers and shared memory. On a GPU with less shared memory than the H200 the space is
# pruned to what fits (device.prune); where nothing in it fits, FALLBACK_SPACE's smaller tiles are tried.
TUNING_SPACE = {
    16: [(128, 64, 4, 3), (128, 128, 4, 3), (64, 64, 4, 3)],
    32: [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
    64: [(64, 128, 4, 2), (64, 64, 4, 3), (64, 64, 4, 2), (128, 128, 8, 3, 128), (128, 64, 8, 3)],
    128: [(128, 64, 8, 2, 128), (128, 64, 4, 2), (64, 64, 4, 3), (128, 128, 8, 3)],
    256: [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2)],
}
FLOAT32_SPACE = [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2)]
FALLBACK_SPACE = [(64, 32, 4, 1), (32, 32, 4, 1), (16, 16, 4, 1)]  # for GPUs where nothing above fits (T4, D = 256)

# The Gluon kernel's space: (BLOCK_M, BLOCK_N, warps, K/V ring slots, schedule[, consumers]). Schedules:
#   "single":      one warpgroup (4 warps) per program, two or three programs per SM, each loading its own K/V;
#   "specialized": a producer warp and `consumers` (2, or 3 with D = 64) consumer warpgroups of BLOCK_M rows
#                  each per program, sharing K/V;
#   "persistent":  the same, one program per SM looping over the tiles.
# Kept from what was measured on the H200 (every candidate timed in interleaved rounds next to SDPA):
# 64 rows per warpgroup and 128 keys almost everywhere; single programs for short or causal problems
# (D = 128: a one-slot ring, so that two programs fit in shared memory); at D = 64 non-causal, three
# consumers (FlashAttention-3's 192-row tiles); at D = 128, two. Three consumers lose on causal problems
# (autotuning does not try them there: see candidates). Hopper only: every one fits its 227 KB.
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

# --- the backward's spaces -----------------------------------------------------------------------------------
# Per padded head dimension: (BLOCK_M, BLOCK_N, warps, stages). The dK/dV kernel keeps two (BLOCK_N, D) float32
# accumulators per program (three tiles' worth with atomic dQ), the dQ kernel one (BLOCK_M, D); the score tiles it
# transposes hold a column's lse and delta in every thread. So at D = 128 only 8-warp programs of at most 64 keys
# stay in registers. Each configuration compiles for sm_90 without spilling registers (or, marked "spills", a few
# dozen bytes); the H200 timings behind the choice come from tools/gpu/backward/probe.py.
DKDV_SPACE = {
    16: [(64, 128, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3)],
    32: [(64, 128, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3)],
    # D = 64 and 128: the configuration that won every problem the H200 probe timed (fp16/bf16, N 4096 and
    # 16384, causal and not, in interleaved rounds against SDPA); one candidate, so a fresh process cannot pick
    # another (the dK/dV kernel is most of the time)
    64: [(64, 64, 4, 3)],
    128: [(64, 128, 8, 2)],  # spills a few dozen bytes, and still won
    256: [(16, 16, 4, 1), (32, 16, 4, 1), (32, 32, 8, 2)],  # D = 256 spills whatever the tiles (least first)
}
# With atomic dQ, 4-warp programs of 64 keys come first at D = 64 and 128: each holds all its registers (at most
# 255, no spills) and two fit on an SM, so one program's exponentials overlap the other's products. They beat the
# 8-warp tiles by far, and still lose to dq_mode="kernel" (tools/gpu/backward/atomic_probe.py).
ATOMIC_DKDV_SPACE = {
    16: [(64, 128, 4, 3), (64, 64, 4, 3)],
    32: [(64, 128, 8, 3), (64, 64, 4, 3)],
    64: [(64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 8, 3)],
    128: [(32, 64, 4, 3), (64, 64, 8, 3)],
    256: [(16, 16, 4, 1), (32, 32, 8, 2)],
}
DQ_SPACE = {
    16: [(128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2)],
    32: [(128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2)],
    64: [(128, 64, 8, 3), (64, 64, 4, 3)],  # the two that were within 3 % of the best on every problem probed
    128: [(64, 64, 4, 2), (128, 128, 8, 2)],
    256: [(16, 32, 4, 1), (16, 16, 4, 1), (64, 32, 8, 2)],
}
# float32 (IEEE products on the CUDA cores, for checking rather than speed): small tiles; they still spill past D = 32
BACKWARD_FLOAT32_SPACE = [(16, 32, 8, 1), (16, 16, 4, 1), (32, 32, 8, 1)]
BACKWARD_FALLBACK_SPACE = [(32, 32, 4, 1), (16, 32, 4, 1), (16, 16, 4, 1)]  # where nothing above fits (T4)
INTERPRETER_TILES = (64, 64, 4, 1)  # few, large programs: the interpreter runs each in Python
DQ_MODES = ("kernel", "atomic")
DEFAULT_DQ_MODE = "kernel"  # on a GPU; the interpreter runs "atomic": one kernel fewer, and adds in order anyway


@dataclasses.dataclass(frozen=True)
class FastOptions:
    """Every launch option of ``fast``, forward or backward, decided and checked. With ``autotune`` the tiles are
    only a first guess: the tuner replaces them (and, for the Gluon forward, an "auto" schedule) per problem.

    Forward: the tiles are the kernel's. Backward: they are the dK/dV kernel's first guess; ``dkdv_tiles`` and
    ``dq_tiles`` the tiles a caller fixed for either kernel (the other is tuned, with ``autotune``, or takes its
    space's first); ``gluon`` None there means "the Gluon kernel where it applies"."""

    gluon: bool | None  # the Gluon kernel (fast_gluon.py, fast_backward_gluon.py) rather than the Triton one(s)
    autotune: bool
    block_m: int  # rows of Q per program (Gluon forward with a producer: per consumer warpgroup)
    block_n: int  # keys per block
    num_warps: int
    num_stages: int  # Triton: software-pipeline depth; Gluon: K/V ring slots
    maxnreg: int | None = None  # a cap on registers per thread (Triton forward)
    use_tma: bool = False  # tiles through TMA descriptors (the Gluon kernels always use them)
    input_precision: str = "ieee"  # float32 only: "ieee" (CUDA cores) or "tf32"/"tf32x3" (tensor cores)
    overlap: bool = True  # Gluon forward: softmax overlapping the previous block's p · v
    schedule: str = "auto"  # Gluon forward: "single", "specialized", "persistent" ("auto": autotuning picks)
    consumers: int | None = None  # Gluon forward, specialized schedules: consumer warpgroups per program (2 or 3)
    dq_mode: str = DEFAULT_DQ_MODE  # backward: "kernel" (a dQ kernel) or "atomic" (dQ added by the dK/dV kernel)
    dkdv_tiles: tuple[int, int, int, int] | None = None  # backward: the dK/dV kernel's tiles, if fixed
    dq_tiles: tuple[int, int, int, int] | None = None  # backward, dq_mode="kernel": the dQ kernel's, if fixed

    def tiles(self) -> dict:
        """The options autotuning chooses, as a dict (``tuned_config``'s form)."""
        tiles = {k: getattr(self, k) for k in (*TILE_KEYS, "maxnreg")}
        if self.gluon:
            return {**tiles, "gluon": True, "schedule": self.schedule, "consumers": self.consumers}
        return {**tiles, "gluon": False}

    def with_tiles(self, tiles: tuple) -> FastOptions:
        """These options with (block_m, block_n, warps, stages[, maxnreg]) tiles, not tuned any further."""
        return dataclasses.replace(self, autotune=False, **dict(zip((*TILE_KEYS, "maxnreg"), tiles, strict=False)))


def padded_head_dim(D: int) -> int:
    """The head dimension the Triton kernels compute with: the next power of two, at least 16 (``tl.dot``'s
    minimum)."""
    return max(16, 1 << (D - 1).bit_length())


def document_blocks(total: int, block: int, docs: int) -> int:
    """How many blocks of ``block`` rows packed documents of ``total`` rows in all can take, at most: each of the
    ``docs`` documents adds at most one partial block. The entries of the block table (``masked.block_table``), and
    so the tiles of the Gluon grids that walk it."""
    return total // block + docs


def gluon_available(dtype: torch.dtype, D: int, mode: str | None = None) -> bool:
    """Whether the Gluon forward can run this problem here: a Hopper GPU (sm_90), 16-bit, D = 64 or 128."""
    return ((mode or runtime.MODE) == "gpu" and triton_compat.HAS_GLUON and device.hopper()
            and dtype in GLUON_DTYPES and D in GLUON_SPACE)


# --- shared memory: what a configuration needs, before it is compiled ----------------------------------------

def forward_shared_bytes(tiles: tuple, D: int, dtype: torch.dtype, where: device.Target | None = None,
                         precision: str = "ieee", extra: int = 0) -> int:
    """The Triton forward (fast.py, and v2's loop): Q kept, K and V streamed; S = Q·Kᵀ and P·V. ``extra``: what
    else a variant stages (a mask's tiles)."""
    bm, bn, _, stages = tiles[:4]
    d = padded_head_dim(D)
    return device.tile_shared_bytes(element=dtype.itemsize, d=d, kept_rows=bm, streamed_rows=2 * bn, stages=stages,
                                    dots=[(bm, bn, d), (bm, d, bn)], p_elements=bm * bn, extra=extra,
                                    mma=dtype != torch.float32 or precision != "ieee", where=where)


def backward_shared_bytes(kernel: str, tiles: tuple, D: int, dtype: torch.dtype, where: device.Target | None = None,
                          precision: str = "ieee", atomic: bool = False, teaching: bool = False, extra: int = 0) -> int:
    """The Triton backward (fast_backward.py, backward.py): the dK/dV kernel keeps K and V and streams Q and dO
    (four products; with ``atomic`` a fifth, dQ, staged as float32), the dQ kernel keeps Q and dO and streams K and
    V (three products, dS made in registers). ``teaching``: backward.py's kernels, whose dK/dV kernel computes P
    and dS untransposed and hands them to the tensor cores transposed (two more tiles through shared memory, on
    every target: Triton 3.6 stages them on sm_90 too)."""
    bm, bn, _, stages = tiles[:4]
    d = padded_head_dim(D)
    if kernel == "dkdv":
        kept, streamed, p = bn, bm, 2 * bm * bn if teaching else 0
        dots = [(bn, bm, d), (bn, d, bm), (bn, bm, d), (bn, d, bm)] + ([(bm, d, bn)] if atomic else [])
    else:
        kept, streamed, p = bm, bn, bm * bn
        dots = [(bm, bn, d), (bm, bn, d), (bm, d, bn)]
    return device.tile_shared_bytes(element=dtype.itemsize, d=d, kept_rows=2 * kept, streamed_rows=2 * streamed,
                                    stages=stages, dots=dots, p_elements=p,
                                    extra=(4 * bm * (d + bn) if atomic else 0) + extra
                                    + (2 * dtype.itemsize * bm * bn if teaching and kernel == "dkdv" else 0),
                                    mma=dtype != torch.float32 or precision != "ieee", where=where)


# --- the forward's options -----------------------------------------------------------------------------------

def tuning_configs(D: int, dtype: torch.dtype, gluon: bool = False, schedule: str = "auto",
                   consumers: int | None = None, where: device.Target | None = None) -> list[dict]:
    """The configurations autotuning tries for head dimension ``D`` (as option dicts, with ``maxnreg``),
    for the Gluon kernel if ``gluon``: those of ``schedule`` only, unless it is "auto", and with
    ``consumers`` consumer warpgroups, if given (the schedule's tiles with that many, if none has it). The
    Triton kernel's are pruned to what fits ``where`` (default: the live GPU)."""
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
    space = fitting(space, FALLBACK_SPACE, lambda c: forward_shared_bytes(c, D, dtype, where), f"fast (D={D}, {dtype})",
                    where)
    return [dict(zip(TILE_KEYS, c[:4], strict=True), maxnreg=c[4] if len(c) > 4 else None) for c in space]


def fitting(space: list, fallback: list, shared_bytes, what: str, where: device.Target | None = None) -> list:
    """``space`` pruned to what fits ``where`` (default: the live GPU); if none of it fits, ``fallback`` pruned
    likewise (a clear error if nothing fits). Without a GPU (and on the H200, where every space was measured)
    ``space`` is unchanged."""
    kept = [c for c in space if device.fits(shared_bytes(c), where)]
    return kept or device.prune(fallback, shared_bytes, where, what=what)


def default_options(dtype: torch.dtype, D: int, mode: str | None = None) -> dict:
    """Launch options of ``fast`` when none are given (for as many keys as queries, one K/V head per query
    head). On a GPU: autotuned tiles, TMA where the GPU has it (Hopper) and D is a power of two >= 16, and on
    Hopper for 16-bit inputs with D = 64 or 128 the Gluon kernel (``gluon=True``)."""
    gluon_opts = dict(overlap=True, schedule="auto", consumers=None)
    if (mode or runtime.MODE) == "interpreter":
        return dict(block_m=64, block_n=64, num_warps=4, num_stages=1, maxnreg=None, input_precision="ieee",
                    autotune=False, use_tma=False, gluon=False, **gluon_opts)
    gluon = gluon_available(dtype, D, mode)
    tiles = {k: v for k, v in tuning_configs(D, dtype, gluon)[0].items() if k not in ("schedule", "consumers")}
    return {**tiles, "input_precision": "ieee", "autotune": True, "use_tma": device.hopper() and D == padded_head_dim(D),
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


def candidates(opts: FastOptions, D: int, dtype: torch.dtype, causal: bool) -> list[FastOptions]:
    """The forward configurations autotuning tries for ``opts``: its kernel's space (for Gluon, narrowed to the
    schedule and consumers asked for). Causal problems: the Triton kernel's diagonal stage needs block_n <=
    block_m; the Gluon kernel masks every key block that crosses the diagonal, whatever its width, and gets no
    three-consumer programs (measured on the H200: they lose there, by far)."""
    configs = tuning_configs(D, dtype, gluon=opts.gluon, schedule=opts.schedule, consumers=opts.consumers)
    if causal and opts.gluon:
        configs = [c for c in configs if c.get("consumers") != 3] or configs[:1]
    elif causal:
        configs = [c for c in configs if c["block_n"] <= c["block_m"]] or configs[:1]
    return [dataclasses.replace(opts, autotune=False, **c) for c in configs]


_resolved: dict = {}


def resolve(dtype: torch.dtype, D: int, causal: bool, options: dict, gluon_shapes: bool = True) -> FastOptions:
    """The forward's ``options`` (a call's keyword options) after defaults and checks; bad options raise.
    ``gluon_shapes``: the problem has as many keys as queries and one K/V head per query head (the Gluon kernel's
    cases). Remembered per distinct call: checking costs as much as a short kernel."""
    return remembered(_resolved, ("forward", dtype, D, causal, gluon_shapes), options,
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
    if not autotune and not device.fits(forward_shared_bytes(tuple(opts[k] for k in TILE_KEYS), D, dtype)):
        raise ValueError(f"fast: tiles {tuple(opts[k] for k in TILE_KEYS)} need about "
                         f"{forward_shared_bytes(tuple(opts[k] for k in TILE_KEYS), D, dtype)} bytes of shared memory; "
                         f"this {device.target().examples} ({device.target().name}) gives a program "
                         f"{device.target().shared_bytes}: pass smaller tiles, or none (autotuning picks ones that fit)")
    return FastOptions(**{**opts, "autotune": autotune})


# --- the backward's options ----------------------------------------------------------------------------------

def tuning_space(kernel: str, D: int, dtype: torch.dtype, atomic: bool = False,
                 where: device.Target | None = None) -> list[tuple[int, int, int, int]]:
    """The configurations autotuning tries for the backward's ``kernel`` ("dkdv" or "dq") at head dimension ``D``
    (``atomic``: the dK/dV kernel that also adds into dQ), pruned to what fits ``where`` (default: the live GPU)."""
    if dtype == torch.float32:
        space = BACKWARD_FLOAT32_SPACE
    else:
        space = {"dkdv": ATOMIC_DKDV_SPACE if atomic else DKDV_SPACE, "dq": DQ_SPACE}[kernel][padded_head_dim(D)]
    return fitting(list(space), BACKWARD_FALLBACK_SPACE,
                   lambda c: backward_shared_bytes(kernel, c, D, dtype, where, atomic=atomic),
                   f"fast backward, {kernel} kernel (D={D}, {dtype})", where)


def backward_default_options(dtype: torch.dtype, D: int, mode: str | None = None) -> dict:
    """Options of the fast backward: on a GPU autotuned tiles for both kernels, TMA on Hopper (head
    dimensions that are powers of two), dQ by :data:`DEFAULT_DQ_MODE`; in the interpreter fixed tiles and
    atomic dQ (the interpreter runs programs one after another: the adds are in a fixed order)."""
    if (mode or runtime.MODE) == "interpreter":
        return dict(dkdv_tiles=INTERPRETER_TILES, dq_tiles=INTERPRETER_TILES, autotune=False, use_tma=False,
                    dq_mode="atomic", input_precision="ieee", gluon=False)
    return dict(dkdv_tiles=None, dq_tiles=None, autotune=True,
                use_tma=device.hopper() and triton_compat.TensorDescriptor is not None,
                dq_mode=DEFAULT_DQ_MODE, input_precision="ieee", gluon=None)


def check_tiles(name: str, tiles, variant: str = "fast backward") -> tuple[int, int, int, int] | None:
    """Fixed tiles (block_m, block_n, num_warps, num_stages) a caller gave as ``name``, checked (None stays None)."""
    if tiles is None:
        return None
    ok = isinstance(tiles, (tuple, list)) and len(tiles) == 4 and all(
        isinstance(t, int) and not isinstance(t, bool) for t in tiles)
    if ok:
        bm, bn, warps, stages = tiles
        ok = all(x >= 16 and x & (x - 1) == 0 for x in (bm, bn)) and warps in (1, 2, 4, 8, 16) and stages >= 1
    if not ok:
        raise ValueError(f"{variant}: {name} must be None or (block_m, block_n, num_warps, num_stages) with "
                         f"block sizes powers of two >= 16, num_warps a power of two <= 16 and num_stages >= 1; "
                         f"got {tiles!r}")
    return tuple(tiles)


_resolved_backward: dict = {}


def resolve_backward(dtype: torch.dtype, D: int, options: dict) -> FastOptions:
    """The backward's ``options`` after defaults and checks (bad ones raise); remembered per distinct call."""
    return remembered(_resolved_backward, ("backward", dtype, D), options,
                      lambda: _check_backward(dtype, D, options))


def _check_backward(dtype: torch.dtype, D: int, options: dict) -> FastOptions:
    defaults = backward_default_options(dtype, D)
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(f"fast backward: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(defaults))}")
    opts = {**defaults, **options}
    for key in ("autotune", "use_tma"):
        if not isinstance(opts[key], bool):
            raise TypeError(f"fast backward: option {key} must be True or False, got {opts[key]!r}")
    if opts["gluon"] not in (None, True, False):
        raise TypeError(f"fast backward: option gluon must be None, True or False, got {opts['gluon']!r}")
    if opts["dq_mode"] not in DQ_MODES:
        raise ValueError(f"fast backward: dq_mode must be one of {', '.join(map(repr, DQ_MODES))}, got {opts['dq_mode']!r}")
    if opts["input_precision"] not in INPUT_PRECISIONS:
        raise ValueError(f"fast backward: input_precision must be one of {', '.join(INPUT_PRECISIONS)}, "
                         f"got {opts['input_precision']!r}")
    if "input_precision" in options and dtype != torch.float32:
        raise ValueError(f"fast backward: input_precision applies to float32 inputs only (got {dtype})")
    dkdv, dq = (check_tiles(key, opts[key]) for key in ("dkdv_tiles", "dq_tiles"))
    if runtime.MODE != "gpu" and (opts["use_tma"] or opts["autotune"]):
        raise ValueError("fast backward: use_tma and autotune need a GPU (the interpreter has no TMA and no clock)")
    atomic = opts["dq_mode"] == "atomic"
    first = dkdv or tuning_space("dkdv", D, dtype, atomic)[0]
    return FastOptions(gluon=opts["gluon"], autotune=opts["autotune"], block_m=first[0], block_n=first[1],
                       num_warps=first[2], num_stages=first[3], use_tma=opts["use_tma"],
                       input_precision=opts["input_precision"], dq_mode=opts["dq_mode"], dkdv_tiles=dkdv, dq_tiles=dq)
