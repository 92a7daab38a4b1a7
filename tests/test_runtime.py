"""Mode detection, sizes and the describe line (each in a fresh interpreter where it matters)."""

import os
import subprocess
import sys

import pytest
import torch

import flashattn
from flashattn import runtime


def run_python(code: str, **env) -> str:
    full_env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FLASHATTN_SIZE")}
    full_env.update(env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_mode_matches_hardware():
    if runtime.HAS_GPU and os.environ.get("TRITON_INTERPRET") != "1":
        assert runtime.MODE == "gpu" and runtime.DEVICE.type == "cuda"
    else:
        assert runtime.MODE == "interpreter" and runtime.DEVICE.type == "cpu"
        assert os.environ["TRITON_INTERPRET"] == "1"


def test_describe_names_mode_and_versions():
    import triton

    line = flashattn.describe()
    assert ("GPU mode on" in line) == (runtime.MODE == "gpu")
    assert f"torch {torch.__version__}" in line and f"triton {triton.__version__}" in line
    assert f"sizes '{runtime.SIZES.name}'" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU default")
def test_no_gpu_sets_interpreter_before_triton_is_used():
    out = run_python("import flashattn, os; print(flashattn.runtime.MODE, os.environ['TRITON_INTERPRET'])")
    assert out == "interpreter 1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU default")
def test_importing_triton_first_is_warned_about_and_the_other_order_is_not():
    """Triton makes its own jit functions when it is imported: flashattn sets TRITON_INTERPRET too late for those."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    late, early = (subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, env=env,
                                  timeout=300) for code in ("import triton, flashattn", "import flashattn, triton"))
    assert late.returncode == 0 and "triton was imported before flashattn" in late.stderr
    assert "Import flashattn first, or set TRITON_INTERPRET=1" in late.stderr
    assert early.returncode == 0 and "triton was imported before flashattn" not in early.stderr


def test_fp_fusion_is_kept_on_unless_the_user_says_otherwise():
    """Triton 3.9 warns at the first compile unless TRITON_DEFAULT_FP_FUSION is set; flashattn keeps its default."""
    code = "import os, flashattn; print(os.environ['TRITON_DEFAULT_FP_FUSION'])"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_DEFAULT_FP_FUSION"}
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300).stdout.strip() == "1"
    assert run_python(code, TRITON_DEFAULT_FP_FUSION="0") == "0"


def test_size_override():
    assert run_python("import flashattn; print(flashattn.runtime.SIZES.name)", FLASHATTN_SIZE="full") == "full"
    assert run_python("import flashattn; print(flashattn.runtime.SIZES.N)", FLASHATTN_SIZE="small") == str(
        runtime.SIZES_BY_NAME["small"].N
    )


def test_bad_size_override():
    code = "import flashattn"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["FLASHATTN_SIZE"] = "huge"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0 and "FLASHATTN_SIZE='huge': accepted values are 'small' and 'full'" in out.stderr


def test_seed_and_random_qkv_are_reproducible():
    runtime.seed(3)
    a = torch.rand(4)
    runtime.seed(3)
    assert torch.equal(a, torch.rand(4))
    q1, _, _ = runtime.random_qkv(1, 2, 5, 16, seed_value=9)
    q2, k2, _ = runtime.random_qkv(1, 2, 5, 16, seed_value=9)
    assert torch.equal(q1, q2) and not torch.equal(q2, k2)
    assert q1.shape == (1, 2, 5, 16) and q1.device.type == runtime.DEVICE.type
