"""Parsing Nsight Compute CSV and SASS; the profile helpers degrade clearly without ncu."""

import json
import shlex
import stat
import sys
import textwrap
import types
from pathlib import Path

import pytest

from flashattn import bank_counters, profile

FIXTURES = Path(__file__).parent / "fixtures"


def test_parse_captured_ncu_csv():
    text = (FIXTURES / "ncu_v2_small.csv").read_text()
    rows = profile.parse_ncu_csv(text)
    assert len(rows) == 2  # warm-up launch and measured launch of one configuration
    for row in rows:
        assert "attn_kernel_v2" in row["kernel"]
        for name in bank_counters.BANK_METRICS:
            assert isinstance(row["metrics"][name], float), name
        assert row["metrics"]["gpu__time_duration.sum"] > 0
        assert row["units"]["gpu__time_duration.sum"] == "ns"


def test_parse_handles_thousands_separators_and_noise():
    text = (
        "==PROF== Connected to process 1\nsome program output\n"
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","dram__bytes_read.sum","gpu__time_duration.sum"\n'
        '"","","","","","","","","","","","byte","ns"\n'
        '"0","7","python3","127.0.0.1","attn_kernel_v2","1","7","(128, 1, 1)","(32, 64, 1)","0","9.0",'
        '"1,234,567","2,048"\n'
    )
    (row,) = profile.parse_ncu_csv(text)
    assert row["metrics"] == {"dram__bytes_read.sum": 1234567.0, "gpu__time_duration.sum": 2048.0}
    assert row["grid"] == "(32, 64, 1)" and row["units"]["dram__bytes_read.sum"] == "byte"


def test_parse_without_table():
    with pytest.raises(ValueError, match="no Nsight Compute CSV table"):
        profile.parse_ncu_csv("==ERROR== something went wrong\n")


def test_ncu_missing_is_explained(monkeypatch):
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    with pytest.raises(profile.NcuUnavailable, match="not installed"):
        profile.ncu_profile([{"variant": "v2"}], ["gpu__time_duration.sum"])


def test_ncu_command_line():
    cmd = profile.ncu_command("/x/ncu", [{"variant": "v2"}], ["a.sum", "b.sum"], "attn_kernel_v2")
    assert cmd[:3] == ["/x/ncu", "--clock-control", "none"]
    assert "--csv" in cmd and "a.sum,b.sum" in cmd and "regex:attn_kernel_v2" in cmd
    assert cmd[-3:-1] == ["-m", "flashattn.measure.profile"]


# ---------------------------------------------------------------- traffic metrics, commands, torch.profiler

def test_kernel_regex_from_the_registry():
    assert profile.kernel_regex(["v2", "v1", "v2_padded"]) == "attn_kernel_v1|attn_kernel_v2"
    assert profile.kernel_regex("naive") == "pv_kernel|scores_kernel|softmax_kernel"
    with pytest.raises(ValueError, match="unknown variant 'v3'"):
        profile.kernel_regex("v3")


def test_target_config_validates():
    cfg = profile.target_config("v2", B=1, H=3, N=77, D=32, options={"block_m": 64})
    assert cfg == {"variant": "v2", "dtype": "float16", "B": 1, "H": 3, "N": 77, "D": 32, "causal": False,
                   "options": {"block_m": 64}}
    json.dumps(cfg)  # JSON-able
    with pytest.raises(ValueError, match="dtype"):
        profile.target_config("v2", B=1, H=1, N=8, D=16, dtype="int8")
    with pytest.raises(ValueError, match="unknown variant"):
        profile.target_config("fast?", B=1, H=1, N=8, D=16)


def test_ncu_shell_command_single_config_skips_the_warmup():
    cfg = profile.target_config("naive", B=1, H=2, N=300, D=64)
    line = profile.ncu_shell_command(cfg)
    args = shlex.split(line)  # the line survives a shell round trip
    assert args[:3] == ["ncu", "--clock-control", "none"]
    assert args[args.index("--kernel-name") + 1] == "regex:pv_kernel|scores_kernel|softmax_kernel"
    # three kernels per call: skip the three of the warm-up call, profile the next three
    assert args[args.index("--launch-skip") + 1] == "3" and args[args.index("--launch-count") + 1] == "3"
    assert args[args.index("--metrics") + 1] == ",".join(profile.TRAFFIC_METRICS)
    assert "--csv" in args and args[-3:-1] == ["-m", "flashattn.measure.profile"]
    assert json.loads(args[-1]) == [cfg]


