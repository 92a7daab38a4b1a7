"""flashattn.exercises.fast: the check passes the right answer, says 'not attempted' for a stub, and
names each mistake it is meant to catch."""

import pytest

from flashattn.exercises import ExerciseFailed
from flashattn.exercises.fast import MMA_FLOPS_PER_CLOCK, MUFU_PER_CLOCK, check_exp_share, exp_share_solution


def right(D, mufu, mma):
    return (1 / mufu) / (4 * D / mma)


def test_right_answer_passes_and_stub_is_not_attempted(capsys):
    assert check_exp_share(right) is True
    assert check_exp_share(lambda *a: (_ for _ in ()).throw(NotImplementedError)) is False
    assert "not attempted" in capsys.readouterr().out
    # at the peak rates the exponentials cost as much as the matrix work at D = 64, half at D = 128
    assert exp_share_solution(64) == pytest.approx(1.0) and exp_share_solution(128) == pytest.approx(0.5)
    assert (MUFU_PER_CLOCK, MMA_FLOPS_PER_CLOCK) == (16, 4096)


@pytest.mark.parametrize("wrong, says", [
    (lambda D, mufu, mma: 1 / right(D, mufu, mma), "inverse"),
    (lambda D, mufu, mma: 2 * right(D, mufu, mma), "two products"),
    (lambda D, mufu, mma: 4 * right(D, mufu, mma), "2 FLOP per multiply-add"),
    (lambda D, mufu, mma: right(D, mufu, mma) + 0.1, "expected"),
    (lambda D, mufu, mma: "half", "return a number"),
])
def test_each_mistake_is_named(wrong, says):
    with pytest.raises(ExerciseFailed, match=says):
        check_exp_share(wrong)
