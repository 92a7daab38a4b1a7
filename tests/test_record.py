"""The recording machinery and the recorded files the notebooks read."""

import json

import pytest

from flashattn import record, recorded, runtime


def test_registry_holds_the_course_measurements():
    registry = record.load_measurements()
    for name in ("device", "memory_vs_n", "variants_16bit", "variants_fp32"):
        assert name in registry and registry[name]["description"]


def test_run_writes_provenance_and_merges(tmp_path, monkeypatch):
    calls = []

    def fake():
        calls.append(1)
        return {"rows": [{"N": 1, "ms": len(calls)}], "dtype": "float16"}

    monkeypatch.setitem(record.REGISTRY, "fake_measurement", {"fn": fake, "description": "a test"})
    monkeypatch.setitem(record.REGISTRY, "other", {"fn": lambda: {"x": 1}, "description": "another"})
    path = record.run(["fake_measurement"], tmp_path, command="pytest")
    first_date = json.loads(path.read_text())["provenance"]["date"]
    path = record.run(["other"], tmp_path, command="pytest")
    doc = json.loads(path.read_text())
    assert set(doc["measurements"]) == {"fake_measurement", "other"}  # the second run kept the first
    prov = doc["provenance"]
    for key in ("gpu", "driver", "cuda", "torch", "triton", "date", "command"):
        assert key in prov
    assert prov["command"] == "pytest"
    # each measurement keeps the date of the run that made it; the provenance has the latest run's
    entry = recorded.get("fake_measurement", data_dir=tmp_path)
    assert entry["rows"][0]["ms"] == 1 and entry["recorded_at"] == first_date
    assert recorded.get("other", data_dir=tmp_path)["recorded_at"] == prov["date"]
    assert "recorded on" in recorded.label(entry)


def test_unknown_measurement(tmp_path):
    with pytest.raises(ValueError, match="unknown measurement\\(s\\) nope; registered:"):
        record.run(["nope"], tmp_path)


def test_record_refuses_without_gpu(capsys):
    if runtime.MODE == "gpu":
        pytest.skip("a GPU is present")
    assert record.main([]) == 2
    assert "measures a GPU" in capsys.readouterr().err


def test_list(capsys):
    assert record.main(["--list"]) == 0
    assert "variants_16bit" in capsys.readouterr().out


def test_committed_files_cover_every_measurement():
    paths = recorded.files()
    assert paths, "figures/data/ has no recorded GPU file"
    registered = set(record.load_measurements())
    unknown = set(record.PENDING) - registered
    assert not unknown, f"PENDING names unregistered measurements: {unknown}"
    for path in paths:
        doc = json.loads(path.read_text())
        missing = registered - set(doc["measurements"]) - set(record.PENDING)
        assert not missing, f"{path.name} lacks {sorted(missing)}: run `python -m flashattn.record` on the GPU"
        done = set(record.PENDING) & set(doc["measurements"])
        assert not done, f"{sorted(done)} are recorded now: take them out of flashattn.record.PENDING"
        assert doc["provenance"]["gpu"] and doc["provenance"]["torch"] and doc["provenance"]["triton"]
        for name, entry in doc["measurements"].items():
            assert entry.get("recorded_at"), f"{path.name}: {name} has no recorded_at"


def test_missing_data_dir_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="run `python -m flashattn.record` on a GPU"):
        recorded.load(data_dir=tmp_path)


def test_get_unknown_names():
    with pytest.raises(KeyError, match="not recorded"):
        recorded.get("no_such_measurement")
    with pytest.raises(KeyError, match="no recorded results for GPU 'TPU'"):
        recorded.load("TPU")