def test_ncu_shell_command_variants():
    a = profile.target_config("v2", B=1, H=2, N=128, D=64)
    b = profile.target_config("v1", B=1, H=2, N=128, D=64)
    args = shlex.split(profile.ncu_shell_command([a, b], ["x.sum"], full_set=True, report="rep", python="python3"))
    assert "--launch-skip" not in args  # several configurations: every launch is profiled
    assert args[args.index("--set") + 1] == "full" and "--metrics" not in args
    assert args[args.index("-o") + 1] == "rep" and "--csv" not in args
    assert "python3" in args and json.loads(args[-1]) == [a, b]
    with pytest.raises(ValueError, match="separate commands"):
        profile.ncu_shell_command([a, profile.target_config("naive", B=1, H=1, N=64, D=64)])
    with pytest.raises(ValueError, match="empty"):
        profile.ncu_shell_command([])


def test_nsys_command():
    cfg = profile.target_config("v2", B=2, H=4, N=512, D=64)
    args = shlex.split(profile.nsys_command(cfg, report="tl"))
    assert args[:2] == ["nsys", "profile"] and args[args.index("--output") + 1] == "tl"
    assert json.loads(args[-1]) == [cfg]


def test_is_additive_and_sum_launches():
    assert profile.is_additive("dram__bytes_read.sum")
    assert not profile.is_additive("sm__warps_active.avg.pct_of_peak_sustained_active")
    assert not profile.is_additive("smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio")
    launches = [
        {"metrics": {"dram__bytes_read.sum": 10.0, "gpu__time_duration.sum": 3.0, "x.ratio": 2.0}},
        {"metrics": {"dram__bytes_read.sum": 5.5, "gpu__time_duration.sum": 4.0, "x.ratio": 9.0,
                     "lts__t_bytes.sum": "n/a"}},
    ]
    assert profile.sum_launches(launches) == {"dram__bytes_read.sum": 15.5, "gpu__time_duration.sum": 7.0}


def test_ncu_status_without_ncu(monkeypatch):
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    assert "not installed" in profile.ncu_status()
    assert profile.ncu_version() is None


def test_every_collected_metric_has_a_meaning():
    for name in profile.TRAFFIC_METRICS + bank_counters.SHARED_METRICS + profile.WARP_METRICS:
        assert name in profile.METRIC_MEANINGS, name
    assert "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio" in profile.WARP_METRICS


def _traffic_csv(kernels: list[str]) -> str:
    names = ["dram__bytes_read.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
             "sm__warps_active.avg.pct_of_peak_sustained_active"]
    head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
            '"Grid Size","Device","CC",' + ",".join(f'"{n}"' for n in names))
    units = '"","","","","","","","","","","","byte","sector","%"'
    lines = ["==PROF== Connected to process 1", head, units]
    for i, kernel in enumerate(kernels):
        lines.append(f'"{i}","1","python","h","{kernel}","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0",'
                     f'"{1000 * (i + 1):,}","{10 * (i + 1)}","{12.5 + i}"')
    return "\n".join(lines) + "\n"


def test_parse_traffic_metrics_and_units():
    rows = profile.parse_ncu_csv(_traffic_csv(["attn_kernel_v2"]))
    (row,) = rows
    assert row["metrics"]["dram__bytes_read.sum"] == 1000.0
    assert row["units"]["lts__t_sectors_srcunit_tex_op_read.sum"] == "sector"
    assert row["units"]["sm__warps_active.avg.pct_of_peak_sustained_active"] == "%"


