"""flashattn.exercises.fast (notebook 10): the stages of fast's key loop. The notebook's worked solution
passes and agrees with the kernel's bounds, the stub is 'not attempted', and each classic mistake, written
into a copy of the solution, fails with a message that names it."""

import pytest
from exercise_sources import definitions, mutate

from flashattn.exercises import ExerciseFailed
from flashattn.exercises.fast import CASES, check_key_stages, key_stages_solution

NOTEBOOK = "10_fast_kernel"
SOLUTION = definitions(NOTEBOOK, ("my_key_stages_solution",))


def compile_function(source: str, name: str):
    namespace = {}
    exec(compile(source, f"<{NOTEBOOK}>", "exec"), namespace)  # plain Python: no Triton to read the file
    return namespace[name]


def test_the_notebooks_solution_passes_and_is_the_kernels(capsys):
    solution = compile_function(SOLUTION, "my_key_stages_solution")
    assert check_key_stages(solution) is True
    assert "passed" in capsys.readouterr().out
    for block_m, block_n, n, causal in CASES:
        for m0 in range(0, n, block_m):
            assert solution(m0, block_m, block_n, n, causal) == key_stages_solution(m0, block_m, block_n, n, causal)


def test_the_stub_is_not_attempted(capsys):
    stub = compile_function(definitions(NOTEBOOK, ("my_key_stages",)), "my_key_stages")
    assert check_key_stages(stub) is False
    assert "not attempted" in capsys.readouterr().out


# (mutant, text in the solution, its replacement, what the check must say)
MUTANTS = [
    ("diagonal_unmasked", "[(0, m0, False), (m0,", "[(0, m0 + block_m, False), (m0 + block_m,",
     "right of row .* diagonal"),
    ("tail_unmasked", "s_full = (n_keys // block_n) * block_n", "s_full = -(-n_keys // block_n) * block_n",
     "past the last key"),
    ("everything_masked", "return [(0, s_full, False), (s_full, n_keys, True)]", "return [(0, n_keys, True)]",
     "masked but every row sees every key"),
    ("causal_to_the_end", "min(m0 + block_m, n_keys)", "n_keys", "work for nothing"),
    ("causal_unclamped", "min(m0 + block_m, n_keys)", "m0 + block_m", "work for nothing"),
    ("diagonal_stops_early", "min(m0 + block_m, n_keys)", "min(m0 + block_m - block_n, n_keys)", "never sees key"),
    ("diagonal_starts_late", "(0, m0, False), (m0,", "(0, m0 - block_n, False), (m0,", "never sees key"),
    ("stages_overlap", "(m0, min(m0 + block_m, n_keys), True)",
     "(max(m0 - block_n, 0), min(m0 + block_m, n_keys), True)", "visited 2 times"),
    ("before_key_0", "(m0, min(m0 + block_m, n_keys), True)", "(m0 - block_n, min(m0 + block_m, n_keys), True)",
     "before the first key"),
    ("off_the_block_grid", "(m0, min(m0 + block_m, n_keys), True)", "(m0 + 1, min(m0 + block_m, n_keys), True)",
     "not at a block boundary"),
]


@pytest.mark.parametrize("name, old, new, says", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_each_mistake_is_named(name, old, new, says):
    mutant = compile_function(mutate(SOLUTION, old, new), "my_key_stages_solution")
    with pytest.raises(ExerciseFailed, match=says):
        check_key_stages(mutant)


def test_what_is_not_a_list_of_stages_is_refused():
    with pytest.raises(ExerciseFailed, match="return a list of"):
        check_key_stages(lambda *args: None)
    with pytest.raises(ExerciseFailed, match="a triple"):
        check_key_stages(lambda *args: [(0, 64)])
    with pytest.raises(ExerciseFailed, match="masked a bool"):
        check_key_stages(lambda *args: [(0, 64, 1)])
