"""Fill-in-the-kernel exercises of notebooks 02 and 06: tiles of scores and of Kᵀ, written in Triton.

* ``check_scores_kernel(kernel)`` (notebook 02): the naive kernel that writes S = scale·Q·Kᵀ (with -inf
  above the diagonal when causal), one program per (BLOCK_M × BLOCK_N tile, batch·head). The check
  launches it on grid ``(cdiv(N, BLOCK_M), cdiv(N, BLOCK_N), B·H)`` with BLOCK_M = 32, BLOCK_N = 16; one case
  gives q, k and S their own strides, none of them 1, so that a tensor read or S stored through the wrong
  strides is named (``layout_checks``).
* ``check_load_kt(load_kt)`` (notebook 06): ``load_kt(k_base, start_n, stride_kn, stride_kd, N, D,
  BLOCK_N)``, a ``@triton.jit`` function returning the (D, BLOCK_N) tile of Kᵀ read through K's strides
  (the load of ``v2_kt_view``). ``kt_probe_kernel`` calls it, stores every tile it returns and multiplies
  the first query block by it. K holds a different integer in every element of its memory, so a wrong
  tile says exactly which element it read, and the check names the strides that would read it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._check import ExerciseFailed, exercise
from .attention_cases import (
    FIRST_CASES,
    N_IS_ONE,
    Case,
    fail,
    input_buffer,
    input_buffers,
    output_buffer,
    per_head_hint,
    random_qkv,
)
from .evidence import Named, known
from .layout_checks import name_read_mistake, name_store_mistake, store_models
from .triton_check import (
    Buffer,
    close,
    launch,
    near_miss_hint,
    require_jit,
    require_masks,
    tolerance,
    uses_call,
)
from .triton_launch import check_undefined_lanes

NEG_INF = float("-inf")
S_BLOCK_M, S_BLOCK_N = 32, 16


def scores_model(q, k, scale, causal: bool, *, causal_mask="right", fill=NEG_INF) -> torch.Tensor:
    """S = scale·q·kᵀ in float64 over (B, H, N, D), with a choice of causal masks (see flash_kernels)."""
    s = (q @ k.transpose(-1, -2)) * scale
    if not causal or causal_mask == "none":
        return s
    N = q.shape[-2]
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    hidden = {"right": j > i, "strict": j >= i, "wrong_way": j < i,
              "local": (j % S_BLOCK_N) > (i % S_BLOCK_M)}[causal_mask]
    return s.masked_fill(hidden, fill)


SCORE_MISTAKES = (
    (dict(scale=1.0), "the scale is missing: multiply q·kᵀ by `scale` (1/sqrt(D))"),
    (dict(scale="1/D"), "the scale is 1/D: it should be 1/sqrt(D), the `scale` argument"),
    (dict(causal_mask="strict"), "the causal mask is off by one: it hides the diagonal. Query i sees key j "
     "when j <= i"),
    (dict(causal_mask="local"), "the causal mask compares indices inside the tile (tl.arange(0, BLOCK_N) with "
     "tl.arange(0, BLOCK_M)): compare positions in the sequence, offs_n[None, :] <= offs_m[:, None]"),
    (dict(causal_mask="wrong_way"), "the causal mask points the wrong way: it hides the past; hide key j for "
     "query i when j > i"),
    (dict(causal_mask="none"), "with CAUSAL the scores of future keys (j > i) must be -inf: the mask is missing"),
    (dict(fill=0.0), "the hidden scores are 0, not -inf: a softmax would still give them weight"),
)


def _score_models(case: Case, q, k):
    def build(switches):
        scale = switches.pop("scale", case.scale)
        scale = 1.0 / case.D if scale == "1/D" else scale
        return lambda: scores_model(q, k, scale, case.causal, **switches)

    return [(build(dict(s)), message) for s, message in SCORE_MISTAKES]


SCORE_CASES = (
    *FIRST_CASES,
    Case("q, k and S non-contiguous, each with its own strides (none of them 1)", 2, 2, 17, 16, True,
         layout="mixed"),
    N_IS_ONE,
    Case("float16", 1, 2, 100, 16, True, torch.float16, "mixed"),
)


def _run_scores(kernel, case: Case, Q: Buffer, K: Buffer, undefined_lanes: bool = True) -> Buffer:
    S = output_buffer(case, "s", (case.B, case.H, case.N, case.N), torch.float32, S_BLOCK_M, S_BLOCK_N)
    grid = (triton.cdiv(case.N, S_BLOCK_M), triton.cdiv(case.N, S_BLOCK_N), case.B * case.H)
    launch(kernel, grid, Q.view, K.view, S.view, *Q.view.stride(), *K.view.stride(), *S.view.stride(),
           case.H, case.N, case.scale, D=case.D, BLOCK_M=S_BLOCK_M, BLOCK_N=S_BLOCK_N, CAUSAL=case.causal,
           PRECISION="ieee", where=case.text(), undefined_lanes=undefined_lanes)
    return S


def _tiles_index(case: Case, rows: int, cols: int) -> torch.Tensor:
    return torch.cartesian_prod(torch.arange(case.B), torch.arange(case.H), torch.arange(rows), torch.arange(cols))


def _grid_permuted(case: Case, S: Buffer, perm) -> set[int]:
    """The positions a masked store changes when program (x, y, z) of the grid (cdiv(N, BLOCK_M), cdiv(N,
    BLOCK_N), B·H) takes (pid_m, pid_n, pid_bh) = (x, y, z) permuted by ``perm``."""
    sb, sh, sm, sn = S.view.stride()
    grid = (triton.cdiv(case.N, S_BLOCK_M), triton.cdiv(case.N, S_BLOCK_N), case.B * case.H)
    out = set()
    for program in torch.cartesian_prod(*(torch.arange(g) for g in grid)).reshape(-1, 3).tolist():
        pid_m, pid_n, pid_bh = (program[i] for i in perm)
        base = S.offset + (pid_bh // case.H) * sb + (pid_bh % case.H) * sh
        rows = range(pid_m * S_BLOCK_M, min(case.N, (pid_m + 1) * S_BLOCK_M))
        cols = range(pid_n * S_BLOCK_N, min(case.N, (pid_n + 1) * S_BLOCK_N))
        out.update(base + i * sm + j * sn for i in rows for j in cols)
    return out


def _check_scores_store(case: Case, named: dict) -> None:
    S = named["S"]
    padded_m, padded_n = (triton.cdiv(case.N, b) * b for b in (S_BLOCK_M, S_BLOCK_N))

    def at(index):
        return set((S.buffer.offset + index @ torch.tensor(S.strides)).tolist())

    def models():
        found = store_models(S, [named["Q"], named["K"]], _tiles_index(case, case.N, case.N))
        names = ("pid_m", "pid_n", "pid_bh")
        for perm in ((1, 0, 2), (2, 1, 0), (0, 2, 1), (1, 2, 0), (2, 0, 1)):
            given = ", ".join(f"{names[j]} = tl.program_id({i})" for j, i in enumerate(perm))
            found.append((f"the program ids are taken from the wrong axes ({given}): the check launches the grid "
                          "(cdiv(N, BLOCK_M), cdiv(N, BLOCK_N), B·H), so pid_m = tl.program_id(0), pid_n = "
                          "tl.program_id(1), pid_bh = tl.program_id(2)", _grid_permuted(case, S.buffer, perm)))
        found.append(("the store is masked on the rows only: the tiles at the right edge stick out past column N - 1. "
                      "Mask both, mask=(offs_m[:, None] < N) & (offs_n[None, :] < N)",
                      at(_tiles_index(case, case.N, padded_n))))
        found.append(("the store is masked on the columns only: the tiles at the bottom edge stick out past row "
                      "N - 1. Mask both, mask=(offs_m[:, None] < N) & (offs_n[None, :] < N)",
                      at(_tiles_index(case, padded_m, case.N))))
        return found

    name_store_mistake(case.text(), S, models, unmasked=lambda: at(_tiles_index(case, padded_m, padded_n)),
                       mask_text="Tiles at the bottom and right edges stick out of S: store with mask="
                       "(offs_m[:, None] < N) & (offs_n[None, :] < N).")


def _diagnose_scores(kernel, case: Case, named: dict, qkv, passed) -> None:
    _check_scores_store(case, named)
    q, k, _ = qkv
    got, ref = named["S"].buffer.view.double().cpu(), scores_model(q, k, case.scale, case.causal)
    tol = tolerance(case.dtype)
    if close(got, ref, tol):
        return
    for build, message in _score_models(case, q, k):
        model = build()
        if not close(model, ref, tol) and close(got, model, tol):
            fail(case, message + ".")
    model_tol = 1e-4 if case.dtype == torch.float32 else 10 * tol

    def evaluate(Q=None, K=None):
        return scores_model(q if Q is None else Q, k if K is None else K, case.scale, case.causal)

    name_read_mistake(case.text(), got, model_tol, [named["Q"], named["K"]], [named["S"]], evaluate)
    if not torch.isfinite(got[torch.isfinite(ref)]).all():
        check_undefined_lanes(kernel, lambda: _run_scores(kernel, case, *input_buffers(case, qkv)[:2],
                                                          undefined_lanes=False).view[torch.isfinite(ref)],
                              case.text())
        Q0, K0, _ = input_buffers(case, qkv, fill=0.0)
        if torch.isfinite(_run_scores(kernel, case, Q0, K0).view[torch.isfinite(ref)].cpu()).all():
            fail(case, "NaN in S, which goes away when the memory around q and k holds zeros: your kernel reads "
                 "rows past N and stores what it computed from them. Mask the loads (rows < N) and the store.")
    hint = per_head_hint(got.nan_to_num(), ref.nan_to_num(), tol)
    if hint:
        fail(case, hint)
    err = ((got - ref)[torch.isfinite(ref)].norm() / ref[torch.isfinite(ref)].norm()).item()
    what = known(got, ref, tol, row="query row", col="key column")
    if case.layout == "mixed" and passed and not any(c.layout == "mixed" for c in passed):
        fail(case, f"the contiguous cases were right, this one is not ({what}). What differs here is the layout: "
             "q, k and S each have their own strides, none of them 1. Use them for every step, never N*D, D or 1.")
    fail(case, f"S is wrong, and no single classic mistake reproduces it ({what}): S[b, h, i, j] = scale · Σ_d "
         "q[b, h, i, d]·k[b, h, j, d]." + near_miss_hint(err, case.dtype))


@exercise("scores kernel")
def check_scores_kernel(kernel) -> str:
    """``kernel(Q, K, S, 12 strides, H, N, scale, D, BLOCK_M, BLOCK_N, CAUSAL, PRECISION)``: S = scale·Q·Kᵀ."""
    require_jit(kernel, "the scores kernel")
    passed = []
    for seed, case in enumerate(SCORE_CASES):
        qkv = random_qkv(case, seed=400 + seed)
        Q, K, _ = input_buffers(case, qkv)
        S = _run_scores(kernel, case, Q, K)
        named = {"Q": Named("Q", Q, "bhnd"), "K": Named("K", K, "bhnd"), "S": Named("S", S, "bhmn")}
        _diagnose_scores(kernel, case, named, qkv, passed)
        passed.append(case)
    require_masks(kernel, "N is not a multiple of the blocks: edge tiles stick out of Q, K and S.")
    return "ragged N, B and H > 1, causal, non-contiguous q, k and S, N = 1, float16"


# ---------------------------------------------------------------------------------------------
# Notebook 06: the (D, BLOCK_N) tile of Kᵀ, read through K's strides


@triton.jit
def kt_probe_kernel(Q, K, T, S,
                    stride_qb, stride_qh, stride_qn, stride_qd,
                    stride_kb, stride_kh, stride_kn, stride_kd,
                    H, N, scale,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, N_PAD: tl.constexpr,
                    PRECISION: tl.constexpr, LOAD_KT: tl.constexpr):
    """Program (pid_n, pid_bh) stores the tile LOAD_KT returns into T[pid_bh, pid_n] and the scores of the
    first BLOCK_M queries against it into S[pid_bh, :, pid_n*BLOCK_N ...]."""
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)
    off_b, off_h = pid_bh // H, pid_bh % H
    kt = LOAD_KT(K + off_b * stride_kb + off_h * stride_kh, pid_n * BLOCK_N, stride_kn, stride_kd, N, D, BLOCK_N)
    tl.static_assert(len(kt.shape) == 2 and kt.shape[0] == D and kt.shape[1] == BLOCK_N,
                     "load_kt must return a (D, BLOCK_N) tile")
    offs_d, offs_j = tl.arange(0, D), tl.arange(0, BLOCK_N)
    tl.store(T + ((pid_bh * tl.cdiv(N, BLOCK_N) + pid_n) * D + offs_d[:, None]) * BLOCK_N + offs_j[None, :], kt)
    offs_m = tl.arange(0, BLOCK_M)
    qi = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                 mask=offs_m[:, None] < N, other=0.0)
    s = tl.dot(qi, kt.to(qi.dtype), input_precision=PRECISION) * scale
    cols = pid_n * BLOCK_N + offs_j
    tl.store(S + (pid_bh * BLOCK_M + offs_m[:, None]) * N_PAD + cols[None, :], s)


KT_BLOCK_M, KT_BLOCK_N = 16, 32  # BLOCK_N != D, so a tile of the wrong shape cannot pass
KT_CASES = (
    Case("K contiguous, N a multiple of BLOCK_N", 1, 1, 64, 16, False),
    Case("K contiguous, N not a multiple of BLOCK_N, B and H > 1", 2, 2, 50, 16, False),
    Case("K a view of (B, H, N + 5, D) memory", 2, 2, 17, 16, False, layout="mixed"),
    Case("K transposed on the host: (B, H, D, N) memory, stride_kn = 1", 1, 2, 40, 16, False, layout="kt"),
    Case("N = 1", 1, 2, 1, 16, False),
    Case("float16", 1, 2, 100, 16, False, torch.float16, "mixed"),
)


def _k_buffer(case: Case, k: torch.Tensor) -> Buffer:
    shape = (case.B, case.H, case.N, case.D)
    fill = "numbered" if case.dtype == torch.float32 else float("nan")
    values = None if fill == "numbered" else k
    if case.layout == "kt":
        return Buffer(shape, case.dtype, order=(0, 1, 3, 2), fill=fill, values=values)
    if case.layout == "mixed":
        return Buffer(shape, case.dtype, pad=(0, 0, 5, 0), fill=fill, values=values)
    return Buffer(shape, case.dtype, fill=fill, values=values)


def _tile_diagnosis(K: Buffer, got: torch.Tensor, case: Case) -> str | None:
    """What a wrong tile read, in terms of strides, from K's numbered memory (float32 cases)."""
    sb, sh, sn, sd = K.view.stride()
    blocks = got.shape[1]
    valid_cols = [min(KT_BLOCK_N, case.N - j * KT_BLOCK_N) for j in range(blocks)]
    pos = got[0, 0, :, :valid_cols[0]] - 1 - K.guard  # positions read by block 0 of head 0
    if pos.shape[1] >= 2:
        a, b = (pos[1, 0] - pos[0, 0]).item(), (pos[0, 1] - pos[0, 0]).item()
        if (a, b) == (sn, sd) and sn != sd:
            return (f"K's strides are swapped: element [d, j] of the tile is K[start_n + j, d], at "
                    f"k_base + (start_n + j)*stride_kn + d*stride_kd (here stride_kn = {sn}, stride_kd = {sd}).")
        if b == case.D and sn != case.D and a == sd:
            return (f"you assumed K's rows are D = {case.D} elements apart (a contiguous K); here stride_kn = {sn}. "
                    "Step with the strides you are given.")
    if blocks > 1 and case.N >= 2 * KT_BLOCK_N and torch.equal(got[0, 1], got[0, 0]):
        return "every K block returned the same tile: the keys of the tile are start_n + tl.arange(0, BLOCK_N)."
    tail = torch.cat([got[:, j, :, valid_cols[j]:].flatten(1) for j in range(blocks)], 1)
    if tail.numel() and torch.isneginf(tail).all():
        return ("the keys past N read as -inf: this tile goes into tl.dot, where -inf times 0 is NaN. Load them as "
                "0.0 (other=0.0): the scores of those keys are masked with -inf later, after the product.")
    if tail.numel() and (tail != 0).any():
        return ("the keys past N are not 0.0: mask the load with offs_n[None, :] < N (a mask on the key "
                "dimension, the tile's columns) and other=0.0.")
    return None


