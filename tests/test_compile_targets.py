"""Every kernel the course launches, with the configurations the code picks on each GPU target, compiles for
sm_75, sm_80, sm_86, sm_89 and sm_90 and would launch there (shared memory and registers within the target's
limits), and the shared memory the tiles were chosen by is close to what the compiler really gave (issue 27).

Runs without a GPU (``flashattn.measure.compile_targets``: Triton compiles for any target). The table of every
compile is written to build/compile_targets.md and printed at the end of the run.
"""

import os

import pytest

from flashattn import runtime
from flashattn.kernels import device
from flashattn.measure import compile_targets

TABLE = runtime.REPO_ROOT / "build" / "compile_targets.md"


@pytest.fixture(scope="module")
def results():
    jobs = int(os.environ.get("FLASHATTN_COMPILE_JOBS", os.cpu_count() or 1))
    found = compile_targets.run(jobs=min(jobs, 4))
    TABLE.parent.mkdir(exist_ok=True)
    TABLE.write_text(compile_targets.table(found) + "\n")
    return found


def test_every_target_and_kernel_is_compiled(results):
    kernels = {r.kernel for r in results}
    assert {r.target for r in results} == set(device.TARGETS)
    for name in ("fast forward (Triton)", "fast backward dkdv", "fast backward dq", "fast backward dkdv (atomic dQ)",
                 "fast forward (Gluon)", "fast backward (Gluon)", "masked window forward (Gluon)",
                 "masked key-padding forward (Gluon, KEY_MASK 1)", "masked key-padding forward (Gluon, KEY_MASK 2)",
                 "masked documents forward (Gluon)", "masked documents backward (Gluon)",
                 "v2 (defaults)", "v1 (defaults)",
                 "teaching backward dkdv (defaults)", "naive scores (defaults)"):
        assert name in kernels, name
    assert not any("Gluon" in r.kernel for r in results if r.target != (9, 0))


def test_nothing_the_code_picks_runs_out_of_resources(results):
    bad = [f"{r.kernel} {r.detail} on {r.compiled.target}: {r.compiled.verdict()}" + (
        f"\n    {r.compiled.error}" if r.compiled.error else "") for r in results if not r.compiled.fits]
    assert not bad, "\n".join(bad)


def test_the_shared_memory_model_is_close_to_what_triton_gives(results):
    """Tiles are chosen by an estimate before anything is compiled (kernels.device.tile_shared_bytes); the test above
    checks that every configuration it keeps fits. This one keeps the estimate honest: never more than 10 % below
    what the compiler asked for (it may be well above: it is conservative where Triton's layout is hard to predict,
    on the CUDA cores of sm_75)."""
    under = [f"{r.kernel} {r.detail} on {r.compiled.target}: estimated {r.estimate}, compiled {r.compiled.shared_bytes}"
             for r in results if r.estimate is not None and r.compiled.shared_bytes is not None
             and r.compiled.shared_bytes > 1.10 * r.estimate]
    assert not under, "\n".join(under)


def test_bfloat16_is_refused_by_name_below_sm_80(monkeypatch):
    import torch

    from flashattn import validate

    monkeypatch.setattr(runtime, "MODE", "gpu")
    monkeypatch.setattr(runtime, "HAS_GPU", True)
    monkeypatch.setattr(runtime, "CAPABILITY", (7, 5))
    monkeypatch.setattr(runtime, "gpu_name", lambda: "Tesla T4")
    x = torch.empty(1, 1, 4, 16, dtype=torch.bfloat16, device="meta")
    with pytest.raises(TypeError, match=r"bfloat16 needs a GPU of sm_80 or newer; this one is sm_75 \(Tesla T4\)"):
        validate._check_kernel_dtype_device_and_d(x.to("meta"), "fast", 16, range(1, 257))
    monkeypatch.setattr(runtime, "CAPABILITY", (7, 0))
    with pytest.raises(ValueError, match="sm_70; Triton compiles for sm_75"):
        validate._check_kernel_dtype_device_and_d(x.half(), "fast", 16, range(1, 257))
