"""flashattn.kernels.registry: one record per variant, and every list of variants derived from it.

The toy variant is registered here, and nowhere else: it appears in VARIANTS, the bench table, the
compiled facts, the traffic model and the plots without any other file changing.
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import flashattn  # noqa: E402
from flashattn import bench, plots, profile, reference, runtime, traffic  # noqa: E402
from flashattn.kernels import registry, v2  # noqa: E402
from flashattn.measure.measurements import banks as bank_measurements  # noqa: E402
from flashattn.measure.measurements import compiled as compiled_measurements  # noqa: E402
from flashattn.reference import rel_error  # noqa: E402

TOY_COLOR = "#123456"


def toy_attention(q, k, v, *, causal=False, scale=None, **options):
    """A thin wrapper over v2: the toy variant of this test."""
    return v2.attention_v2(q, k, v, causal=causal, scale=scale, **options)


@pytest.fixture
def toy():
    record = registry.register(registry.Variant(
        "toy", toy_attention, v2.default_options, (v2.attn_kernel_v2,), TOY_COLOR, ("05",), traffic="v2",
        in_bench=True, label="toy (v2, wrapped)"))
    try:
        yield record
    finally:
        registry.unregister("toy")


def test_the_course_variants_and_their_records():
    assert list(flashattn.VARIANTS) == registry.names() == [
        "naive", "v1", "v2", "v2_kt", "v2_kt_view", "v2_padded", "fast"]
    assert flashattn.VARIANTS is registry.VARIANTS
    assert registry.names(traffic=True) == ["naive", "v1", "v2", "v2_kt", "v2_kt_view", "v2_padded"]
    assert registry.names(bench=True) == ["v2", "fast"]
    assert registry.names(notebook="06") == ["v2", "v2_kt", "v2_kt_view", "v2_padded"]
    assert registry.kernel_names("naive") == ("scores_kernel", "softmax_kernel", "pv_kernel")
    assert registry.get("naive").launches == 3 and registry.get("v2_kt").launches == 1
    for name in registry.names():
        record = registry.get(name)
        assert record.fn is flashattn.VARIANTS[name] and record.label == name
        assert record.backward is None or callable(record.backward)
        assert registry.default_options(name, torch.float16, 64, mode="gpu") == record.default_options(
            torch.float16, 64, "gpu")
        assert all(hasattr(kernel, "fn") for kernel in registry.jit_kernels(name))  # unwrapped @triton.jit


def test_toy_variant_runs_by_name(toy):
    q, k, v = runtime.random_qkv(2, 3, 17, 16, dtype=torch.float32, seed_value=5)
    out = flashattn.attention(q, k, v, variant="toy", causal=True)
    assert rel_error(out, reference(q, k, v, causal=True)) < 1e-5
    assert "toy" in flashattn.VARIANTS and registry.default_options("toy", torch.float16, 64)


def test_toy_variant_joins_the_bench_table(toy):
    assert bench.default_variants() == ["v2", "fast", "toy"]
    header = bench.format_header()
    assert header.rstrip().endswith("toy TF/s  ×SDPA")
    row = {"dtype": "float16", "B": 1, "H": 16, "N": 16384, "D": 64, "causal": False,
           "tflops": {"sdpa": 400.0, "v2": 300.0, "fast": 420.0, "toy": 301.0},
           "vs_sdpa": {"v2": 0.75, "fast": 1.05, "toy": 0.75}}
    assert bench.format_row(row).split()[-2:] == ["301", "0.75"]


def test_toy_variant_joins_compiled_facts_and_the_profilers(toy):
    assert "toy" in compiled_measurements.compiled_variants()
    assert registry.jit_kernels("toy") == registry.jit_kernels("v2")  # the kernels compiled facts read
    assert registry.kernel_names("toy") == ("attn_kernel_v2",)
    assert profile.kernel_regex(["toy"]) == "attn_kernel_v2"
    assert profile.target_config("toy", B=1, H=1, N=64, D=16)["variant"] == "toy"
    assert "toy" not in bank_measurements.k_variants()  # notebook 06 does not teach it


def test_toy_variant_joins_the_traffic_model(toy):
    problem = dict(B=2, H=2, N=100, D=32, dtype_bytes=2, block_m=32, block_n=16, causal=True)
    assert "toy" in traffic.modelled_variants()
    assert traffic.hbm_bytes("toy", **problem) == traffic.hbm_bytes("v2", **problem)


def test_toy_variant_joins_the_plots(toy):
    assert plots.color("toy") == TOY_COLOR and plots.colors()["toy"] == TOY_COLOR
    assert plots.legend_label("toy") == "toy (v2, wrapped)"
    fig = plots.plot_traffic([64, 128], D=32, dtype_bytes=2, block_m=32, block_n=32, B=1, H=1,
                             variants=("v2", "toy"))
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert matplotlib.colors.to_hex(lines["toy (v2, wrapped)"].get_color()) == TOY_COLOR
    plt.close(fig)


def test_unregistering_removes_every_trace():
    record = registry.Variant("toy3", toy_attention, v2.default_options, (v2.attn_kernel_v2,), TOY_COLOR, ("05",),
                              traffic="v2", in_bench=True)
    registry.register(record)
    assert "toy3" in flashattn.VARIANTS and "toy3" in bench.default_variants()
    assert registry.unregister("toy3") is record
    assert "toy3" not in flashattn.VARIANTS and "toy3" not in plots.colors()
    assert bench.default_variants() == ["v2", "fast"] and "toy3" not in traffic.modelled_variants()


def test_register_validates_the_record():
    def record(**changes):
        fields = dict(name="toy2", fn=toy_attention, default_options=v2.default_options,
                      jit_kernels=(v2.attn_kernel_v2,), color=TOY_COLOR, notebooks=("05",))
        return registry.Variant(**{**fields, **changes})

    with pytest.raises(ValueError, match="already registered"):
        registry.register(record(name="v2"))
    for changes, error, match in [
        ({"name": "not a name"}, ValueError, "identifier"),
        ({"fn": None}, TypeError, "fn must be callable"),
        ({"jit_kernels": ()}, ValueError, "jit_kernels"),
        ({"color": "red"}, ValueError, "#rrggbb"),
        ({"notebooks": ("5",)}, ValueError, "two-digit"),
        ({"traffic": "v3"}, ValueError, "traffic must be one of"),
        ({"launches": 0}, ValueError, "launches"),
        ({"backward": "grad"}, TypeError, "backward"),
    ]:
        with pytest.raises(error, match=match):
            record(**changes)
    with pytest.raises(TypeError, match="Variant"):
        registry.register(toy_attention)
    with pytest.raises(ValueError, match="unknown variant 'toy2'; accepted: naive, v1"):
        registry.unregister("toy2")
