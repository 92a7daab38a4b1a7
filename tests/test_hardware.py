"""flashattn.hardware: the GPU's numbers, live on a GPU or as recorded."""

import pytest

from flashattn import hardware, recorded, runtime


def test_hardware_numbers_recorded_reads_the_recorded_file():
    entry = recorded.get("device")
    hw = hardware.hardware_numbers("recorded")
    props = entry["properties"]
    assert hw["source"] == "recorded"
    assert hw["label"] == recorded.label(entry)
    assert hw["name"] == props["name"]
    for key in ("multiprocessors", "l2_cache_bytes", "shared_memory_per_sm_bytes",
                "shared_memory_per_block_optin_bytes", "registers_per_sm", "total_memory_bytes"):
        assert hw[key] == props[key]
    assert hw["register_bytes_per_sm"] == 4 * props["registers_per_sm"]
    assert hw["max_sm_clock_mhz"] == float(props["max_sm_clock_mhz"])
    assert hw["copy_bandwidth_gbps"] == entry["copy_bandwidth_gbps"]
    assert hw["matmul_tflops"] == {k: v["tflops"] for k, v in entry["matmul"].items()}
    assert hw["matmul_shape"] == next(iter(entry["matmul"].values()))["shape"]


@pytest.mark.skipif(runtime.MODE == "gpu", reason="the interpreter-mode default")
def test_hardware_numbers_default_and_live_in_interpreter_mode():
    assert hardware.hardware_numbers()["source"] == "recorded"
    with pytest.raises(RuntimeError, match="GPU mode"):
        hardware.hardware_numbers("live")


def test_hardware_numbers_rejects_an_unknown_source():
    with pytest.raises(ValueError, match="source"):
        hardware.hardware_numbers("guess")
