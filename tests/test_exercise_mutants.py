"""Every Triton exercise: the worked solution passes its check, the untouched stub is 'not attempted', and
each mutant (the solution with one classic mistake written in) fails with the message naming that mistake.

The solutions and stubs are read from the notebooks, so what is tested is what the learner sees.
"""

from __future__ import annotations

import re

import pytest
from exercise_sources import definitions, load, mutate

from flashattn.exercises import ExerciseFailed, flash_kernels, flash_parts, primer, scores, split_kv

# exercise -> (notebook, solution functions, stub functions, check)
EXERCISES = {
    "scaled_add": ("01_triton_primer", ("my_scaled_add_kernel_solution", "my_scaled_add_solution"),
                   ("my_scaled_add_kernel", "my_scaled_add"), primer.check_scaled_add),
    "transpose": ("01_triton_primer", ("my_transpose_kernel_solution",), ("my_transpose_kernel",),
                  primer.check_transpose),
    "row_softmax": ("01b_triton_reductions_and_dot", ("my_softmax_kernel_solution",), ("my_softmax_kernel",),
                    primer.check_row_softmax),
    "matmul": ("01b_triton_reductions_and_dot", ("my_matmul_kernel_solution",), ("my_matmul_kernel",),
               primer.check_matmul),
    "scores": ("02_naive_attention", ("my_scores_kernel_solution",), ("my_scores_kernel",),
               scores.check_scores_kernel),
    "v1_update": ("04_flashattention_v1", ("my_v1_update_solution",), ("my_v1_update",),
                  flash_kernels.check_v1_update),
    "v2_update": ("05_flashattention_v2", ("my_v2_update_solution",), ("my_v2_update",), flash_parts.check_v2_update),
    "v2_keep": ("05_flashattention_v2", ("my_v2_keep_solution",), ("my_v2_keep",), flash_parts.check_v2_keep),
    "v2_kernel": ("05_flashattention_v2", ("my_attention_kernel_solution",), ("my_attention_kernel",),
                  flash_kernels.check_v2_kernel),
    "load_kt": ("06_bank_conflicts", ("my_load_kt_solution",), ("my_load_kt",), scores.check_load_kt),
    "merge_splits": ("15_decoding", ("my_merge_kernel_solution",), ("my_merge_kernel",), split_kv.check_merge_splits),
}

