"""Checks of notebooks 01 and 01b (the Triton primer): four small kernels the learner writes.

* ``check_scaled_add(kernel, launcher)``: ``out = alpha·x + y``, each program BLOCK elements, a ragged
  tail; and the host function that allocates the output and chooses the grid.
* ``check_transpose(kernel)``: ``Y = Xᵀ`` read through X's strides (X may be a transposed or padded view).
* ``check_row_softmax(kernel)`` (01b): softmax of each row, one program per row, BLOCK_N ≥ n_cols.
* ``check_matmul(kernel)`` (01b): ``C = A·B`` in tiles, a loop over K in BLOCK_K steps with ``tl.dot``.

Every check launches the kernel itself on inputs chosen to expose one mistake at a time (sizes that are
not multiples of the block, non-contiguous inputs with no unit stride, large values, float16), surrounds
inputs with NaN and outputs with a sentinel, and names a mistake only when a model of it reproduces what the
kernel did; otherwise it says what is known.
"""

from __future__ import annotations

import torch
import triton

from flashattn import runtime

from ._check import ExerciseFailed, call, exercise
from .evidence import Named, known
from .layout_checks import name_read_mistake, name_store_mistake, store_models
from .triton_check import Buffer, check_writes, close, launch, near_miss_hint, require_jit, require_masks, tolerance
from .triton_launch import check_undefined_lanes

NAN = float("nan")


def _randn(*shape, seed: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(mask.cpu())[0])


def _check_unwritten(out: Buffer, where: str, how: str) -> None:
    missing = out.unwritten().cpu()
    if missing.any():
        raise ExerciseFailed(f"{where}: {int(missing.sum())} of {missing.numel()} output elements were never "
                             f"written, the first at index {list(_first(missing))}. {how}")


# ---------------------------------------------------------------------------------------------
# Exercise 1: out = alpha * x + y, and its launcher

ADD_BLOCK = 32
ALPHA = 2.5
_ADD_CASES = ((1, torch.float32), (17, torch.float32), (100, torch.float32), (100, torch.float16))


def _diagnose_add(out: Buffer, x, y, N: int, where: str) -> None:
    outside = out.outside_writes()
    if outside:
        one_past = all(i == out.guard + N for i in outside)
        raise ExerciseFailed(
            f"{where}: your kernel wrote past the end of OUT, at {out.where(outside[0])}. " + (
                "Only element N itself: the mask lets offs == N through; it must be offs < N." if one_past else
                "The last program's block runs past N: store with mask=offs < N (and load with it too)."))
    missing = out.unwritten().cpu()
    if missing.any():
        if N > ADD_BLOCK and bool(missing[ADD_BLOCK:].all()) and not missing[:ADD_BLOCK].any():
            raise ExerciseFailed(
                f"{where}: only the first BLOCK = {ADD_BLOCK} elements were written: every program handled the "
                "same block. Program pid must start at pid * BLOCK: offs = tl.program_id(0) * BLOCK + "
                "tl.arange(0, BLOCK).")
        _check_unwritten(out, where, "Each program writes offs = pid * BLOCK + tl.arange(0, BLOCK), masked "
                         "with offs < N; together the programs must cover 0 .. N-1.")
    got = out.view.double().cpu()
    ref = ALPHA * x + y
    if close(got, ref, tolerance(out.view.dtype)):
        return
    if torch.isnan(got).any():
        i = _first(torch.isnan(got))[0]
        raise ExerciseFailed(f"{where}: element {i} is NaN. The check surrounds x and y with NaN: a value read "
                             "past the end of x or y was stored. Load and store with the same mask, offs < N.")
    wrong = ~torch.isclose(got, ref, rtol=1e-3, atol=1e-3)
    if not wrong.any():  # no element stands out: off by a little everywhere
        err = ((got - ref).norm() / ref.norm()).item()
        raise ExerciseFailed(f"{where}: close but not exact (relative error {err:.2g}; no element stands out)."
                             + near_miss_hint(err, out.view.dtype))
    i = _first(wrong)[0]
    for model, text in ((x + ALPHA * y, "alpha multiplies y; it should multiply x: out = alpha * x + y"),
                        (ALPHA * (x + y), "alpha multiplies the sum; out = alpha * x + y")):
        if close(got, model, 1e-3):
            raise ExerciseFailed(f"{where}: {text}.")
    raise ExerciseFailed(f"{where}: element {i} should be {ALPHA} * {x[i].item():.4g} + {y[i].item():.4g} = "
                         f"{ref[i].item():.4g}, got {got[i].item():.4g}.")


