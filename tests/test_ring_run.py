"""tools/gpu/ring/run.py (issue 33's multi-GPU run) on two gloo processes at tiny sizes (--cpu --quick), its guard
on NVLink multicast, and --merge into a data folder. The run on several H200s is the lead's."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "tools" / "gpu" / "ring" / "run.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                             "NVSHMEM_DISABLE_NVLS")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.parametrize("key, value", [("NCCL_NVLS_ENABLE", "1"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0"),
                                        ("NVSHMEM_DISABLE_NVLS", "0")])
def test_refuses_to_start_with_multicast_on(key, value):
    proc = subprocess.run([sys.executable, str(RUN), "--cpu"], env=_env(**{key: value}), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert f"refuses to start: {key}={value!r}" in proc.stderr


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    if not TORCHRUN.exists() or shutil.which(str(TORCHRUN)) is None:
        pytest.skip("torchrun is not installed next to this Python")
    out = tmp_path_factory.mktemp("ring_run")
    proc = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(RUN), "--cpu", "--quick"],
                          env=_env(OUT=str(out), NCCL_NVLS_ENABLE="0"), capture_output=True, text=True, timeout=240,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "ring_multi_gpu.json").read_text())


def test_cpu_run_checks_every_case_and_records_its_provenance(cpu_run):
    out, result = cpu_run
    run = result["run_provenance"]
    assert run["world_size"] == 2 and run["backend"] == "gloo"
    assert run["env"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    cases = {(r["layout"], r["causal"], r["N"]) for r in result["correctness"]}
    assert {(layout, causal) for layout, causal, _ in cases} == {(la, c) for la in ("contiguous", "zigzag")
                                                                for c in (False, True)}
    assert all(r["ok"] and max(r["ring_vs_single"].values()) < 1e-5 for r in result["correctness"])
    assert result["beyond"] and all(r["ok"] for r in result["beyond"])
    assert {(r["layout"], r["causal"]) for r in result["scaling"]} == {("zigzag", True), ("contiguous", False)}
    for row in result["scaling"]:
        assert row["efficiency_forward"] == pytest.approx(row["one_gpu_forward_ms"] / (2 * row["ring_forward_ms"]))
        assert row["target_forward_backward"] in (0.85, 0.9)
    assert {r["rotate"] for r in result["context_parallel"]} == {"allgather", "alltoall"}
    assert all("error" in r for r in result["context_parallel"])  # torch's context_parallel needs CUDA
    assert result["overlap"]["trace"] == "ring_trace_rank0.json" and (out / "ring_trace_rank0.json").exists()
    assert result["skipped"] == []


def test_merge_into_a_data_folder(cpu_run, tmp_path):
    out, result = cpu_run
    (tmp_path / "none-cpu-gloo.json").write_text(json.dumps({"measurements": {}, "provenance": {"gpu": "none"}}))
    proc = subprocess.run([sys.executable, str(RUN), "--merge", str(out / "ring_multi_gpu.json")],
                          env=_env(FLASHATTN_DATA_DIR=str(tmp_path)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "none-cpu-gloo.json").read_text())
    assert doc["measurements"]["ring_multi_gpu"]["recorded_at"] == result["run_provenance"]["date"]
