"""Classes of learner mistakes the Triton exercise checks must catch by name (issue 29), one or more mutants each.

The mutants are the worked solutions (read from the notebooks) with one mistake written in, grouped by what a
check needs to see them: a layout with its own strides in every tensor (none of them 1); values that expose a
wrong start of the running state; a compile for a GPU (what the interpreter runs anyway); a result close to
the right one (rounding) that must end in a message, never a crash; a diagnosis that tests the mistake it
names; masked-off lanes that a GPU leaves undefined. (The mutants of notebook 05's kernel in parts, the update and
the mask of a tile, are with every exercise's own in test_exercise_mutants.py.)
"""

from __future__ import annotations

import re

import pytest
from exercise_sources import definitions, load, mutate
from test_exercise_mutants import EXERCISES

from flashattn import runtime
from flashattn.exercises import ExerciseFailed, primer

# Written against the interpreter, where the checks compile the learner's kernel for a GPU ahead of time and fill
# masked-off lanes with NaN (a GPU leaves them undefined): on a GPU the compile-only and masked-lane classes read
# otherwise. Not yet run on a GPU; the mutants of test_exercise_mutants.py run in both modes.
pytestmark = pytest.mark.skipif(runtime.MODE != "interpreter", reason="written against interpreter mode")

# (class, exercise, mutant, text in the solution, its replacement, what the check must say)
CLASSES = [
    # --- layout: a tensor read or written with another tensor's strides, or as if contiguous (the last stride too)
    ("layout", "v2_kernel", "v_with_k_row_stride", "offs_n[:, None] * stride_vn", "offs_n[:, None] * stride_kn",
     r"reads the wrong elements of V: V is addressed with stride_kn \(= 51\) where stride_vn \(= 1\) belongs"),
    ("layout", "v2_kernel", "k_unit_last_stride", "offs_d[None, :] * stride_kd", "offs_d[None, :]",
     r"K is addressed as if it were contiguous in stride_kd \(taken as 1, here 3\)"),
    ("layout", "v2_kernel", "o_rows_contiguous", "offs_m[:, None] * stride_on + offs_d[None, :] * stride_od",
     "offs_m[:, None] * D + offs_d[None, :]", r"stores O at the wrong places: O is addressed as if it were "
     r"contiguous in stride_on \(taken as 16, here 76\), stride_od \(taken as 1, here 4\)"),
    ("layout", "v2_kernel", "o_with_q_strides",
     "O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od",
     "O + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd",
     # the contiguous cases come first: there Q's strides are the contiguous ones, and that is what the check says
     "stores O's heads at the wrong places: the heads are taken as if the tensor were contiguous"),
    ("layout", "v2_kernel", "program_ids_swapped", "pid_m, pid_bh = tl.program_id(0), tl.program_id(1)",
     "pid_bh, pid_m = tl.program_id(0), tl.program_id(1)", "the program ids are swapped"),
    ("layout", "scores", "s_rows_contiguous", "offs_m[:, None] * stride_sm + offs_n[None, :] * stride_sn",
     "offs_m[:, None] * N + offs_n[None, :]", "stores S at the wrong places: S is addressed as if it were contiguous"),
    ("layout", "scores", "q_with_k_last_stride", "offs_d[None, :] * stride_qd", "offs_d[None, :] * stride_kd",
     r"Q is addressed with stride_kd \(= 3\) where stride_qd \(= 2\) belongs"),
    ("layout", "scores", "program_ids_swapped", "pid_m, pid_n, pid_bh = tl.program_id(0), tl.program_id(1)",
     "pid_n, pid_m, pid_bh = tl.program_id(0), tl.program_id(1)", "program ids are taken from the wrong axes"),
    ("layout", "matmul", "c_contiguous", "rows[:, None] * stride_cm + cols[None, :] * stride_cn",
     "rows[:, None] * N + cols[None, :]", "stores C at the wrong places: C is addressed as if it were contiguous"),
    ("layout", "matmul", "a_unit_k_stride", "ks[None, :] * stride_ak", "ks[None, :]",
     r"A is addressed as if it were contiguous in stride_ak \(taken as 1, here 2\)"),
    ("layout", "matmul", "program_ids_swapped",  # harmless on a square grid: the one-row case shows it
     ("rows = tl.program_id(0) * BLOCK_M", "cols = tl.program_id(1) * BLOCK_N"),
     ("rows = tl.program_id(1) * BLOCK_M", "cols = tl.program_id(0) * BLOCK_N"), "the program ids are swapped"),
    ("layout", "transpose", "x_unit_column_stride", "cols[:, None] * stride_xn", "cols[:, None]",
     r"elements of a row of X are next to each other \(stride_xn = 1"),
    ("layout", "transpose", "y_unit_column_stride", "cols[:, None] * stride_ym + rows[None, :] * stride_yn",
     "cols[:, None] * stride_ym + rows[None, :]", r"elements of a row were next to each other \(stride_yn = 1"),
    # --- initialisation: rows whose scores are all far below zero, rows of mixed sign
    ("init", "v2_kernel", "max_from_zero", 'mi = tl.full([BLOCK_M], float("-inf"), tl.float32)',
     "mi = tl.zeros([BLOCK_M], tl.float32)", "rows whose scores are all below -100 are NaN: mi starts at 0"),
    ("init", "v2_kernel", "max_from_zero_sum_from_one",
     ('mi = tl.full([BLOCK_M], float("-inf"), tl.float32)', "li = tl.zeros([BLOCK_M], tl.float32)"),
     ("mi = tl.zeros([BLOCK_M], tl.float32)", "li = tl.full([BLOCK_M], 1.0, tl.float32)"),
     "mi starts at 0 and li at 1"),
    ("init", "v2_kernel", "max_from_zero_acc_from_one",
     ('mi = tl.full([BLOCK_M], float("-inf"), tl.float32)', "acc = tl.zeros([BLOCK_M, D], tl.float32)"),
     ("mi = tl.zeros([BLOCK_M], tl.float32)", "acc = tl.full([BLOCK_M, D], 1.0, tl.float32)"),
     "mi starts at 0 and acc does not start at 0"),
    ("init", "matmul", "acc_from_one", "acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)",
     "acc = tl.full([BLOCK_M, BLOCK_N], 1.0, tl.float32)", "off by the same 1: the accumulator does not start at 0"),
    # --- what only a GPU compiler refuses (compiled ahead of time in interpreter mode)
    ("compile", "v2_kernel", "fp16_accumulator", "acc = tl.zeros([BLOCK_M, D], tl.float32)",
     "acc = tl.zeros([BLOCK_M, D], tl.float16)", r"(?s)compiled for a GPU \(sm_80\).*Loop-carried variable acc.*"
     r"acc starts as fp16 in line 19 of my_attention_kernel_solution.*Hint: a variable updated in a loop"),
    ("compile", "matmul", "fp16_accumulator", "acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)",
     "acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float16)",
     r"(?s)compiled for a GPU.*acc starts as fp16 in line \d+ of my_matmul_kernel_solution: acc = tl.zeros"),
    ("compile", "v2_kernel", "runtime_shape", "li = tl.zeros([BLOCK_M], tl.float32)", "li = tl.zeros([N], tl.float32)",
     r"(?s)compiled for a GPU.*In line 18 of my_attention_kernel_solution: li = tl.zeros\(\[N\].*constexpr sizes"),
    ("compile", "v2_kernel", "break_in_loop", "for start_n in range(0, hi, BLOCK_N):",
     "for start_n in range(0, N, BLOCK_N):\n        if start_n >= hi:\n            break",
     r"(?s)compiled for a GPU.*unsupported AST node type: Break.*Hint: a GPU kernel's loop has no break"),
    ("compile", "v1_update", "undefined_name", "mij = tl.max(sij, 1)",
     "mij = tl.max(sij, 1)\n    for i in range(len(offs_m)):\n        pass", r"(?s)compiled for a GPU.*offs_m"),
    # --- close to the right result: rounding to float16 in a float32 case ends in a message naming it
    ("rounding", "v2_kernel", "stored_output", "tl.store(o_ptrs, acc / li[:, None]",
     "tl.store(o_ptrs, (acc / li[:, None]).to(tl.float16)", "as if the stored output were rounded to float16"),
    ("rounding", "v2_kernel", "exponentials", "pij = tl.exp(sij - mi_new[:, None])",
     "pij = tl.exp(sij - mi_new[:, None]).to(tl.float16).to(tl.float32)", "as if the exponentials pij were rounded"),
    ("rounding", "v1_update", "output", "    return oi_new, li_new, mi_new",
     "    return oi_new.to(tl.float16).to(tl.float32), li_new, mi_new", "as if oi_new were rounded to float16"),
    # --- hints from evidence: the diagnosis tests what it names
    ("evidence", "matmul", "k_tail_dropped", "for start_k in range(0, K, BLOCK_K):",
     "for start_k in range(0, K - BLOCK_K, BLOCK_K):", "the K loop stops before its last block"),
    ("evidence", "v1_update", "alpha_beta_swapped_in_l", "li_new = alpha * li + beta * tl.sum(pij, 1)",
     "li_new = beta * li + alpha * tl.sum(pij, 1)", "alpha and beta are swapped in the update of li"),
    ("evidence", "v1_update", "alpha_beta_swapped_in_o", "alpha[:, None] * li[:, None] * oi + beta[:, None] * pv",
     "beta[:, None] * li[:, None] * oi + alpha[:, None] * pv", "alpha and beta are swapped in the update of O"),
    ("evidence", "v2_kernel", "k_mask_from_query_index",
     "mask=offs_n[:, None] < N, other=0.0)\n        vj", "mask=offs_m[:, None] < N, other=0.0)\n        vj",
     r"(?s)In line \d+ of my_attention_kernel_solution: kj = tl.load\(.*Hint: the mask's shape does not fit"),
    ("evidence", "matmul", "k_loop_drops_ragged_end", "for start_k in range(0, K, BLOCK_K):",
     "for start_k in range(0, K // BLOCK_K * BLOCK_K, BLOCK_K):", r"only the first 32 of the K = 40 products"),
    # --- masked loads without other=: on a GPU their masked-off lanes hold anything
    ("lanes", "v2_kernel", "v_without_other", "stride_vd,\n                     mask=offs_n[:, None] < N, other=0.0)",
     "stride_vd,\n                     mask=offs_n[:, None] < N)",
     r"masked-off lanes of these loads read 0 instead of NaN: line \d+ of the function: tl.load\(v_base"),
    ("lanes", "matmul", "a_without_other", "mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)",
     "mask=(rows[:, None] < M) & (ks[None, :] < K))", "masked-off lanes of these loads read 0 instead of NaN"),
    ("lanes", "row_softmax", "without_other", ', mask=cols < n_cols, other=float("-inf"))', ", mask=cols < n_cols)",
     "masked-off lanes of these loads read 0 instead of NaN"),
]