def _check_add_launcher(launcher) -> None:
    for N, dtype in ((1000, torch.float32), (17, torch.float16), (1, torch.float32)):
        where = f"your launcher with N={N}, {_name(dtype)}"
        x, y = (_randn(N, seed=N + i).to(runtime.DEVICE, dtype) for i in (1, 2))
        out = call(launcher, x, y, ALPHA, what=f"your kernel passed its part (N = 1, 17, 100, float32 and "
                   f"float16); the launcher {getattr(launcher, '__name__', 'launcher')}")
        if not isinstance(out, torch.Tensor):
            raise ExerciseFailed(f"{where}: return the output tensor, got {type(out).__name__}.")
        if out.shape != x.shape:
            raise ExerciseFailed(f"{where}: the output has shape {tuple(out.shape)}, x has {tuple(x.shape)}.")
        if out.dtype != x.dtype:
            raise ExerciseFailed(f"{where}: the output is {_name(out.dtype)} for {_name(x.dtype)} inputs: allocate "
                                 "it like x, with torch.empty_like(x).")
        if out.device != x.device:
            raise ExerciseFailed(f"{where}: the output is on {out.device}, the inputs on {x.device}.")
        ref = ALPHA * x.double() + y.double()
        wrong = ~torch.isclose(out.double(), ref, rtol=1e-2, atol=1e-2).cpu()
        if not wrong.any():
            continue
        first = _first(wrong)[0]
        if wrong[first:].all():
            raise ExerciseFailed(
                f"{where}: elements {first} to {N - 1} are wrong (never written), the ones before are right: the "
                "grid has too few programs. Launch triton.cdiv(N, BLOCK) programs: N // BLOCK rounds down and "
                "leaves the ragged tail out.")
        raise ExerciseFailed(f"{where}: element {first} should be {ref[first].item():.4g}, got "
                             f"{out[first].item():.4g}. (Did your kernel pass its part of this check?)")


@exercise("scaled add")
def check_scaled_add(kernel, launcher) -> str:
    """``kernel(X, Y, OUT, alpha, N, BLOCK)``: out = alpha·x + y; ``launcher(x, y, alpha)`` returns out."""
    require_jit(kernel, "scaled_add_kernel")
    for seed, (N, dtype) in enumerate(_ADD_CASES):
        where = f"N={N}, BLOCK={ADD_BLOCK}, {_name(dtype)}"
        x, y = _randn(N, seed=2 * seed), _randn(N, seed=2 * seed + 1)
        X, Y = (Buffer((N,), dtype, fill=NAN, values=t) for t in (x, y))
        out = Buffer((N,), dtype)
        launch(kernel, (triton.cdiv(N, ADD_BLOCK),), X.view, Y.view, out.view, ALPHA, N, BLOCK=ADD_BLOCK,
               where=where)
        _diagnose_add(out, X.view.double().cpu(), Y.view.double().cpu(), N, where)
    require_masks(kernel, "The last block runs past N whenever N is not a multiple of BLOCK.")
    _check_add_launcher(launcher)
    return "N = 1, 17, 100 (not multiples of BLOCK), float32 and float16; the launcher covers every element"


# ---------------------------------------------------------------------------------------------
# Exercise 2: Y = Xᵀ through strides

T_BLOCK_M, T_BLOCK_N = 16, 16
# (label, M, N, order of X in memory, padding of X, step of X, padding of Y, step of Y, dtype)
_T_CASES = (
    ("X contiguous", 20, 37, (0, 1), (0, 0), (1, 1), (3, 5), (1, 1), torch.float32),
    ("X a transposed view (stride_xm = 1)", 37, 20, (1, 0), (0, 0), (1, 1), (3, 5), (1, 1), torch.float32),
    ("X with padded rows (stride_xm > N)", 33, 17, (0, 1), (0, 7), (1, 1), (3, 5), (1, 1), torch.float32),
    ("X and Y with no unit stride (every 2nd and every 3rd element), Y's rows padded", 20, 37, (0, 1), (0, 3),
     (1, 2), (2, 4), (1, 3), torch.float32),
    ("X one row", 1, 17, (0, 1), (0, 0), (1, 1), (3, 5), (1, 1), torch.float32),
    ("float16, X with padded rows", 20, 37, (0, 1), (0, 5), (1, 1), (3, 5), (1, 1), torch.float16),
)


