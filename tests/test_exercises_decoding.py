"""The decoding-mask exercise of notebook 13: the solution passes, the stub is 'not attempted', each mutant is named."""

import re

import pytest
from exercise_sources import definitions, load, mutate

from flashattn.exercises import ExerciseFailed
from flashattn.exercises.decoding import check_decode_mask

SOLUTION = definitions("13_attention_in_a_model", ("my_decode_mask_solution",))
STUB = definitions("13_attention_in_a_model", ("my_decode_mask",))
RIGHT = "torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)"

MUTANTS = [  # (mutant, replacement of RIGHT, what the check must say)
    ("top_left", "torch.ones(L, S, dtype=torch.bool).tril()", "torch's is_causal=True"),
    ("inverted", "~torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)", "opposite"),
    ("strict", "torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L - 1)", "sees its own key"),
    ("one_ahead", "torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L + 1)", "the key right after"),
    ("float_mask", "torch.ones(L, S).tril(diagonal=S - L)", "boolean mask"),
    ("transposed", "torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L).T", "did you transpose it"),
    ("no_mask", "torch.ones(L, S, dtype=torch.bool)", "nothing is masked"),
    ("list", "torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L).tolist()", "return a torch.Tensor"),
]


def test_solution_passes(tmp_path):
    assert check_decode_mask(load(SOLUTION, tmp_path, "decode_solution").my_decode_mask_solution) is True


def test_stub_is_not_attempted(tmp_path, capsys):
    assert check_decode_mask(load(STUB, tmp_path, "decode_stub").my_decode_mask) is False
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize("name, new, message", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutant_is_named(tmp_path, name, new, message):
    fn = load(mutate(SOLUTION, RIGHT, new), tmp_path, f"decode_{name}").my_decode_mask_solution
    with pytest.raises(ExerciseFailed) as err:
        check_decode_mask(fn)
    assert re.search(message, str(err.value)), str(err.value)