# (exercise, mutant, text in the solution, its replacement, what the check must say)
MUTANTS = [
    # --- 01: out = alpha * x + y, and its launcher
    ("scaled_add", "store_unmasked", "tl.store(OUT + offs, alpha * x + y, mask=mask)",
     "tl.store(OUT + offs, alpha * x + y)", "wrote past the end of OUT"),
    ("scaled_add", "load_unmasked", "x = tl.load(X + offs, mask=mask)", "x = tl.load(X + offs)",
     r"has no mask: line \d+ of the function: x = tl.load\(X \+ offs\)"),
    ("scaled_add", "mask_off_by_one", "mask = offs < N", "mask = offs <= N", "Only element N itself"),
    ("scaled_add", "no_program_offset", "offs = pid * BLOCK + tl.arange(0, BLOCK)", "offs = tl.arange(0, BLOCK)",
     "every program handled the same block"),
    ("scaled_add", "alpha_on_y", "alpha * x + y, mask", "x + alpha * y, mask", "alpha multiplies y"),
    ("scaled_add", "grid_rounds_down", "[(triton.cdiv(N, BLOCK),)]", "[(N // BLOCK,)]", "too few programs"),
    ("scaled_add", "output_float32", "out = torch.empty_like(x)", "out = torch.empty(x.shape, device=x.device)",
     "float32 for float16 inputs"),
    ("scaled_add", "output_shape", "    return out\n", "    return out[None]\n", r"shape \(1, 1000\)"),
    # --- 01: Y = Xᵀ through strides
    ("transpose", "strides_swapped", "cols[:, None] * stride_xn + rows[None, :] * stride_xm",
     "cols[:, None] * stride_xm + rows[None, :] * stride_xn", "copied without being turned around"),
    ("transpose", "assumes_contiguous", "rows[None, :] * stride_xm", "rows[None, :] * N",
     "you assumed X's rows are N"),
    ("transpose", "mask_swapped", "mask = (cols[:, None] < N) & (rows[None, :] < M)",
     "mask = (cols[:, None] < M) & (rows[None, :] < N)", "wrote .* outside Y"),
    ("transpose", "store_unmasked", "stride_yn, tile, mask=mask)", "stride_yn, tile)", "outside Y"),
    ("transpose", "load_unmasked", "rows[None, :] * stride_xm, mask=mask)", "rows[None, :] * stride_xm)",
     "has no mask"),
    ("transpose", "y_strides_swapped", "cols[:, None] * stride_ym + rows[None, :] * stride_yn",
     "cols[:, None] * stride_yn + rows[None, :] * stride_ym", "copied without being turned around"),
    ("transpose", "y_assumes_contiguous", "cols[:, None] * stride_ym", "cols[:, None] * M",
     "you stored Y as if its rows were M"),
    # --- 01b: softmax of each row
    ("row_softmax", "other_zero", 'other=float("-inf")', "other=0.0", r"loaded as 0\.0 and counted"),
    ("row_softmax", "load_unmasked", ', mask=cols < n_cols, other=float("-inf"))', ")", "every row has NaN"),
    ("row_softmax", "no_max", "tl.exp(x - tl.max(x, axis=0))", "tl.exp(x)", "Subtract the row max"),
    ("row_softmax", "x_row_stride", "X + row * stride_xm", "X + row * n_cols", "row 0 is right"),
    ("row_softmax", "y_row_stride", "Y + row * stride_ym", "Y + row * stride_xm", "outside Y"),
    ("row_softmax", "store_unmasked", "e / tl.sum(e, axis=0), mask=cols < n_cols)", "e / tl.sum(e, axis=0))",
     "outside Y"),
    ("row_softmax", "no_division", "e / tl.sum(e, axis=0), mask", "e, mask", "not 1: divide by the sum"),
    # --- 01b: C = A·B
    ("matmul", "k_unmasked", "mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0",
     "mask=rows[:, None] < M, other=0.0", "reads past K"),
    ("matmul", "k_not_advanced", "ks = start_k + tl.arange(0, BLOCK_K)", "ks = tl.arange(0, BLOCK_K)",
     "multiplies the same first blocks"),
    ("matmul", "acc_replaced", "acc = tl.dot(a, b, acc, input_precision=PRECISION)",
     "acc = tl.dot(a, b, input_precision=PRECISION)", "replaces the accumulator"),
    ("matmul", "b_strides_swapped", "ks[:, None] * stride_bk + cols[None, :] * stride_bn",
     "ks[:, None] * stride_bn + cols[None, :] * stride_bk", "B.s stride_bk and stride_bn are swapped"),
    ("matmul", "store_unmasked", "acc,\n             mask=(rows[:, None] < M) & (cols[None, :] < N))", "acc)",
     "stick out of C"),
    # --- 02: the scores kernel
    ("scores", "no_scale", "input_precision=PRECISION) * scale", "input_precision=PRECISION)",
     "the scale is missing"),
    ("scores", "scale_one_over_d", "input_precision=PRECISION) * scale", "input_precision=PRECISION) / D",
     "the scale is 1/D"),
    ("scores", "causal_missing", 'sij = tl.where(offs_n[None, :] <= offs_m[:, None], sij, float("-inf"))',
     "sij = sij", "the mask is missing"),
    ("scores", "causal_strict", "tl.where(offs_n[None, :] <= offs_m[:, None]",
     "tl.where(offs_n[None, :] < offs_m[:, None]", "off by one"),
    ("scores", "causal_local", "tl.where(offs_n[None, :] <= offs_m[:, None]",
     "tl.where(tl.arange(0, BLOCK_N)[None, :] <= tl.arange(0, BLOCK_M)[:, None]", "indices inside the tile"),
    ("scores", "causal_wrong_way", "tl.where(offs_n[None, :] <= offs_m[:, None]",
     "tl.where(offs_n[None, :] >= offs_m[:, None]", "points the wrong way"),
    ("scores", "causal_zero", 'sij, float("-inf"))', "sij, 0.0)", "hidden scores are 0, not -inf"),
    ("scores", "store_unmasked", "tl.store(s_ptrs, sij, mask=(offs_m[:, None] < N) & (offs_n[None, :] < N))",
     "tl.store(s_ptrs, sij)", "outside S"),
    ("scores", "store_row_mask_only", "mask=(offs_m[:, None] < N) & (offs_n[None, :] < N))",
     "mask=offs_m[:, None] < N)", "masked on the rows only"),
    ("scores", "load_unmasked", "qi = tl.load(q_ptrs, mask=offs_m[:, None] < N, other=0.0)",
     "qi = tl.load(q_ptrs)", "has no mask"),
    ("scores", "head_offsets_swapped", "off_b, off_h = pid_bh // H, pid_bh % H",
     "off_b, off_h = pid_bh % H, pid_bh // H", "off_b and off_h are swapped"),
    ("scores", "k_with_q_strides", "offs_n[:, None] * stride_kn", "offs_n[:, None] * stride_qn",
     r"K is addressed with stride_qn \(= 64\) where stride_kn \(= 51\) belongs"),
    ("scores", "assumes_contiguous", "off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qn",
     "pid_bh * N * D + offs_m[:, None] * D", "Q is addressed as if it were contiguous"),
    # --- 04: the v1 update in Triton
    ("v1_update", "keep_ignored", 'sij = tl.where(keep, sij, float("-inf"))', "sij = sij", "outside `keep` are used"),
    ("v1_update", "keep_zero", 'sij = tl.where(keep, sij, float("-inf"))', "sij = tl.where(keep, sij, 0.0)",
     "set to 0, not -inf"),
    ("v1_update", "unguarded", 'tl.exp(sij - tl.where(mij == float("-inf"), 0.0, mij)[:, None])',
     "tl.exp(sij - mij[:, None])", "fully masked inside a block"),
    ("v1_update", "exp_old_max", 'tl.where(mij == float("-inf"), 0.0, mij)[:, None]', "mi[:, None]",
     "every row is NaN"),
    ("v1_update", "exp_new_max_and_beta", 'tl.where(mij == float("-inf"), 0.0, mij)[:, None]', "mi_new[:, None]",
     "beta is applied twice"),
    ("v1_update", "missing_alpha", "alpha = tl.exp(mi - mi_new)", "alpha = tl.exp(mi_new - mi_new)",
     "old state is not rescaled"),
    ("v1_update", "missing_beta_o", "beta[:, None] * pv", "pv", r"pij @ vj is not multiplied by beta"),
    ("v1_update", "missing_beta_l", "beta * tl.sum(pij, 1)", "tl.sum(pij, 1)", "needs beta too"),
    ("v1_update", "missing_beta_both", ("beta[:, None] * pv", "beta * tl.sum(pij, 1)"), ("pv", "tl.sum(pij, 1)"),
     "missing from both"),
    ("v1_update", "no_division", " / li_new[:, None]", "", "never divided by li_new"),
    ("v1_update", "no_undo", "alpha[:, None] * li[:, None] * oi", "alpha[:, None] * oi", "multiply it back by li"),
    ("v1_update", "divide_by_old_l", " / li_new[:, None]", " / li[:, None]", "divide by li_new"),
    ("v1_update", "p_not_converted", "tl.dot(pij.to(vj.dtype), vj", "tl.dot(pij, vj", "same dtype"),
    # --- 05: the v2 forward kernel
    ("v2_kernel", "unmasked_tail", "keep = offs_n[None, :] < N\n", "keep = offs_n[None, :] >= 0\n",
     "keys past N .* count"),
    ("v2_kernel", "exp_old_max", "pij = tl.exp(sij - mi_new[:, None])", "pij = tl.exp(sij - mi[:, None])",
     "every row is NaN"),
    ("v2_kernel", "max_never_updated", "        mi = mi_new\n", "", "mi is never updated"),
    ("v2_kernel", "no_alpha_acc", "acc * alpha[:, None]", "acc", "acc is not rescaled"),
    ("v2_kernel", "no_alpha_l", "li = alpha * li +", "li = li +", "li is not rescaled"),
    ("v2_kernel", "no_alpha_both", ("acc * alpha[:, None]", "li = alpha * li +"), ("acc", "li = li +"),
     "neither acc nor li"),
    ("v2_kernel", "no_final_division", "acc / li[:, None], mask", "acc, mask", "never divided by li"),
    ("v2_kernel", "divide_every_step", ("        mi = mi_new\n", "acc / li[:, None], mask"),
     ("        acc = acc / li[:, None]\n        mi = mi_new\n", "acc, mask"), "divided by li at every step"),
    ("v2_kernel", "causal_strict", "(offs_n[None, :] <= offs_m[:, None])", "(offs_n[None, :] < offs_m[:, None])",
     "off by one"),
    ("v2_kernel", "causal_local", "(offs_n[None, :] <= offs_m[:, None])",
     "(tl.arange(0, BLOCK_N)[None, :] <= tl.arange(0, BLOCK_M)[:, None])", "indices inside the tiles"),
    ("v2_kernel", "causal_wrong_way", "(offs_n[None, :] <= offs_m[:, None])", "(offs_n[None, :] >= offs_m[:, None])",
     "points the wrong way"),
    ("v2_kernel", "causal_missing", "keep = keep & (offs_n[None, :] <= offs_m[:, None])", "keep = keep",
     "there is no causal mask"),
    ("v2_kernel", "causal_stops_early", "hi = tl.minimum(N, (pid_m + 1) * BLOCK_M) if CAUSAL else N",
     "hi = pid_m * BLOCK_M if CAUSAL else N", "stops before the diagonal block"),
    ("v2_kernel", "fa1_exponent_unguarded", ("mi_new = tl.maximum(mi, tl.max(sij, 1))",
                                             "pij = tl.exp(sij - mi_new[:, None])"),
     ("mij = tl.max(sij, 1)\n        mi_new = tl.maximum(mi, mij)",
      "pij = tl.exp(sij - mij[:, None]) * tl.exp(mij - mi_new)[:, None]"), "fully masked inside a diagonal block"),
    ("v2_kernel", "store_unmasked", "tl.store(o_ptrs, acc / li[:, None], mask=offs_m[:, None] < N)",
     "tl.store(o_ptrs, acc / li[:, None])", "outside O"),
    ("v2_kernel", "v_unmasked", "stride_vd,\n                     mask=offs_n[:, None] < N, other=0.0)",
     "stride_vd)", "reads past the end of a tensor"),
    ("v2_kernel", "head_offsets_swapped", "off_b, off_h = pid_bh // H, pid_bh % H",
     "off_b, off_h = pid_bh % H, pid_bh // H", "off_b and off_h are swapped"),
    ("v2_kernel", "head_offset_missing", "off_b * stride_qb + off_h * stride_qh", "off_b * stride_qb",
     "reads Q's heads at the wrong places: the head offset is missing"),
    ("v2_kernel", "k_with_q_strides", "offs_n[:, None] * stride_kn", "offs_n[:, None] * stride_qn",
     r"K is addressed with stride_qn \(= 64\) where stride_kn \(= 51\) belongs"),
    ("v2_kernel", "assumes_contiguous", "off_b * stride_qb + off_h * stride_qh", "pid_bh * N * D",
     r"Q is addressed as if it were contiguous in stride_qb \(taken as 544, here 1280\), stride_qh"),
    ("v2_kernel", "p_not_converted", "tl.dot(pij.to(vj.dtype), vj", "tl.dot(pij, vj", "same dtype"),
    ("v2_kernel", "no_max_subtraction", ("pij = tl.exp(sij - mi_new[:, None])", "alpha = tl.exp(mi - mi_new)"),
     ("pij = tl.exp(sij)", "alpha = tl.full([BLOCK_M], 1.0, tl.float32)"), "exp overflows float32"),
    # --- 05, in parts: the update of one K/V block inside the given loop, and the mask of a tile
    ("v2_update", "keep_ignored", 'sij = tl.where(keep, sij, float("-inf"))', "sij = sij",
     "the scores outside `keep` are used"),
    ("v2_update", "exp_old_max", "pij = tl.exp(sij - mi_new[:, None])", "pij = tl.exp(sij - mi[:, None])",
     "every row is NaN"),
    ("v2_update", "no_alpha_acc", "acc * alpha[:, None]", "acc", "acc is not rescaled"),
    ("v2_update", "no_alpha_l", "li = alpha * li +", "li = li +", "li is not rescaled"),
    ("v2_update", "old_max_returned", "    return mi_new, li, acc", "    return mi, li, acc",
     "mi is never updated"),
    ("v2_update", "p_not_converted", "tl.dot(pij.to(vj.dtype), vj", "tl.dot(pij, vj", "same dtype"),
    ("v2_keep", "tail_kept", "keep = offs_n[None, :] < N", "keep = offs_n[None, :] >= 0",
     "the keys past N are kept"),
    ("v2_keep", "key_n_kept", "keep = offs_n[None, :] < N", "keep = offs_n[None, :] <= N",
     "lets key N itself through"),
    ("v2_keep", "causal_strict", "(offs_n[None, :] <= offs_m[:, None])", "(offs_n[None, :] < offs_m[:, None])",
     "off by one"),
    ("v2_keep", "causal_local", "(offs_n[None, :] <= offs_m[:, None])",
     "(tl.arange(0, offs_n.shape[0])[None, :] <= tl.arange(0, offs_m.shape[0])[:, None])", "indices inside the tiles"),
    ("v2_keep", "causal_wrong_way", "(offs_n[None, :] <= offs_m[:, None])",
     "(offs_n[None, :] >= offs_m[:, None])", "points the wrong way"),
    ("v2_keep", "causal_missing", "    if CAUSAL:\n        keep = keep & (offs_n[None, :] <= offs_m[:, None])\n",
     "", "there is no causal mask"),
    ("v2_keep", "causal_always", "    if CAUSAL:\n        keep = keep & (offs_n[None, :] <= offs_m[:, None])",
     "    keep = keep & (offs_n[None, :] <= offs_m[:, None])", "applied although CAUSAL is False"),
    # --- 06: the Kᵀ tile through strides
    ("load_kt", "strides_swapped", "offs_d[:, None] * stride_kd + offs_n[None, :] * stride_kn",
     "offs_d[:, None] * stride_kn + offs_n[None, :] * stride_kd", "K's strides are swapped"),
    ("load_kt", "assumes_contiguous", "offs_n[None, :] * stride_kn", "offs_n[None, :] * D",
     "you assumed K's rows are D"),
    ("load_kt", "other_neg_inf", "other=0.0", 'other=float("-inf")', "read as -inf"),
    ("load_kt", "mask_on_d", "mask=offs_n[None, :] < N", "mask=offs_d[:, None] < N", "keys past N are not 0.0"),
    ("load_kt", "unmasked", ",\n                   mask=offs_n[None, :] < N, other=0.0)", ")",
     "keys past N are not 0.0"),
    ("load_kt", "no_start", "offs_n = start_n + tl.arange(0, BLOCK_N)", "offs_n = tl.arange(0, BLOCK_N)",
     "same tile"),
    ("load_kt", "wrong_shape",
     ("offs_d[:, None] * stride_kd + offs_n[None, :] * stride_kn", "mask=offs_n[None, :] < N"),
     ("offs_d[None, :] * stride_kd + offs_n[:, None] * stride_kn", "mask=offs_n[:, None] < N"),
     r"\(D, BLOCK_N\) tile"),
    ("load_kt", "through_trans",
     ("return tl.load(k_base + offs_d[:, None] * stride_kd + offs_n[None, :] * stride_kn",
      "mask=offs_n[None, :] < N, other=0.0)"),
     ("return tl.trans(tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd",
      "mask=offs_n[:, None] < N, other=0.0))"),
     "through tl.trans"),
    # --- 15: the merge of the splits
    ("merge_splits", "no_max", "w = tl.exp(lse - m)", "w = tl.exp(lse)", "without subtracting the largest lse"),
    ("merge_splits", "weights_lse", "w = tl.exp(lse - m)", 'w = tl.where(lse > float("-inf"), lse, 0.0)',
     "as if lse were the sum l"),
    ("merge_splits", "no_division", " / tl.sum(w, 0)", "", "not divided by the sum of the weights"),
    ("merge_splits", "uniform", "w = tl.exp(lse - m)", 'w = tl.where(lse > float("-inf"), 1.0, 0.0)',
     "every split weighs the same"),
    ("merge_splits", "exp2", "tl.exp(lse - m)", "tl.exp2(lse - m)", "lse is in natural log"),
    ("merge_splits", "padding_counted", 'mask=offs_s < num_splits, other=float("-inf"))',
     "mask=offs_s < num_splits, other=0.0)", "the lanes past num_splits count as splits"),
    ("merge_splits", "empty_read", "mask=full[:, None], other=0.0)", "mask=(offs_s < num_splits)[:, None], other=0.0)",
     "partial outputs of the empty splits"),
    ("merge_splits", "row_stride", "row * stride_pr", "row * num_splits * D", "row 0 is right"),
    ("merge_splits", "lse_row_stride", "row * stride_lr", "row * num_splits", "row 0 is right"),
    ("merge_splits", "out_row_stride", "row * stride_or", "row * D", "outside O"),
    ("merge_splits", "split_stride", "offs_s[:, None] * stride_ps", "offs_s[:, None] * D", "reads outside them"),
]