def _run(exercise, name, old, new, tmp_path):
    notebook, solution, _, check = EXERCISES[exercise]
    module = load(mutate(definitions(notebook, solution), old, new), tmp_path, f"class_{exercise}_{name}")
    return check(*[getattr(module, n) for n in solution])


def test_every_class_has_mutants():
    assert {c[0] for c in CLASSES} == {"layout", "init", "compile", "rounding", "evidence", "lanes"}
    assert len({(c[1], c[2]) for c in CLASSES}) == len(CLASSES)


@pytest.mark.parametrize("kind, exercise, name, old, new, message", CLASSES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CLASSES])
def test_mistake_is_named(kind, exercise, name, old, new, message, tmp_path, monkeypatch):
    if kind not in ("compile", "evidence"):  # the compile for a GPU only where it matters (see test_exercise_mutants)
        monkeypatch.setenv("FLASHATTN_COMPILE_AHEAD", "0")
    with pytest.raises(ExerciseFailed) as err:
        _run(exercise, name, old, new, tmp_path)
    if message is not None:
        assert re.search(message, str(err.value)), str(err.value)


def test_a_sum_started_at_one_is_no_mistake_with_the_max_at_minus_inf(tmp_path, capsys):
    """alpha = exp(-inf - mi_new) = 0 wipes whatever li starts with at the first block: the kernel is right, and
    the check says so (it fails a wrong start of li only together with a finite start of mi, above)."""
    assert _run("v2_kernel", "sum_from_one", "li = tl.zeros([BLOCK_M], tl.float32)",
                "li = tl.full([BLOCK_M], 1.0, tl.float32)", tmp_path) is True


def test_a_finished_kernel_with_its_launcher_still_the_stub(tmp_path, capsys):
    notebook, solution, stub, _ = EXERCISES["scaled_add"]
    kernel = load(definitions(notebook, solution[:1]), tmp_path, "scaled_add_kernel_only").my_scaled_add_kernel_solution
    launcher = load(definitions(notebook, stub[1:]), tmp_path, "scaled_add_launcher_stub").my_scaled_add
    assert primer.check_scaled_add(kernel, launcher) is False
    out = capsys.readouterr().out
    assert "your kernel passed its part" in out and "the launcher my_scaled_add is not attempted yet" in out, out
