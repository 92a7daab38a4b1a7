"""FlashAttention in Triton, a course: the package every notebook imports.

The package is grouped by role:

* ``kernels/``   the attention kernels, one family per file, and the registry of variants;
* ``models/``    the models a learner reasons with: softmax, traffic, banks, occupancy, roofline, tuning;
* ``measure/``   compiled-kernel facts, Nsight Compute, recorded results and the registered measurements
                 (``bench`` and ``record``, the two command lines, sit at the top);
* ``teaching/``  plots, widgets, figures and the source post's numbers;
* ``exercises/`` the checks of the notebooks' exercises.

The modules a notebook uses are importable by their short names (``from flashattn import traffic``);
they are loaded on first use. ``runtime`` is imported first: it sets TRITON_INTERPRET=1 when there is
no GPU, and Triton reads that variable when each kernel's ``@triton.jit`` runs.
"""

import importlib

from . import runtime  # noqa: I001  (must come before the kernels)
from .functional import attention, scaled_dot_product_attention
from .kernels import VARIANTS
from .kernels.decode import attention_with_kvcache
from .masking import attention_varlen
from .reference import reference
from .runtime import describe

# short name -> module, for ``from flashattn import traffic``
MODULES = {
    "softmax": "flashattn.models.softmax",
    "traffic": "flashattn.models.traffic",
    "banks": "flashattn.models.banks",
    "layouts": "flashattn.models.layouts",
    "fma_loads": "flashattn.models.fma_loads",
    "occupancy": "flashattn.models.occupancy",
    "roofline": "flashattn.models.roofline",
    "tuning": "flashattn.models.tuning",
    "hardware": "flashattn.measure.hardware",
    "compiled": "flashattn.measure.compiled",
    "profile": "flashattn.measure.profile",
    "autotune": "flashattn.measure.autotune",
    "bank_counters": "flashattn.measure.bank_counters",
    "traffic_counters": "flashattn.measure.traffic_counters",
    "recorded": "flashattn.measure.recorded",
    "measurements": "flashattn.measure.measurements",
    "plots": "flashattn.teaching.plots",
    "bank_plots": "flashattn.teaching.bank_plots",
    "source_post": "flashattn.teaching.source_post",
    "figures": "flashattn.teaching.figures",
    "widgets": "flashattn.teaching.widgets",
    "bench": "flashattn.bench",
    "record": "flashattn.record",
    "exercises": "flashattn.exercises",
    "distributed": "flashattn.distributed",
}

__all__ = ["VARIANTS", "attention", "attention_varlen", "attention_with_kvcache", "describe", "reference", "runtime",
           "scaled_dot_product_attention", *MODULES]


def __getattr__(name):
    if name in MODULES:
        return importlib.import_module(MODULES[name])
    raise AttributeError(f"module 'flashattn' has no attribute {name!r}")