def _functions(module, names):
    return [getattr(module, name) for name in names]


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_solution_passes_and_stub_is_not_attempted(exercise, tmp_path, capsys):
    notebook, solution, stub, check = EXERCISES[exercise]
    module = load(definitions(notebook, solution), tmp_path, f"solution_{exercise}")
    assert check(*_functions(module, solution)) is True
    assert "passed" in capsys.readouterr().out
    stubs = load(definitions(notebook, stub), tmp_path, f"stub_{exercise}")
    assert check(*_functions(stubs, stub)) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_every_exercise_has_mutants():
    assert {m[0] for m in MUTANTS} == set(EXERCISES)
    assert len({(m[0], m[1]) for m in MUTANTS}) == len(MUTANTS)


@pytest.mark.parametrize("exercise, name, old, new, message", MUTANTS, ids=[f"{m[0]}-{m[1]}" for m in MUTANTS])
def test_mutant_is_named(exercise, name, old, new, message, tmp_path, monkeypatch):
    # without the compile for a GPU that a check runs first in interpreter mode (a second or two per new kernel):
    # none of these mutants is refused by the compiler, the solutions above compile with it, and the mistakes only
    # a GPU compiler sees are tested with it on (tests/test_exercise_mistake_classes.py)
    monkeypatch.setenv("FLASHATTN_COMPILE_AHEAD", "0")
    notebook, solution, _, check = EXERCISES[exercise]
    source = mutate(definitions(notebook, solution), old, new)
    module = load(source, tmp_path, f"mutant_{exercise}_{name}")
    with pytest.raises(ExerciseFailed) as err:
        check(*_functions(module, solution))
    assert re.search(message, str(err.value)), str(err.value)