def _linear_fit(src: Buffer, got: torch.Tensor):
    """If every Y[r, c] was read at flat position base + a·r + b·c of X's buffer, return (a, b), else None."""
    pos = got.double().cpu() - 1  # a numbered buffer holds position + 1
    if not torch.isfinite(pos).all() or pos.shape[0] < 2 or pos.shape[1] < 2:
        return None
    a = pos[1, 0] - pos[0, 0]
    b = pos[0, 1] - pos[0, 0]
    rows = torch.arange(pos.shape[0], dtype=torch.float64)[:, None]
    cols = torch.arange(pos.shape[1], dtype=torch.float64)[None, :]
    if torch.equal(pos, pos[0, 0] + a * rows + b * cols):
        return int(a), int(b)
    return None


def _store_fit(X: Buffer, Y: Buffer):
    """(a, b) if every value read from X[i, j] was stored at Y + a*j + b*i, else None."""
    positions, values = Y.written()
    rows = [(X.index_of(v), p) for p, v in zip(positions, values, strict=True)]
    rows = [(ij, p) for ij, p in rows if ij is not None]
    if len(rows) < 3:
        return None
    lhs = torch.tensor([[j, i] for (i, j), _ in rows], dtype=torch.float64)
    rhs = torch.tensor([p for _, p in rows], dtype=torch.float64)
    a, b = torch.linalg.lstsq(lhs, rhs[:, None]).solution.flatten().round().tolist()
    if torch.equal(lhs @ torch.tensor([a, b], dtype=torch.float64), rhs):
        return int(a), int(b)
    return None


def _diagnose_transpose(X: Buffer, Y: Buffer, M: int, N: int, where: str) -> None:
    sym, syn = Y.view.stride()
    fit = _store_fit(X, Y) if X.numbered else None
    if fit == (syn, sym):
        raise ExerciseFailed(
            f"{where}: X[i, j] ended up at Y[i, j], not at Y[j, i]: the tile was copied without being turned "
            "around, so one pair of strides is swapped. Read X[i, j] at X + i*stride_xm + j*stride_xn and write it "
            f"to Y + j*stride_ym + i*stride_yn (here stride_xm = {X.view.stride(0)}, stride_xn = "
            f"{X.view.stride(1)}, stride_ym = {sym}, stride_yn = {syn}).")
    if fit is not None and fit[0] == M and sym != M:
        raise ExerciseFailed(f"{where}: you stored Y as if its rows were M = {M} elements apart (a contiguous "
                             f"Y); here they are stride_ym = {sym} apart. Step with the strides you are given.")
    if fit is not None and fit[1] == 1 and syn != 1:
        raise ExerciseFailed(f"{where}: you stored Y as if the elements of a row were next to each other "
                             f"(stride_yn = 1, a contiguous Y); here they are stride_yn = {syn} apart. Multiply the "
                             "column offsets by stride_yn too.")
    check_writes(Y, "Y", where, "Y has N rows and M columns, the tile you store is X's tile turned around: "
                 "mask the store with (Y's rows < N) & (Y's columns < M).")
    _check_unwritten(Y, where, "Program (pid_m, pid_n) must write Y[pid_n*BLOCK_N + j, pid_m*BLOCK_M + i] "
                     "for every i, j of its tile that lies inside Y.")
    got, ref = Y.view.double().cpu(), X.view.double().cpu().T
    if close(got, ref, tolerance(Y.view.dtype)):
        return
    sxm, sxn = X.view.stride()
    if X.numbered:  # each value says where it was read
        fit = _linear_fit(X, got)
        if fit == (sxm, sxn):
            raise ExerciseFailed(f"{where}: X's strides are swapped. X[i, j] is at X + i*stride_xm + j*stride_xn "
                                 f"(here stride_xm = {sxm}, stride_xn = {sxn}); Y[r, c] must be X[c, r].")
        if fit is not None and fit[1] == N and sxm != N:
            raise ExerciseFailed(f"{where}: you assumed X's rows are N = {N} elements apart (a contiguous X); here "
                                 f"they are stride_xm = {sxm} apart. Step with the strides you are given.")
        if fit is not None and fit[0] == 1 and sxn != 1:
            raise ExerciseFailed(f"{where}: you assumed the elements of a row of X are next to each other "
                                 f"(stride_xn = 1, a contiguous X); here they are stride_xn = {sxn} apart. Multiply "
                                 "the column offsets by stride_xn too.")
        bad = ~torch.isclose(got, ref)
        r, c = _first(bad) if bad.any() else _first((got - ref).abs() == (got - ref).abs().max())
        source = X.index_of(got[r, c].item())
        read = f"X{list(source)}" if source is not None else X.origin(got[r, c].item())
        raise ExerciseFailed(f"{where}: Y[{r}, {c}] should be X[{c}, {r}], but holds {read}. Y[r, c] = X[c, r]: "
                             "the element at X + c*stride_xm + r*stride_xn, stored at Y + r*stride_ym + "
                             "c*stride_yn." + (f" (Your reads step {fit[0]} per row of Y and {fit[1]} per column; "
                                               f"they should step {sxn} and {sxm}.)" if fit else ""))
    raise ExerciseFailed(f"{where}: the float32 cases were right, this one is not (relative error "
                         f"{(got - ref).norm() / ref.norm():.2g}). Load and store the tile without converting it.")


