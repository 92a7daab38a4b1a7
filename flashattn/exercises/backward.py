"""The fill-in-the-kernel exercise of notebook 12: the dS step of the backward pass, in Triton.

``check_ds_step(step)`` takes the learner's ``@triton.jit`` function

    step(qi, kj, vj, doi, lse_i, delta_i, offs_m, offs_n, scale, CAUSAL, PRECISION) -> dsij

the step at the heart of both backward kernels: from one tile's inputs (``qi``, ``doi``: (BLOCK_M, D);
``kj``, ``vj``: (BLOCK_N, D); the saved ``lse_i`` and ``delta_i`` of its rows; the positions ``offs_m`` of
its queries and ``offs_n`` of its keys), recompute ``sij`` and ``pij`` and return
``dsij = pij ∘ (dpij − delta_i)``, (BLOCK_M, BLOCK_N). ``ds_tile_kernel`` (below) loads the tiles, calls the
step and stores dS, one program per (Q block, K/V block, head), with BLOCK_M = BLOCK_N = 32 and D = 16.
The check runs it on cases ordered so that one kind of mistake shows at a time, and when the result is
wrong compares it with float64 models of the step with one classic mistake in each. A stub whose body is
still ``pass`` is "not attempted yet".
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flashattn import runtime

from ._check import ExerciseFailed, exercise
from .attention_cases import Case
from .evidence import known
from .triton_check import SHAPE_ERRORS, Buffer, check_writes, close, launch, require_jit, tolerance

BLOCK = 32  # BLOCK_M = BLOCK_N: a row/column mix-up then runs, and the models can name it
D = 16      # not the block size: a missing transpose fails to compile instead of mixing D with keys


CASES = (
    Case("one head, whole tiles", 1, 1, 64, D, False),
    Case("ragged N, B and H > 1", 2, 2, 50, D, False),
    Case("causal", 1, 2, 64, D, True),
    Case("causal, ragged, large scores", 2, 1, 45, D, True, q_scale=3.0),
    Case("float16", 1, 2, 40, D, True, torch.float16),
)


def _inputs(case: Case, seed: int):
    """q, k, v, dO (B·H, N, D) rounded to the case's dtype, and the forward's lse and delta, in float64."""
    gen = torch.Generator().manual_seed(seed)
    shape = (case.B * case.H, case.N, D)
    q, k, v, do = (torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(4))
    q, k, v, do = (t.to(case.dtype).double() for t in (case.q_scale * q, k, v, do))
    s = (q @ k.transpose(1, 2)) / math.sqrt(D)
    if case.causal:
        s = s.masked_fill(torch.ones(case.N, case.N, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = (torch.softmax(s, dim=-1) @ v).to(case.dtype).double()  # the forward's output, as stored
    delta = (do * o).sum(-1)
    return q, k, v, do, lse, delta


def ds_model(q, k, v, do, lse, delta, causal: bool, *, mask="right", masked_value=float("-inf"), p="lse",
             scale="right", lse_axis="row", delta_axis="row", use_delta=True, sign=1, transposed=(),
             rounded=(), ds_scaled=False) -> torch.Tensor:
    """dS in float64, tile by tile (BLOCK × BLOCK), with one mistake switched on.

    mask: "right" (key j <= query i), "strict" (j < i), "wrong_way" (j >= i), "none"; masked_value: what masked
    scores become (-inf, or 0.0); p: "lse" (exp(s − lse_i)), "exp2" (exp2(s − lse_i), no log2 e), "scores" (the
    scores in place of P), "block" (a softmax of the tile's own scores), "raw" (exp(s), no statistic), "plus_lse"
    (exp(s + lse_i)), "tile_max" (exp(s − the tile's row max), not normalized), "delta" (exp(s − delta_i));
    scale: "right", "none", "twice", "sqrt(D)" (what multiplies q·kᵀ: 1/sqrt(D), 1, 1/D, sqrt(D));
    lse_axis/delta_axis: "row" or "col" (broadcast along the wrong axis of the tile); transposed: "s" and/or
    "dp" computed transposed in each tile (e.g. tl.dot(kj, tl.trans(qi)) for sij); rounded: "p", "dp", "ds"
    rounded to float16; ds_scaled: dS multiplied by the scale (which belongs to dQ and dK, after this step)."""
    BH, N, _ = q.shape
    n_pad = -(-N // BLOCK) * BLOCK  # rows and columns past N hold what the stub's masked loads give: zeros
    q, k, v, do = (torch.nn.functional.pad(t, (0, 0, 0, n_pad - N)) for t in (q, k, v, do))
    lse, delta = (torch.nn.functional.pad(t, (0, n_pad - N)) for t in (lse, delta))
    factor = {"right": 1 / math.sqrt(D), "none": 1.0, "twice": 1 / D, "sqrt(D)": math.sqrt(D)}[scale]
    s_all = q @ k.transpose(1, 2) * factor
    dp_all = do @ v.transpose(1, 2)
    out = torch.zeros(BH, n_pad, n_pad, dtype=torch.float64)

    def half(x, where):
        return x.to(torch.float16).double() if where in rounded else x

    def tile(all_, rows, cols, name):
        t = all_[:, rows][:, :, cols]  # transposed: [a, b] = X[m0 + b, n0 + a], the product of (key a, query b)
        return t if name not in transposed else t.transpose(1, 2)

    for m0 in range(0, n_pad, BLOCK):
        rows = torch.arange(m0, m0 + BLOCK)
        for n0 in range(0, n_pad, BLOCK):
            cols = torch.arange(n0, n0 + BLOCK)
            s, dp = tile(s_all, rows, cols, "s"), half(tile(dp_all, rows, cols, "dp"), "dp")
            # this tile's lse_i and delta_i are those of its rows; the wrong axis puts them along the columns
            lse_t = lse[:, rows][:, :, None] if lse_axis == "row" else lse[:, rows][:, None, :]
            delta_t = delta[:, rows][:, :, None] if delta_axis == "row" else delta[:, rows][:, None, :]
            keep = torch.ones(BLOCK, BLOCK, dtype=torch.bool)
            if causal and mask != "none":
                keep = {"right": cols[None, :] <= rows[:, None], "strict": cols[None, :] < rows[:, None],
                        "wrong_way": cols[None, :] >= rows[:, None]}[mask]
            s = torch.where(keep, s, torch.tensor(masked_value, dtype=torch.float64))
            if p == "block":  # softmax within the tile (NaN for rows with every score masked)
                pij = torch.exp(s - s.amax(-1, keepdim=True))
                pij = pij / pij.sum(-1, keepdim=True)
            elif p == "scores":
                pij = s
            elif p == "exp2":
                pij = torch.exp2(s - lse_t)
            else:
                against = {"lse": lse_t, "raw": 0.0, "plus_lse": -lse_t, "tile_max": s.amax(-1, keepdim=True),
                           "delta": delta_t}[p]
                pij = torch.exp(s - against)
            pij = half(pij, "p")
            ds = pij * (dp - delta_t) if use_delta else pij * dp
            out[:, m0:m0 + BLOCK, n0:n0 + BLOCK] = half(sign * ds * (1 / math.sqrt(D) if ds_scaled else 1.0), "ds")
    return out[:, :N, :N]


ROUNDED = ("rounded to float16 (the model of that reproduces the result): in a float32 case keep every step in "
           "float32, no .to(tl.float16) in the step")
MISTAKES = (  # (message, model options); the first model that matches names the mistake
    ("you left out the − delta_i: dS = P ∘ (dP − delta), and delta_i = rowsum(dO_i ∘ O_i) is one number per "
     "query row (the LSE's partner: it is where the softmax's normalization enters the gradient)",
     dict(use_delta=False)),
    ("the sign of dS is flipped: dS = P ∘ (dP − delta), not P ∘ (delta − dP)", dict(sign=-1)),
    ("you used the scores sij where the probabilities belong: P must be exponentiated first, "
     "pij = exp(sij − lse_i)", dict(p="scores")),
    ("you used the scores sij where the probabilities belong (and masked them with 0): P must be exponentiated "
     "first, pij = exp(sij − lse_i)", dict(p="scores", masked_value=0.0)),
    ("the scale is missing: the forward exponentiated scale · qi · kjᵀ, so sij = tl.dot(qi, tl.trans(kj)) * scale "
     "before pij = exp(sij − lse_i)", dict(scale="none")),
    ("the scale is applied twice (scale² · qi · kjᵀ): sij = tl.dot(qi, tl.trans(kj)) * scale, once",
     dict(scale="twice")),
    ("the scale is sqrt(D): `scale` is already 1/sqrt(D), so sij = tl.dot(qi, tl.trans(kj)) * scale",
     dict(scale="sqrt(D)")),
    ("dS is multiplied by the scale: that factor belongs to dQ = scale · dS · K and dK = scale · dSᵀ · Q, after "
     "this step; return dsij = pij ∘ (dpij − delta_i) as it is", dict(ds_scaled=True)),
    ("you used exp2 on natural-log quantities: lse_i is a natural log-sum-exp, so pij = tl.exp(sij − lse_i) "
     "(or exp2 of (sij − lse_i) · log2(e))", dict(p="exp2")),
    ("the exponential is taken against no statistic, pij = exp(sij): the forward's P is exp(sij − lse_i), with "
     "the saved log-sum-exp of row i", dict(p="raw")),
    ("the log-sum-exp is added, exp(sij + lse_i): it is subtracted, pij = exp(sij − lse_i)", dict(p="plus_lse")),
    ("the exponential is taken against delta_i, dS's other statistic: P is exp(sij − lse_i), against the "
     "log-sum-exp", dict(p="delta")),
    ("the exponential is taken against the tile's own row max: P is exp(sij − lse_i), against the saved "
     "log-sum-exp, which already normalizes over all keys", dict(p="tile_max")),
    ("lse comes from the wrong row: lse_i[None, :] broadcasts the log-sum-exp along the keys; each query row i "
     "subtracts its own lse_i, lse_i[:, None]", dict(lse_axis="col")),
    ("delta comes from the wrong row: delta_i[None, :] broadcasts it along the keys; each query row subtracts "
     "its own delta_i, delta_i[:, None]", dict(delta_axis="col")),
    ("you normalized P inside the tile (a softmax of this tile's scores): the saved lse_i already normalizes "
     "over all keys, so pij = exp(sij − lse_i), with no max or sum here", dict(p="block")),
    ("dpij is the tile transposed: tl.dot(vj, tl.trans(doi)) gives dPᵀ (keys down, queries across); the tile "
     "is dpij = tl.dot(doi, tl.trans(vj)), queries down", dict(transposed=("dp",))),
    ("sij is the tile transposed: tl.dot(kj, tl.trans(qi)) gives Sᵀ (keys down, queries across); the tile is "
     "sij = tl.dot(qi, tl.trans(kj)) * scale, queries down", dict(transposed=("s",))),
    ("sij and dpij are both the tile transposed (keys down, queries across): sij = tl.dot(qi, tl.trans(kj)) * "
     "scale and dpij = tl.dot(doi, tl.trans(vj)), queries down", dict(transposed=("s", "dp"))),
    (f"pij is {ROUNDED}", dict(rounded=("p",))),
    (f"dpij is {ROUNDED}", dict(rounded=("dp",))),
    (f"dsij is {ROUNDED}", dict(rounded=("ds",))),
)
CAUSAL_MISTAKES = (
    ("the causal mask is not applied to dS: where key j > query i, P is 0 and so is dS; mask the scores "
     "(tl.where(offs_n[None, :] <= offs_m[:, None], sij, float('-inf'))) before the exponential",
     dict(mask="none")),
    ("the causal mask is off by one: query i sees key i itself (keep offs_n <= offs_m, not <)",
     dict(mask="strict")),
    ("the causal mask points the wrong way: it keeps the keys after each query and hides the ones before; keep "
     "key j for query i when offs_n <= offs_m", dict(mask="wrong_way")),
    ("the masked scores are set to 0, not -inf: exp(0 − lse_i) is not 0, so masked keys still get a "
     "gradient; use float('-inf')", dict(masked_value=0.0)),
)
TESTED = ("delta left out, the sign, the scores for P, the scale missing, twice, sqrt(D) or on dS, exp2, the "
          "exponential against no statistic, +lse, delta or the tile's max, lse or delta along the wrong axis, a "
          "softmax inside the tile, sij or dpij transposed, float16 rounding of pij, dpij or dsij, and the causal "
          "mask missing, off by one, reversed or filling 0")


def _dark_tile_rows(case: Case) -> torch.Tensor:
    """(N, N): True at (i, j) when the causal mask hides every key of j's tile from query i."""
    rows = torch.arange(case.N)
    first_key = torch.arange(case.N) // BLOCK * BLOCK  # the first key of each column's tile
    if not case.causal:
        return torch.zeros(case.N, case.N, dtype=torch.bool)
    return first_key[None, :] > rows[:, None]


def _diagnose(case: Case, got, inputs, tol) -> None:
    q, k, v, do, lse, delta = inputs
    ref = ds_model(q, k, v, do, lse, delta, case.causal)
    mistakes = MISTAKES + (CAUSAL_MISTAKES if case.causal else ())
    model_tol = 1e-4 if case.dtype == torch.float32 else 3 * tol
    for message, options in mistakes:
        if options.get("rounded") and case.dtype != torch.float32:
            continue  # float16 rounding is no mistake in a float16 case
        model = ds_model(q, k, v, do, lse, delta, case.causal, **options)
        if not close(model, ref, tol) and close(got, model, model_tol):
            raise ExerciseFailed(f"{case.text()}: {message}")
    nan = torch.isnan(got)
    if nan.any() and torch.equal(nan, _dark_tile_rows(case).expand_as(nan)):
        bh, row, col = (int(i) for i in torch.nonzero(nan)[0])
        raise ExerciseFailed(f"{case.text()}: row {row} (head {bh}) of dS is NaN in the tile of keys {col}.."
                             f"{col + BLOCK - 1}, where the causal mask hides every key from that row: a max or a "
                             "sum over the tile's masked scores gives -inf − (-inf) or 0/0 there. With the saved "
                             "lse_i nothing is taken over the tile: pij = exp(sij − lse_i), and exp(-inf) is 0.")
    what = known(got, ref, tol, row="query row", col="key column")
    if not torch.isfinite(got).all():
        raise ExerciseFailed(f"{case.text()}: dS has NaN or inf entries ({what}): check what the masked scores "
                             "become (-inf before the exponential; never inf · 0)")
    raise ExerciseFailed(f"{case.text()}: dS is wrong, and the check cannot tell which mistake it is: none of the "
                         f"ones it knows reproduces it ({TESTED}). What is known: {what}, against dS = P ∘ (dP − "
                         "delta) computed in float64.")


@triton.jit
def ds_tile_kernel(Q, K, V, DO, LSE, DELTA, DS, N, scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr, DS_STEP: tl.constexpr):
    """One (Q block, K/V block) tile of dS for one head, by the learner's DS_STEP. Q, K, V, DO: contiguous
    (B·H, N, D); LSE, DELTA: (B·H, N); DS: (B·H, N, N) float32."""
    pid_m, pid_n, pid_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    row_ok, col_ok = offs_m < N, offs_n < N
    head = pid_bh * N * D
    qi = tl.load(Q + head + offs_m[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    doi = tl.load(DO + head + offs_m[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    kj = tl.load(K + head + offs_n[:, None] * D + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    vj = tl.load(V + head + offs_n[:, None] * D + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    lse_i = tl.load(LSE + pid_bh * N + offs_m, mask=row_ok, other=0.0)
    delta_i = tl.load(DELTA + pid_bh * N + offs_m, mask=row_ok, other=0.0)
    dsij = DS_STEP(qi, kj, vj, doi, lse_i, delta_i, offs_m, offs_n, scale, CAUSAL, PRECISION)
    tl.store(DS + pid_bh * N * N + offs_m[:, None] * N + offs_n[None, :], dsij,
             mask=row_ok[:, None] & col_ok[None, :])


def _run(step, case: Case, seed: int):
    inputs = _inputs(case, seed)
    q, k, v, do, lse, delta = inputs
    dev = runtime.DEVICE
    args = [t.to(device=dev, dtype=case.dtype).contiguous() for t in (q, k, v, do)]
    args += [t.to(device=dev, dtype=torch.float32).contiguous() for t in (lse, delta)]
    out = Buffer((case.B * case.H, case.N, case.N), torch.float32)
    grid = (triton.cdiv(case.N, BLOCK), triton.cdiv(case.N, BLOCK), case.B * case.H)
    precision = "ieee" if case.dtype == torch.float32 else "tf32"
    try:
        launch(ds_tile_kernel, grid, *args, out.view, case.N, 1 / math.sqrt(D), D=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK,
               CAUSAL=case.causal, PRECISION=precision, DS_STEP=step, where=case.text(), source=step)
    except ExerciseFailed as err:
        text, chain = str(err), [err.__cause__]
        while chain[-1] is not None and chain[-1].__cause__ is not None and len(chain) < 10:
            chain.append(chain[-1].__cause__)
        reasons = " ".join([text] + [str(e) for e in chain if e is not None])  # compiled ahead: the text only
        if "NoneType" in reasons or "'None'" in reasons:
            raise ExerciseFailed(f"{text}\nHint: the step must end with `return dsij` (a (BLOCK_M, BLOCK_N) "
                                 "tile).") from err
        line = next((line for line in text.splitlines() if line.startswith("In line ")), "")
        if "tl.dot" in line and any(key in reasons for key in SHAPE_ERRORS):  # this step's hint, for its products
            without_hint = text.split("\nHint: ")[0]
            raise ExerciseFailed(f"{without_hint}\nHint: tl.dot multiplies (M, K) by (K, N); qi, doi are (BLOCK_M, "
                                 "D) and kj, vj (BLOCK_N, D), so both products need the transpose: "
                                 "tl.dot(doi, tl.trans(vj)).") from err
        raise
    return out, inputs


@exercise("the dS step")
def check_ds_step(step):
    """``step``: the learner's ``@triton.jit`` dS step (see the module docstring)."""
    require_jit(step, "my_ds_step")
    for i, case in enumerate(CASES):
        out, inputs = _run(step, case, seed=i)
        check_writes(out, "DS", case.text(), "(the driver kernel stores the tile: this should not happen)")
        got = out.view.detach().double().cpu()
        tol = tolerance(case.dtype)
        if not close(got, ds_model(*inputs, case.causal), tol):
            _diagnose(case, got, inputs, tol)
    return "dS = P ∘ (dP − delta), with P recomputed from the saved log-sum-exp, on every case"
