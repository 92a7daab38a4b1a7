"""flashattn.exercises.hopper (notebook 11): the producer written as operations. The notebook's worked solution
passes, the stub is 'not attempted', and each classic mistake, written into a copy of the solution, fails with
a message that names it."""

import pytest
from exercise_sources import definitions, mutate

from flashattn.exercises import ExerciseFailed
from flashattn.exercises.hopper import CASES, Load, Wait, check_producer, producer_solution
from flashattn.models import schedule

NOTEBOOK = "11_hopper_asynchrony"


def compile_function(source: str, name: str):
    namespace = {"Wait": Wait, "Load": Load}
    exec(compile(source, f"<{NOTEBOOK}>", "exec"), namespace)  # plain Python: no Triton to read the file
    return namespace[name]


SOLUTION = definitions(NOTEBOOK, ("my_producer_solution",))


def test_the_notebooks_solution_passes_and_matches_the_kernels_producer(capsys):
    solution = compile_function(SOLUTION, "my_producer_solution")
    assert check_producer(solution) is True
    assert "passed" in capsys.readouterr().out
    for consumers, stages, tiles in CASES:
        assert solution(list(tiles), stages, consumers) == producer_solution(list(tiles), stages, consumers)


def test_the_stub_is_not_attempted(capsys):
    stub = compile_function(definitions(NOTEBOOK, ("my_producer",)), "my_producer")
    assert check_producer(stub) is False
    assert "not attempted" in capsys.readouterr().out


# (mutant, text in the solution, its replacement, what the check must say)
MUTANTS = [
    ("waits_on_the_lap", ('Wait("k_empty", slot, lap ^ 1)', 'Wait("v_empty", slot, lap ^ 1)'),
     ('Wait("k_empty", slot, lap)', 'Wait("v_empty", slot, lap)'), r"deadlock(.|\n)*the phase"),
    ("phase_flips_every_block", "lap = (cnt // STAGES) & 1", "lap = cnt & 1", "the phase"),
    ("slot_from_j", "slot = cnt % STAGES", "slot = j % STAGES", "the slot"),
    ("no_empty_waits", ('Wait("k_empty", slot, lap ^ 1), ', 'Wait("v_empty", slot, lap ^ 1), '), ("", ""),
     r"refilling a slot still in use(.|\n)*a copy without waiting first"),
    ("no_v_wait", 'Wait("v_empty", slot, lap ^ 1), ', "", "refilling a slot still in use"),
    ("load_before_wait", ('Wait("k_empty", slot, lap ^ 1), Load("K", slot, it, j)'),
     ('Load("K", slot, it, j), Wait("k_empty", slot, lap ^ 1)'), "refilling a slot still in use"),
    ("never_counts", "cnt += 1", "pass", "refilling a slot still in use"),
    ("v_waits_on_k", 'Wait("v_empty"', 'Wait("k_empty"', "refilling a slot still in use"),
    ("block_from_count", ('Load("K", slot, it, j)', 'Load("V", slot, it, j)'),
     ('Load("K", slot, it, cnt)', 'Load("V", slot, it, cnt)'), "which holds tile"),
    ("one_block_too_many", "for j in range(n_blocks):", "for j in range(n_blocks + 1):", "a copy too many"),
]


@pytest.mark.parametrize("name, old, new, says", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_each_mistake_is_named(name, old, new, says):
    mutant = compile_function(mutate(SOLUTION, old, new), "my_producer_solution")
    with pytest.raises(ExerciseFailed, match=says):
        check_producer(mutant)


def test_what_is_not_a_program_is_refused():
    with pytest.raises(ExerciseFailed, match="return a list of operations"):
        check_producer(lambda *args: None)
    with pytest.raises(ExerciseFailed, match="must be a Wait or a Load"):
        check_producer(lambda *args: ["load K"])
    with pytest.raises(ExerciseFailed, match="stops after 0 operations"):
        check_producer(lambda *args: [])


def test_every_case_needs_the_whole_protocol():
    """Each case runs the kernel's consumers; the kernel's own producer passes them all, in the model."""
    for consumers, stages, tiles in CASES:
        assert schedule.simulate(schedule.specialized_program(tiles, stages, consumers), schedule.costs_for(64, 64, 128)
                                 ).error is None
