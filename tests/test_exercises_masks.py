"""flashattn.exercises.masks (notebook 14): the rule that classifies a window's tile. The notebook's worked
solution passes and is the package's, the stub is 'not attempted', and each classic mistake, written into a copy
of the solution, fails with a message that names it."""

import pytest
from exercise_sources import definitions, mutate

from flashattn.exercises import ExerciseFailed
from flashattn.exercises.masks import CASES, block_kind_solution, check_block_kind

NOTEBOOK = "14_masks"
SOLUTION = definitions(NOTEBOOK, ("my_block_kind_solution",))


def compile_function(source: str, name: str):
    namespace = {}
    exec(compile(source, f"<{NOTEBOOK}>", "exec"), namespace)  # plain Python: no Triton to read the file
    return namespace[name]


def test_the_notebooks_solution_passes_and_is_the_packages(capsys):
    solution = compile_function(SOLUTION, "my_block_kind_solution")
    assert check_block_kind(solution) is True
    assert "passed" in capsys.readouterr().out
    for L, S, bm, bn, left, right in CASES:
        for m0 in range(0, L, bm):
            for n0 in range(0, S, bn):
                args = (m0, bm, n0, bn, L, S, left, right)
                assert solution(*args) == block_kind_solution(*args)


def test_the_stub_is_not_attempted(capsys):
    stub = compile_function(definitions(NOTEBOOK, ("my_block_kind",)), "my_block_kind")
    assert check_block_kind(stub) is False
    assert "not attempted" in capsys.readouterr().out


# (mutant, text in the solution, its replacement, what the check must say)
MUTANTS = [
    ("unbounded_ignored", ("left = L + S if left == -1 else left", "right = L + S if right == -1 else right"),
     ("left = left", "right = right"), "-1 means unbounded"),
    ("hangs_over_the_end", "inside = m0 + block_m <= L and n0 + block_n <= S", "inside = True",
     "hangs over the end of the problem"),
    ("full_from_the_first_row", "n0 - (m0 + block_m - 1) >= -left", "n0 - m0 >= -left",
     r"past the window's left edge\): for a full tile the last row"),
    ("full_from_the_last_row", "n0 + block_n - 1 - m0 <= right", "n0 + block_n - 1 - (m0 + block_m - 1) <= right",
     r"past the window's right edge\): for a full tile the first row"),
    ("skip_right_off_by_one", "n0 - m_last > right", "n0 - m_last >= right",
     r"sees key \d+ \(the window includes its ends\)"),
    ("skip_left_off_by_one", "n_last - m0 < -left", "n_last - m0 <= -left",
     r"sees key \d+ \(the window includes its ends\)"),
    ("skip_from_the_first_row", "n0 - m_last > right", "n0 - m0 > right", "that pair would be lost"),
    ("never_skips", '        return "skipped"\n', '        return "partial"\n', "work for nothing"),
    ("computes_past_the_end", "min(m0 + block_m, L) - 1, min(n0 + block_n, S) - 1",
     "m0 + block_m - 1, n0 + block_n - 1", r"work for nothing.*rows past L=\d+ and keys past S=\d+ do not count"),
    ("never_full", '        return "full"\n', '        return "partial"\n', "every query of the tile sees every one"),
    ("wrong_words", '        return "skipped"\n', '        return "skip"\n',
     "return one of 'skipped', 'partial', 'full'"),
]


@pytest.mark.parametrize("name, old, new, says", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_each_mistake_is_named(name, old, new, says):
    mutant = compile_function(mutate(SOLUTION, old, new), "my_block_kind_solution")
    with pytest.raises(ExerciseFailed, match=says):
        check_block_kind(mutant)