def test_ncu_profile_with_a_fake_ncu_keeps_the_second_call(tmp_path, monkeypatch):
    """ncu_profile end to end on a stand-in ncu that prints a CSV for two calls of naive (six kernels)."""
    kernels = ["scores_kernel", "softmax_kernel", "pv_kernel"] * 2
    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""
        import sys
        assert sys.argv[1:3] == ["--clock-control", "none"]
        print({_traffic_csv(kernels)!r})
    """))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(profile, "find_ncu", lambda: str(fake))
    cfg = profile.target_config("naive", B=1, H=1, N=64, D=16)
    (launches,) = profile.ncu_profile([cfg], ["dram__bytes_read.sum"], kernel_regex=profile.kernel_regex("naive"))
    assert [launch["kernel"] for launch in launches] == ["scores_kernel", "softmax_kernel", "pv_kernel"]
    assert [launch["metrics"]["dram__bytes_read.sum"] for launch in launches] == [4000.0, 5000.0, 6000.0]
    assert "sm__warps_active.avg.pct_of_peak_sustained_active" not in launches[0]["metrics"]  # not asked for


@pytest.mark.parametrize("kernels, message", [
    (["scores_kernel", "softmax_kernel", "scores_kernel"], "got 3 launches for 1"),
    (["scores_kernel", "softmax_kernel", "softmax_kernel", "scores_kernel"], "launched different kernels"),
])
def test_ncu_profile_refuses_calls_that_differ(tmp_path, monkeypatch, kernels, message):
    """Launches that cannot be two identical calls are refused, not sliced into a wrong second call."""
    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\nprint({_traffic_csv(kernels)!r})\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(profile, "find_ncu", lambda: str(fake))
    cfg = profile.target_config("naive", B=1, H=1, N=64, D=16)
    with pytest.raises(profile.NcuUnavailable, match=message):
        profile.ncu_profile([cfg], ["dram__bytes_read.sum"], kernel_regex=profile.kernel_regex("naive"))


def test_ncu_profile_refused_permission(tmp_path, monkeypatch):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - The user does not have permission' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(profile, "find_ncu", lambda: str(fake))
    with pytest.raises(profile.NcuUnavailable, match="ERR_NVGPUCTRPERM"):
        profile.ncu_profile([profile.target_config("v2", B=1, H=1, N=64, D=16)], bank_counters.BANK_METRICS)


def test_torch_profile_table_on_this_device():
    import torch

    import flashattn
    from flashattn import runtime

    q, k, v = runtime.random_qkv(1, 1, 40, 16)  # N not a multiple of the block
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    rows = profile.torch_profile({"matmul": lambda: a @ b,
                                  "v2": lambda: flashattn.attention(q, k, v, variant="v2")}, repeat=2)
    labels = [r for r in rows if r["kind"] == "label"]
    assert [r["name"] for r in rows[:2]] == [r["name"] for r in labels] and {r["name"] for r in labels} == {
        "matmul", "v2"}  # one row per label, also where the GPU ran inside it (issue 15)
    assert all(r["calls"] == 1 and r["cpu_ms"] > 0 for r in labels)
    if runtime.MODE == "gpu":  # v2's kernel ran on the GPU inside its label
        assert next(r for r in labels if r["name"] == "v2")["device_ms"] > 0
        assert any(r["kind"] == "kernel" and "attn_kernel_v2" in r["name"] for r in rows)
    mm = [r for r in rows if r["name"] == "aten::mm"]
    assert mm and mm[0]["calls"] >= 2  # the matmul ran twice under the profiler (the warm-up did not count)
    table = profile.format_profile_table(rows, limit=3)
    assert table.splitlines()[0].startswith("name") and "matmul" in table and len(table.splitlines()) <= 6
    with pytest.raises(ValueError, match="empty"):
        profile.torch_profile({})
    with pytest.raises(ValueError, match="repeat"):
        profile.torch_profile({"x": lambda: None}, repeat=0)


def _event(key, device, count=1, cpu=0.0, self_cpu=0.0, dev=0.0, self_dev=0.0, annotation=False):
    from torch.autograd import DeviceType

    return types.SimpleNamespace(key=key, device_type=DeviceType.CUDA if device else DeviceType.CPU, count=count,
                                 cpu_time_total=cpu, self_cpu_time_total=self_cpu, device_time_total=dev,
                                 self_device_time_total=self_dev, is_user_annotation=annotation)


def test_profile_rows_merge_the_gpu_side_of_a_label():
    """What the H200 gives (issue 15: ['v2', 'matmul'] == ['v2', 'matmul', 'v2']): a label whose range ran GPU
    work comes twice, as a CPU range and as a GPU annotation; a kernel may even carry a label's name."""
    events = [
        _event("v2", device=False, cpu=900.0, self_cpu=50.0, dev=300.0, annotation=True),
        _event("matmul", device=False, cpu=200.0, self_cpu=20.0, annotation=True),
        _event("v2", device=True, dev=450.0, annotation=True),  # the GPU-side annotation of the range
        _event("attn_kernel_v2", device=True, count=2, dev=400.0, self_dev=400.0),
        _event("attn_kernel_v2", device=False, count=2, cpu=30.0, self_cpu=30.0),  # a CPU op of that name
        _event("aten::mm", device=False, count=2, cpu=150.0, self_cpu=150.0),
    ]
    rows = profile.profile_rows(events, {"v2": None, "matmul": None, "attn_kernel_v2": None})
    assert [(r["name"], r["kind"]) for r in rows] == [
        ("v2", "label"), ("matmul", "label"), ("attn_kernel_v2", "kernel"), ("attn_kernel_v2", "op"),
        ("aten::mm", "op")]
    v2 = rows[0]
    assert (v2["calls"], v2["cpu_ms"], v2["self_cpu_ms"], v2["device_ms"]) == (1, 0.9, 0.05, 0.45)
    assert rows[2]["self_device_ms"] == 0.4 and rows[2]["calls"] == 2