def _expected_tiles(k: torch.Tensor, N: int) -> torch.Tensor:
    """(B·H, blocks, D, BLOCK_N): the tiles of Kᵀ, zero past N."""
    B, H, _, D = k.shape
    blocks = triton.cdiv(N, KT_BLOCK_N)
    padded = torch.zeros(B * H, blocks * KT_BLOCK_N, D, dtype=torch.float64)
    padded[:, :N] = k.reshape(B * H, N, D)
    return padded.reshape(B * H, blocks, KT_BLOCK_N, D).transpose(-1, -2)


def _check_kt_case(load_kt, case: Case, seed: int) -> None:
    q, k, _ = random_qkv(case, seed)
    Q = input_buffer(case, q, "q")
    K = _k_buffer(case, k)
    k = K.view.double().cpu()
    B, H, N, D = k.shape
    blocks = triton.cdiv(N, KT_BLOCK_N)
    T = torch.full((B * H, blocks, D, KT_BLOCK_N), -999.0, dtype=case.dtype, device=K.view.device)
    S = torch.full((B * H, KT_BLOCK_M, blocks * KT_BLOCK_N), -999.0, dtype=torch.float32, device=K.view.device)
    launch(kt_probe_kernel, (blocks, B * H), Q.view, K.view, T, S, *Q.view.stride(), *K.view.stride(), H, N,
           case.scale, D=D, BLOCK_M=KT_BLOCK_M, BLOCK_N=KT_BLOCK_N, N_PAD=blocks * KT_BLOCK_N,
           PRECISION="ieee", LOAD_KT=load_kt, where=case.text())
    got, want = T.double().cpu(), _expected_tiles(k, N)
    if not close(got, want, tolerance(case.dtype)):
        reason = _tile_diagnosis(K, got, case) if K.numbered else None
        if reason is None and not torch.isfinite(got).all():
            reason = "the tile holds NaN: it read memory past the end of K (mask the keys, offs_n[None, :] < N)."
        if reason is None:
            off = (got - want).abs().nan_to_num(float("inf"))
            bh, j, d, c = (int(x) for x in torch.nonzero(off == off.max())[0])
            reason = (f"element [{d}, {c}] of the tile of keys {j * KT_BLOCK_N}.. (head {bh}) should be "
                      f"K[{j * KT_BLOCK_N + c}, {d}] = {want[bh, j, d, c].item():.6g}, "
                      f"got {got[bh, j, d, c].item():.6g}.")
        fail(case, reason)
    rows = min(KT_BLOCK_M, N)
    ref = (q.reshape(B * H, N, D)[:, :rows] @ k.reshape(B * H, N, D).transpose(1, 2)) * case.scale
    scores = S.double().cpu()[:, :rows, :N]
    if not close(scores, ref, tolerance(case.dtype)):
        err = ((scores - ref).norm() / ref.norm()).item()
        fail(case, f"the tiles are right but their product with q is not (relative error {err:.2g})."
             + near_miss_hint(err, case.dtype))


@exercise("Kᵀ tile through strides")
def check_load_kt(load_kt) -> str:
    """``load_kt(k_base, start_n, stride_kn, stride_kd, N, D, BLOCK_N)`` → the (D, BLOCK_N) tile of Kᵀ."""
    require_jit(load_kt, "load_kt")
    for seed, case in enumerate(KT_CASES):
        _check_kt_case(load_kt, case, seed=500 + seed)
    if uses_call(load_kt, "trans"):
        raise ExerciseFailed("the tiles are right, but through tl.trans: this exercise is the load of v2_kt_view, "
                             "which reads the (D, BLOCK_N) tile directly through K's strides (d with stride_kd "
                             "down the rows, keys with stride_kn along the columns), with no transpose in the "
                             "kernel.")
    require_masks(load_kt, "N is not a multiple of BLOCK_N: the last tile sticks out of K.")
    return "contiguous K, a padded view and K transposed on the host; N not a multiple of BLOCK_N; float16"