@exercise("transpose")
def check_transpose(kernel) -> str:
    """``kernel(X, Y, M, N, stride_xm, stride_xn, stride_ym, stride_yn, BLOCK_M, BLOCK_N)``: Y = Xᵀ."""
    require_jit(kernel, "transpose_kernel")
    for seed, (label, M, N, order, pad, step, y_pad, y_step, dtype) in enumerate(_T_CASES):
        where = f"[{label}] M={M}, N={N}, {_name(dtype)}"
        if dtype == torch.float32:
            X = Buffer((M, N), dtype, order=order, pad=pad, step=step, fill="numbered")
        else:
            X = Buffer((M, N), dtype, order=order, pad=pad, step=step, fill=NAN, values=_randn(M, N, seed=seed))
        Y = Buffer((N, M), dtype, pad=y_pad, step=y_step)
        grid = (triton.cdiv(M, T_BLOCK_M), triton.cdiv(N, T_BLOCK_N))
        launch(kernel, grid, X.view, Y.view, M, N, *X.view.stride(), *Y.view.stride(),
               BLOCK_M=T_BLOCK_M, BLOCK_N=T_BLOCK_N, where=where)
        _diagnose_transpose(X, Y, M, N, where)
    require_masks(kernel, "Tiles at the bottom and right edges stick out of X and Y.")
    return ("contiguous, transposed and padded X, X and Y with no unit stride, sizes not multiples of the block, "
            "float32 and float16")


# ---------------------------------------------------------------------------------------------
# Exercise 3: softmax of each row, one program per row

# (label, n_cols, scale, shift, dtype)
_SM_CASES = (
    ("moderate values", 100, 2.0, 0.0, torch.float32),
    ("a short row", 17, 2.0, 0.0, torch.float32),
    ("rows of one element", 1, 2.0, 0.0, torch.float32),
    ("large values (about 100; exp overflows float32 above 88.7)", 100, 20.0, 100.0, torch.float32),
    ("float16", 100, 2.0, 0.0, torch.float16),
)
SM_ROWS = 5


def sm_block(n_cols: int) -> int:
    """BLOCK_N for a row of n_cols: the next power of two, at least 16."""
    return max(16, triton.next_power_of_2(n_cols))


def _softmax_zero_other(x: torch.Tensor, block: int) -> torch.Tensor:
    """The padded columns of the block loaded as 0.0 and counted: exp(0 - m) each."""
    m = x.amax(-1, keepdim=True).clamp_min(0.0)
    e = torch.exp(x - m)
    return e / (e.sum(-1, keepdim=True) + (block - x.shape[-1]) * torch.exp(-m))


