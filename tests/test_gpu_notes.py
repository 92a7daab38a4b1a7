"""What a notebook says about the live GPU's missing features, from the device itself."""

import pytest

from flashattn import runtime
from flashattn.kernels import device
from flashattn.teaching import gpu_notes


@pytest.mark.parametrize(("capability", "missing"), [((7, 5), 3), ((8, 6), 1), ((8, 0), 1), ((9, 0), 0)])
def test_each_target_lacks_what_it_lacks(capability, missing, monkeypatch, capsys):
    monkeypatch.setattr(runtime, "gpu_name", lambda: "a GPU")
    with device.pretend(device.TARGETS[capability]):
        assert len(gpu_notes.lacking("tensor cores", "bfloat16", "hopper")) == missing
        gpu_notes.say("tensor cores", "bfloat16", "hopper")
    out = capsys.readouterr().out
    assert (f"On this a GPU (sm_{capability[0]}{capability[1]})" in out) == (missing > 0)
    if capability == (7, 5):
        assert "CUDA cores" in out and "bfloat16 needs sm_80" in out and "need sm_90" in out


def test_unknown_features_are_refused():
    with pytest.raises(ValueError, match="unknown feature"):
        gpu_notes.lacking("tensorcores")


@pytest.mark.skipif(runtime.MODE != "interpreter", reason="interpreter-mode behaviour")
def test_the_interpreter_says_nothing(capsys):
    gpu_notes.say("tensor cores", "hopper")
    assert capsys.readouterr().out == ""
