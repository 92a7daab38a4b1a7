"""Where a kernel sits on the roofline: its FLOP over the bytes that reach DRAM (notebooks 00 and 10).

One kernel's memory traffic can be counted three ways, and only one of them belongs on a roofline:

* **requested**: what its loads and stores ask of the memory system, with no reuse
  (``flashattn.traffic``'s model). Nsight Compute sees it as the SMs' requests to L2
  (``lts__t_sectors_srcunit_tex_op_*``; notebook 09 checks the model against it). Much of it is served
  by the L2 cache and never reaches DRAM.
* **DRAM**: what misses in L2 and goes to HBM (``dram__bytes_read/write``). This is what the memory roof
  (the HBM copy bandwidth) limits, so it is the roofline's x axis: measured by Nsight Compute where a
  recording has this exact problem.
* **compulsory**: every tensor the kernel touches read or written once, the DRAM traffic of a perfect
  cache. No kernel moves less, so where nothing is measured it places a kernel as far right as it can be.

``fast`` and PyTorch's SDPA (FlashAttention kernels) follow FlashAttention-2's loop, so their requested
and compulsory bytes are v2's formula (with ``fast``'s rows per K/V load).
"""

from __future__ import annotations

from flashattn.measure import recorded
from flashattn.models import roofline, traffic

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# recorded measurements that hold Nsight Compute DRAM bytes per problem, searched in this order
SOURCES = ("roofline_dram", "traffic_measured")


def recorded_dram_bytes(variant: str, *, B: int, H: int, N: int, D: int, dtype: str = "float16",
                        causal: bool = False, gpu: str | None = None) -> dict | None:
    """``{"read", "write", "source"}``: the DRAM bytes Nsight Compute measured for exactly this problem (all of
    the variant's kernels), or None if no recording on ``gpu`` (None: the first recorded GPU) has it."""
    problem = (variant, B, H, N, D, dtype, causal)
    for name in SOURCES:
        entry = recorded.find(name, gpu=gpu)
        for row in (entry or {}).get("rows", []):
            if "error" in row or (row.get("variant"), row.get("B"), row.get("H"), row.get("N"), row.get("D"),
                                  row.get("dtype"), row.get("causal")) != problem:
                continue
            read, write = (recorded.number(row["measured"].get(k)) for k in ("dram_read", "dram_write"))
            if read is not None and write is not None:
                return {"read": read, "write": write, "source": f"measured by Nsight Compute ('{name}')"}
    return None


def model_variant(variant: str) -> str:
    """The traffic formula ``variant`` follows: its own where the model covers it, else v2's (fast, sdpa)."""
    return variant if variant in traffic.modelled_variants() else "v2"


def attention_traffic(variant: str, *, B: int, H: int, N: int, D: int, dtype: str = "float16",
                      causal: bool = False, block_m: int | None = None, block_n: int | None = None,
                      gpu: str | None = None) -> dict:
    """The three byte counts of one forward pass (read + written): ``requested`` (None without block sizes for
    a variant the model has no defaults for), ``compulsory``, and ``dram`` with ``dram_source``: measured where
    recorded, else the compulsory bytes."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    model = model_variant(variant)
    shape = dict(B=B, H=H, N=N, D=D, dtype_bytes=DTYPE_BYTES[dtype])
    compulsory = traffic.compulsory_bytes(model, **shape)
    requested = None
    if (block_m and block_n) or model == variant:
        requested = roofline.attention_bytes(model, **shape, block_m=block_m, block_n=block_n, causal=causal)
    measured = recorded_dram_bytes(variant, B=B, H=H, N=N, D=D, dtype=dtype, causal=causal, gpu=gpu)
    out = {"requested": requested, "compulsory": compulsory["read"] + compulsory["write"]}
    if measured:
        out.update(dram=measured["read"] + measured["write"], dram_source=measured["source"])
    else:
        out.update(dram=out["compulsory"], dram_source="compulsory (not measured for this problem)")
    return out


def roofline_point(label: str, variant: str, *, tflops: float | None, B: int, H: int, N: int, D: int,
                   dtype: str = "float16", causal: bool = False, block_m: int | None = None,
                   block_n: int | None = None, gpu: str | None = None) -> dict:
    """A point for ``flashattn.plots.plot_roofline``: at FLOP per DRAM byte (:func:`attention_traffic`), with
    ``requested_intensity`` (FLOP per requested byte, where known: the plot draws the way from there) and the
    byte counts."""
    counts = attention_traffic(variant, B=B, H=H, N=N, D=D, dtype=dtype, causal=causal, block_m=block_m,
                               block_n=block_n, gpu=gpu)
    flops = roofline.attention_flops(B, H, N, D, causal)
    return {"label": label, "variant": variant, "tflops": tflops, "intensity": flops / counts["dram"],
            "requested_intensity": None if counts["requested"] is None else flops / counts["requested"],
            "bytes": counts, "dram_source": counts["dram_source"]}