def _diagnose_softmax(kernel, X: Buffer, Y: Buffer, x: torch.Tensor, block: int, where: str, large: bool,
                      rerun) -> None:
    check_writes(Y, "Y", where, "Store with mask=cols < n_cols, at Y + row * stride_ym + cols (Y's row stride "
                 "differs from X's here).")
    _check_unwritten(Y, where, "Program r writes row r of Y: cols = tl.arange(0, BLOCK_N), masked with "
                     "cols < n_cols.")
    got = Y.view.double().cpu()
    ref = torch.softmax(x, dim=-1)
    if close(got, ref, tolerance(Y.view.dtype)):
        return
    bad_rows = ~torch.isclose(got, ref, rtol=1e-3, atol=1e-4).all(-1)
    nan_rows = ~torch.isfinite(got).all(-1)
    if nan_rows.any():
        check_undefined_lanes(kernel, rerun, where)
        if large:
            raise ExerciseFailed(f"{where}: NaN or inf in the rows: exp of about 100 overflows float32 (above 88.7). "
                                 "Subtract the row max before exp: exp(x - max(x)) is at most 1.")
        if nan_rows.all():
            raise ExerciseFailed(f"{where}: every row has NaN. The check fills the memory past each row's end with "
                                 "NaN and your kernel read it: load with mask=cols < n_cols, "
                                 "other=float('-inf') (exp(-inf) = 0 adds nothing to the sum).")
    if not bad_rows[0] and bad_rows[1:].all():
        raise ExerciseFailed(f"{where}: row 0 is right, the other rows are not: a row stride. Row r of X starts "
                             f"at X + r * stride_xm (here {X.view.stride(0)}, not n_cols = {x.shape[-1]}), and row r "
                             f"of Y at Y + r * stride_ym (here {Y.view.stride(0)}).")
    if close(got, _softmax_zero_other(x, block), 1e-4):
        raise ExerciseFailed(f"{where}: the {block - x.shape[-1]} columns past n_cols (the ragged end of the block) "
                             "were loaded as 0.0 and counted in the sum: exp(0 - max) each. Load them with "
                             "other=float('-inf'): they become exp(-inf) = 0.")
    if not bad_rows.any():  # no element stands out: a small error spread over the rows
        err = ((got - ref).norm() / ref.norm()).item()
        raise ExerciseFailed(f"{where}: close but not exact (relative error {err:.2g}; no element stands out)."
                             + near_miss_hint(err, Y.view.dtype))
    r = _first(bad_rows)[0]
    total = got[r].sum().item()
    hint = (f" Row {r} sums to {total:.4g}, not 1: divide by the sum of the exponentials." if abs(total - 1) > 1e-3
            else " Each row is exp(x - max(x)) / sum(exp(x - max(x))).")
    extra = near_miss_hint(((got - ref).norm() / ref.norm()).item(), Y.view.dtype)
    raise ExerciseFailed(f"{where}: row {r} is wrong.{hint}{extra}")


@exercise("row softmax")
def check_row_softmax(kernel) -> str:
    """``kernel(X, Y, n_cols, stride_xm, stride_ym, BLOCK_N)``: softmax of each row, grid (rows,)."""
    require_jit(kernel, "softmax_kernel")
    for seed, (label, n_cols, scale, shift, dtype) in enumerate(_SM_CASES):
        block = sm_block(n_cols)
        where = f"[{label}] n_cols={n_cols}, BLOCK_N={block}, {_name(dtype)}"
        x = _randn(SM_ROWS, n_cols, seed=10 + seed, scale=scale, shift=shift)
        X = Buffer((SM_ROWS, n_cols), dtype, pad=(0, 12), fill=NAN, values=x)

        def run(undefined_lanes=True, X=X, block=block, where=where, dtype=dtype, n_cols=n_cols):
            Y = Buffer((SM_ROWS, n_cols), dtype, pad=(0, 9))
            launch(kernel, (SM_ROWS,), X.view, Y.view, n_cols, X.view.stride(0), Y.view.stride(0), BLOCK_N=block,
                   where=where, undefined_lanes=undefined_lanes)
            return Y

        Y = run()
        _diagnose_softmax(kernel, X, Y, X.view.double().cpu(), block, where, shift > 0,
                          lambda run=run: run(undefined_lanes=False).view.double().cpu())
    require_masks(kernel, "A row of n_cols is shorter than its block of BLOCK_N.")
    return "rows of 1, 17 and 100 in padded memory, values up to about 160, float32 and float16"


# ---------------------------------------------------------------------------------------------
# Exercise 4: C = A·B in tiles

