"""flashattn.exercises.banks: each check passes right answers, says 'not attempted' for a stub, and names
the mistake for each wrong answer it is meant to catch."""

import pytest

from flashattn import banks
from flashattn.exercises import ExerciseFailed
from flashattn.exercises.banks import (
    PADDING_CASES,
    PREDICTION_CASES,
    check_padding,
    check_wavefront_predictions,
    prediction_answers,
)

# --- predictions -----------------------------------------------------------------------------------

# worked by hand (see the notebook's solution): the check must agree with these, not only with itself
HAND_ANSWERS = {"a": 1, "b": 1, "c": 2, "d": 32, "e": 16, "f": 1, "g": 2, "h": 2, "i": 4, "j": 32}


def test_prediction_answers_are_the_hand_worked_ones():
    assert prediction_answers() == HAND_ANSWERS
    assert [c.name for c in PREDICTION_CASES] == sorted(HAND_ANSWERS)


def test_predictions_pass(capsys):
    assert check_wavefront_predictions(dict(HAND_ANSWERS)) is True
    assert "passed: all 10 right" in capsys.readouterr().out
    assert check_wavefront_predictions(lambda: dict(HAND_ANSWERS)) is True
    assert check_wavefront_predictions({k: float(v) for k, v in HAND_ANSWERS.items()}) is True


def stub():
    raise NotImplementedError


@pytest.mark.parametrize("answers", [stub, {k: ... for k in HAND_ANSWERS}, {k: None for k in HAND_ANSWERS}, {}])
def test_predictions_not_attempted(answers, capsys):
    assert check_wavefront_predictions(answers) is False
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("case, wrong, diagnosis", [
    ("b", 32, "forgot the broadcast"),
    ("i", 32, "forgot the broadcast"),
    ("e", 32, "counted lanes instead of distinct words: lanes 0 and 16"),
    ("i", 1, "forgot the phases: a warp's 16-byte request is served in 4 phases of 8 lanes"),
    ("h", 1, "forgot the phases: a warp's 8-byte request is served in 2 phases of 16 lanes"),
    ("j", 8, "gave the conflict degree"),
    ("g", 1, "an 8-byte request takes at least 2"),
    ("d", 4, "Work phase by phase"),
    ("c", 3, "not 3"),
])
def test_predictions_diagnose(case, wrong, diagnosis):
    answers = {**HAND_ANSWERS, case: wrong}
    with pytest.raises(ExerciseFailed, match=diagnosis) as info:
        check_wavefront_predictions(answers)
    assert f"case {case} (" in str(info.value)


def test_predictions_several_wrong_and_missing():
    answers = {**HAND_ANSWERS, "b": 32, "i": 1}
    del answers["a"]
    with pytest.raises(ExerciseFailed) as info:
        check_wavefront_predictions(answers)
    text = str(info.value)
    assert "case b" in text and "case i" in text and "not answered yet: a" in text
    partial = {k: v for k, v in HAND_ANSWERS.items() if k in "abc"}
    with pytest.raises(ExerciseFailed, match="still to answer: d, e, f, g, h, i, j"):
        check_wavefront_predictions(partial)


@pytest.mark.parametrize("answers, diagnosis", [
    ({**HAND_ANSWERS, "z": 1}, "unknown case name"),
    ({**HAND_ANSWERS, "a": "one"}, "case a: answer with a number"),
    ({**HAND_ANSWERS, "a": True}, "case a: answer with a number"),
    ([1] * 10, "give a dict"),
    (lambda: 5, "give a dict"),
])
def test_predictions_reject_bad_input(answers, diagnosis):
    with pytest.raises(ExerciseFailed, match=diagnosis):
        check_wavefront_predictions(answers)


# --- padding ---------------------------------------------------------------------------------------


def smallest_padding(D, access_bytes):
    """Make the row stride an odd number of accesses (the worked solution)."""
    w = access_bytes // 4
    pad = -D % w
    if ((D + pad) // w) % 2 == 0:
        pad += w
    return pad


def searched_padding(D, access_bytes):
    """A different right answer: the smallest padding found by trying, with the simulator."""
    w = access_bytes // 4
    return next(p for p in range(w * 64) if (D + p) % w == 0 and banks.column_read_ways(D, p, access_bytes) == 1)


def test_padding_passes(capsys):
    assert check_padding(smallest_padding) is True
    assert "passed" in capsys.readouterr().out
    assert check_padding(searched_padding) is True
    assert check_padding(lambda D, a: smallest_padding(D, a) + 32 * a // 4 * 2) is True  # wasteful but right
    assert all(smallest_padding(D, a) == searched_padding(D, a) for D, a in PADDING_CASES)


def test_padding_not_attempted(capsys):
    assert check_padding(lambda D, a: stub()) is False
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, diagnosis", [
    (lambda D, a: 0, "D=32, 4-byte accesses, \\+0 words.*32-way conflict; without padding.*every row starts in "
                     "the same bank"),
    (lambda D, a: 32, "a whole turn of the 32 banks"),
    (lambda D, a: 64, "2 whole turns"),
    (lambda D, a: D, "source's doubling"),
    (lambda D, a: 8, "still an 8-way conflict; the stride is 40 4-byte accesses, an even number"),
    (lambda D, a: 1, "D=32, 8-byte accesses, \\+1 word .*misaligned: pad by a multiple of 2 words"),
    (lambda D, a: a // 4 if D != 33 else 0, "D=36, 16-byte accesses, \\+4 words.*2-way"),
    (lambda D, a: smallest_padding(D, a) if D != 33 else 1, "D=33.*\\+1 word .*2-way"),
    (lambda D, a: -1, "cannot be negative"),
    (lambda D, a: 1.0, "whole number of 4-byte words"),
    (lambda D, a: None, "whole number of 4-byte words"),
])
def test_padding_diagnoses(wrong, diagnosis):
    with pytest.raises(ExerciseFailed, match=diagnosis):
        check_padding(wrong)


def test_padding_cases_cover_each_lesson():
    widths = {a for _, a in PADDING_CASES}
    assert widths == {4, 8, 16}
    assert any(D % 32 == 0 for D, _ in PADDING_CASES) and any(D % 32 for D, _ in PADDING_CASES)
    assert any(smallest_padding(D, a) == 0 for D, a in PADDING_CASES)  # already conflict-free: do nothing
