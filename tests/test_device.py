"""The GPUs the course runs on: their limits, the one Hopper check, and tiles pruned to fit before compiling."""

import pytest
import torch

from flashattn import runtime
from flashattn.kernels import device


def test_the_targets_of_the_course():
    assert [t.name for t in device.TARGETS.values()] == ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90"]
    t4, a100, rtx4090, h200 = (device.TARGETS[c] for c in ((7, 5), (8, 0), (8, 9), (9, 0)))
    assert not t4.tensor_cores and not t4.bf16 and a100.tensor_cores and a100.bf16
    assert h200.hopper and not a100.hopper and not rtx4090.hopper
    assert t4.shared_bytes < rtx4090.shared_bytes < a100.shared_bytes < h200.shared_bytes


def test_other_capabilities_take_the_nearest_older_limits():
    assert device.for_capability((8, 7)).shared_bytes == device.TARGETS[(8, 6)].shared_bytes
    assert device.for_capability((12, 0)).shared_bytes == device.TARGETS[(9, 0)].shared_bytes
    assert not device.for_capability((12, 0)).hopper  # sm_120 has neither wgmma nor the Gluon kernels' layout
    with pytest.raises(ValueError, match="sm_70 is older than Triton supports"):
        device.for_capability((7, 0))


def test_prune_keeps_what_fits_and_names_what_does_not():
    t4 = device.TARGETS[(7, 5)]
    configs = [100_000, 60_000, 30_000]
    assert device.prune(configs, lambda c: c, t4, what="x") == [60_000, 30_000]
    with pytest.raises(ValueError, match=r"x: no tile configuration fits sm_75 \(T4.*needs about 100000 bytes"):
        device.prune([100_000, 120_000], lambda c: c, t4, what="x")


@pytest.mark.skipif(runtime.MODE != "interpreter", reason="interpreter-mode behaviour")
def test_the_interpreter_has_no_target_and_no_limits():
    assert device.target() is None and not device.hopper() and device.fits(10**9)


@pytest.mark.skipif(runtime.MODE != "gpu", reason="needs a GPU")
def test_the_live_gpu_is_read_from_the_driver():
    live = device.target()
    props = torch.cuda.get_device_properties(0)
    assert live.capability == (props.major, props.minor) and live.shared_bytes == props.shared_memory_per_block_optin
    assert device.hopper() == (live.capability == (9, 0))
