"""The committed figures in ``figures/``, each rebuilt on purpose from the package and the recorded data.

    python -m flashattn.teaching.figures            # every figure (make figures)
    python -m flashattn.teaching.figures --only 06_layouts_4byte --out /tmp/figures
    python -m flashattn.teaching.figures --list

The notebooks draw their figures inline and write nothing; these PNGs exist for pages that show a
figure without running a notebook (the README, a review). Each entry of ``FIGURES`` is a function of no
arguments that builds one figure from the models and ``figures/data/`` (no live measurement, no random
input), so a figure changes only when its data or its code does, and ``plots.save`` writes it without
varying metadata: running this twice gives the same bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # a command line: never open a window

import matplotlib.pyplot as plt  # noqa: E402

from flashattn import runtime  # noqa: E402
from flashattn.kernels import launch_tiles  # noqa: E402
from flashattn.measure import recorded  # noqa: E402
from flashattn.measure.measurements.tuning import SWEEP_NAMES  # noqa: E402
from flashattn.record import command_line  # noqa: E402
from flashattn.teaching import bank_plots, plots  # noqa: E402

FIGURES_DIR = runtime.REPO_ROOT / "figures"


def memory_vs_n():
    """Notebook 02: naive attention's O(N²) memory against v2's and SDPA's, as recorded."""
    entry = recorded.get("memory_vs_n")
    memory = recorded.get("device")["properties"]["total_memory_bytes"]
    return plots.plot_memory_vs_n(entry, variants=("naive", "v2", "sdpa"), memory_bytes=memory,
                                  label=recorded.label(entry))


def traffic_v1_v2():
    """Notebook 05: the traffic model of naive, v1 and v2 against N, at the course's full size in float32."""
    full = runtime.SIZES_BY_NAME["full"]
    tiles = launch_tiles("v2", "float32", full.D)
    return plots.plot_traffic(full.N_sweep, D=full.D, dtype_bytes=4, block_m=tiles["block_m"],
                              block_n=tiles["block_n"], B=full.B, H=full.H)


def layouts_4byte():
    """Notebook 06: one warp reads a column of a 64×32 float32 K tile in five layouts, 4-byte loads."""
    return bank_plots.plot_layouts(32, 4, 4, block_n=64)[0]


def layouts_16byte():
    """Notebook 06: the same read with 16-byte loads, where the XOR swizzle is conflict-free."""
    return bank_plots.plot_layouts(32, 4, 16, block_n=64)[0]


def block_sweep():
    """Notebook 08: v2 over block sizes, warps and stages, as recorded."""
    entries = {name: recorded.get(name) for name in SWEEP_NAMES}
    return plots.plot_block_sweeps(entries, recorded.label(next(iter(entries.values()))))


def measured_traffic():
    """Notebook 09: the model against Nsight Compute's L2 and DRAM bytes, at the size well above L2."""
    entry = recorded.get("traffic_measured")
    return plots.plot_measured_traffic(entry["rows"], "large", caption_text=recorded.label(entry))


def fast_vs_sdpa():
    """Notebook 10: the fast kernel, v2 and SDPA across N, D, dtype and masking, as recorded."""
    table = recorded.get("fast_vs_sdpa")
    return plots.plot_fast_vs_sdpa(table, recorded.label(table))


FIGURES = {  # file name (without .png) -> function building the figure
    "02_memory_vs_n": memory_vs_n,
    "05_traffic_v1_v2": traffic_v1_v2,
    "06_layouts_4byte": layouts_4byte,
    "06_layouts_16byte": layouts_16byte,
    "08_block_sweep": block_sweep,
    "09_measured_traffic_large": measured_traffic,
    "10_fast_vs_sdpa": fast_vs_sdpa,
}


def write(names=None, out_dir: Path = FIGURES_DIR) -> list[Path]:
    """Build the named figures (all by default) and write them as ``<out_dir>/<name>.png``."""
    names = list(FIGURES) if names is None else list(names)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {', '.join(unknown)}; registered: {', '.join(FIGURES)}")
    paths = []
    for name in names:
        fig = FIGURES[name]()
        paths.append(plots.save(fig, Path(out_dir) / f"{name}.png"))
        plt.close(fig)
    return paths


def main(argv=None) -> int:
    parser = command_line("python -m flashattn.teaching.figures", __doc__.splitlines()[0], "figures", FIGURES_DIR)
    args = parser.parse_args(argv)
    if args.list:
        for name, fn in FIGURES.items():
            print(f"{name:28s} {fn.__doc__.splitlines()[0]}")
        return 0
    try:
        paths = write(args.only, args.out)
    except ValueError as err:
        parser.error(str(err))
    for path in paths:
        print(f"[figures] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
