"""Why the compiled float16 step's gradients differ from the eager step's (model_step_vs_sdpa's compiled_vs_eager).

For the GPT of model_step_vs_sdpa (d_model 1024, 16 heads of 64, 4 layers, N = 1024, B = 16): every parameter's
gradient from four steps, flashattn and torch SDPA, eager and compiled, under float16 and bfloat16 autocast, each
against the float32 eager step of the same model (the reference); and each gradient's size (its largest
magnitude), to tell float16's range from a wrong result. Writes $OUT/grads_probe.json.

Run on the H200 (2026-12-02, torch 2.11): float16's gradients were as far from the float32 step's on SDPA as on
flashattn, eager and compiled alike, and bfloat16's at rounding (figures in that stop's closing note). That run
compiled once for both dtypes, and its compiled bfloat16 step gave exactly the compiled float16 step's gradients:
Dynamo did not recompile when only the autocast dtype changed. Hence the reset per dtype here
(model_step_vs_sdpa resets before every cell).
"""

import json
import os

import torch
import torch._dynamo

from flashattn.measure.measurements.model_step import loss_and_grads, make_step
from flashattn.measure.measurements.training import ATTENTIONS, make_model
from flashattn.models.gpt import GPTConfig
from flashattn.reference import rel_error

config = GPTConfig(256, 1024, n_layers=4, n_heads=16, d_model=1024)
data = torch.randint(0, 256, (16, 1025), generator=torch.Generator().manual_seed(1024)).cuda()
out = {}
for name, fn in ATTENTIONS.items():
    model = make_model(config, fn, 0, "cuda")
    ref = loss_and_grads(make_step(model, data, torch.float32, "cuda"), model)[1]
    for dtype in (torch.float16, torch.bfloat16):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, dynamic=False)
        for mode, m in (("eager", model), ("compiled", compiled)):
            grads = loss_and_grads(make_step(m, data, dtype, "cuda"), model)[1]
            errs = {n: rel_error(g, ref[n]) for n, g in grads.items()}
            worst = sorted(errs, key=errs.get)[-3:]
            nonfinite = [n for n, g in grads.items() if not torch.isfinite(g).all()]
            zero = [n for n, g in grads.items() if g.abs().max() == 0]
            key = f"{name} {mode} {str(dtype)[6:]}"
            out[key] = {"worst": {n: errs[n] for n in worst}, "median": sorted(errs.values())[len(errs) // 2],
                        "nonfinite": nonfinite, "zero": zero,
                        "ref_max": {n: ref[n].abs().max().item() for n in worst}}
            print(key, json.dumps(out[key]), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "grads_probe.json"), "w"), indent=1)