MM_BLOCK = 16  # BLOCK_M = BLOCK_N = BLOCK_K: tl.dot needs at least 16 along each dimension
# (label, M, N, K, layouts, dtype); a layout is (order, pad, step) for A, B and C
_MM_RAGGED = {"A": (None, (0, 8), None), "B": ((1, 0), (3, 0), None), "C": (None, (2, 6), None)}
_MM_STRIDED = {"A": (None, (0, 3), (1, 2)), "B": ((1, 0), (2, 0), (3, 1)), "C": (None, (2, 6), (1, 5))}
_MM_CASES = (
    ("sizes that are multiples of the block, contiguous", 32, 32, 48, None, torch.float32),
    ("ragged sizes, B a transposed view, A with padded rows", 37, 45, 40, _MM_RAGGED, torch.float32),
    ("A, B and C with no unit stride, each its own, C's rows padded", 37, 45, 40, _MM_STRIDED, torch.float32),
    ("one row", 1, 17, 100, _MM_RAGGED, torch.float32),
    ("float16, ragged sizes", 37, 45, 40, _MM_RAGGED, torch.float16),
)


def _matmul_models(a: torch.Tensor, b: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    K = a.shape[1]
    blocks = triton.cdiv(K, MM_BLOCK)
    last = (blocks - 1) * MM_BLOCK
    models = [
        (blocks * (a[:, :MM_BLOCK] @ b[:MM_BLOCK]),
         "every step of the K loop multiplies the same first blocks: advance the pointers (or offsets) by "
         "BLOCK_K at each step, a along its columns and b along its rows"),
        (a[:, last:] @ b[last:],
         "only the last K block is in C: acc = tl.dot(a, b) replaces the accumulator; add to it, "
         "acc += tl.dot(a, b) (or acc = tl.dot(a, b, acc))"),
    ]
    for kept in sorted({K // MM_BLOCK * MM_BLOCK, last}):
        if 0 < kept < K:
            models.append((a[:, :kept] @ b[:kept],
                           f"only the first {kept} of the K = {K} products are in C: the K loop stops before its last "
                           f"block (the {K - kept} values of the ragged end). Loop over range(0, K, BLOCK_K) and mask "
                           "the loads along K (ks < K, other=0.0), so that the last, shorter block counts too"))
    return models


def _mm_buffers(M, N, K, layout, dtype, a, b, fill=NAN):
    def spec(name):
        return dict(zip(("order", "pad", "step"), layout[name], strict=True)) if layout else {}

    gaps = "noise" if layout is _MM_STRIDED else None
    A = Buffer((M, K), dtype, fill=fill, values=a, gaps=gaps, seed=1, **spec("A"))
    B = Buffer((K, N), dtype, fill=fill, values=b, gaps=gaps, seed=2, **spec("B"))
    C = Buffer((M, N), dtype, **(spec("C") if layout else {"pad": (2, 6)}))
    return A, B, C


def _mm_store(named, M, N, where) -> None:
    C = named["C"]
    index = torch.cartesian_prod(torch.arange(M), torch.arange(N))
    padded = [triton.cdiv(n, MM_BLOCK) * MM_BLOCK for n in (M, N)]

    def at(rows, cols):
        return set((C.buffer.offset + torch.cartesian_prod(torch.arange(rows), torch.arange(cols))
                    @ torch.tensor(C.strides)).tolist())

    def swapped():  # program (x, y) takes pid_m = y, pid_n = x
        sm, sn = C.strides
        out = set()
        for x in range(triton.cdiv(M, MM_BLOCK)):
            for y in range(triton.cdiv(N, MM_BLOCK)):
                rows = range(y * MM_BLOCK, min(M, (y + 1) * MM_BLOCK))
                cols = range(x * MM_BLOCK, min(N, (x + 1) * MM_BLOCK))
                out.update(C.buffer.offset + i * sm + j * sn for i in rows for j in cols)
        return out

    def models():
        found = store_models(C, [named["A"], named["B"]], index, heads=False)
        found.append(("the program ids are swapped: the check launches the grid (cdiv(M, BLOCK_M), cdiv(N, "
                      "BLOCK_N)), so the rows come from tl.program_id(0) and the columns from tl.program_id(1)",
                      swapped()))
        found.append(("the store is masked on the rows only: the tiles at the right edge stick out past column "
                      "N - 1; mask=(rows < M)[:, None] & (cols < N)[None, :]", at(M, padded[1])))
        found.append(("the store is masked on the columns only: the tiles at the bottom edge stick out past row "
                      "M - 1; mask=(rows < M)[:, None] & (cols < N)[None, :]", at(padded[0], N)))
        return found

    name_store_mistake(where, C, models, unmasked=lambda: at(*padded),
                       mask_text="The tiles at the bottom and right edges stick out of C: store with "
                       "mask=(rows < M)[:, None] & (cols < N)[None, :].")


def _diagnose_matmul(kernel, named, where: str, passed: int, rerun) -> None:
    A, B, Cb = (named[n].buffer for n in "ABC")
    M, N = Cb.shape
    _mm_store(named, M, N, where)
    a, b = A.view.double().cpu(), B.view.double().cpu()
    got, ref = Cb.view.double().cpu(), a @ b
    if close(got, ref, tolerance(Cb.view.dtype)):
        return
    if not torch.isfinite(got).all():
        check_undefined_lanes(kernel, lambda: rerun(undefined_lanes=False), where)
        if torch.isfinite(rerun(fill=0.0)).all():
            raise ExerciseFailed(
                f"{where}: C has NaN, which goes away when the memory around A and B holds zeros: the last step of "
                "your K loop reads past K. Mask the loads along K too (ks < K), with other=0.0. For a dot product "
                "0 is the neutral value (unlike the -inf a softmax needs): the padded products add nothing.")
    model_tol = 1e-4 if Cb.view.dtype == torch.float32 else 10 * tolerance(Cb.view.dtype)
    for model, text in _matmul_models(a, b):
        if close(got, model, model_tol):
            raise ExerciseFailed(f"{where}: {text}.")
    offset = (got - ref).median().item() if torch.isfinite(got).all() else 0.0
    if offset and close(got, ref + offset, model_tol):
        raise ExerciseFailed(f"{where}: every element of C is off by the same {offset:.4g}: the accumulator does not "
                             "start at 0. acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32) before the K loop.")

    def evaluate(A=None, B=None):
        return (a if A is None else A) @ (b if B is None else B)

    name_read_mistake(where, got, model_tol, [named["A"], named["B"]], [named["C"]], evaluate)
    err = ((got - ref).norm() / ref.norm()).item()
    what = known(got, ref, tolerance(Cb.view.dtype))
    if passed and Cb.view.dtype == torch.float32:
        raise ExerciseFailed(f"{where}: the first case was right, this one is not ({what}), and no single mistake "
                             "the check knows reproduces it (the K loop's tail or step, the accumulator, the masks, "
                             "one tensor's strides, the program ids).")
    raise ExerciseFailed(f"{where}: C is wrong ({what})." + near_miss_hint(err, Cb.view.dtype))


@exercise("tiled matmul")
def check_matmul(kernel) -> str:
    """``kernel(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)``: C = A·B."""
    require_jit(kernel, "matmul_kernel")
    for seed, (label, M, N, K, layout, dtype) in enumerate(_MM_CASES):
        where = f"[{label}] M={M}, N={N}, K={K}, {_name(dtype)}"
        a, b = _randn(M, K, seed=20 + seed), _randn(K, N, seed=40 + seed)

        def run(fill=NAN, undefined_lanes=True, M=M, N=N, K=K, layout=layout, dtype=dtype, a=a, b=b, where=where):
            A, B, Cb = _mm_buffers(M, N, K, layout, dtype, a, b, fill)
            grid = (triton.cdiv(M, MM_BLOCK), triton.cdiv(N, MM_BLOCK))
            launch(kernel, grid, A.view, B.view, Cb.view, M, N, K, *A.view.stride(), *B.view.stride(),
                   *Cb.view.stride(), BLOCK_M=MM_BLOCK, BLOCK_N=MM_BLOCK, BLOCK_K=MM_BLOCK, PRECISION="ieee",
                   where=where, undefined_lanes=undefined_lanes)
            return A, B, Cb

        A, B, Cb = run()
        named = {"A": Named("A", A, "mk"), "B": Named("B", B, "kn"), "C": Named("C", Cb, "mn")}
        _diagnose_matmul(kernel, named, where, seed, lambda run=run, **kw: run(**kw)[2].view.double().cpu())
    require_masks(kernel, "Tiles at the edges stick out of A, B and C when M, N, K are not multiples of the block.")
    return ("multiples of the block, ragged sizes, a transposed B, no unit strides, one row; float32 (IEEE) and "
            "float16")
