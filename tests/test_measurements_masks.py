"""The host side of the recorded measurement masks_vs_flex (notebook 14), at toy sizes on the CPU: its problems,
the pairs and tiles it counts, and that ours, FlexAttention (eager here; torch.compile'd on the GPU) with the
BlockMask it builds, SDPA with the dense mask and the float64 rows it checks against all agree."""

import pytest
import torch

from flashattn import runtime
from flashattn.kernels import mask_blocks as mb
from flashattn.measure.measurements import masks
from flashattn.reference import rel_error


def test_problems_fill_their_lengths():
    found = masks.problems()
    assert [p.kind for p in found].count("window") == len(masks.WINDOWS) * len(masks.LENGTHS)
    for p in found:
        if p.kind == "documents":
            assert sum(p.lengths) == p.N and max(p.lengths) <= masks.DOCUMENT_LENGTHS[1]
            assert min(p.lengths[:-1]) >= masks.DOCUMENT_LENGTHS[0]  # only the last is cut to fit
        if p.kind == "padding":
            assert len(p.lengths) == p.B and max(p.lengths) == p.N and min(p.lengths) >= p.N // 4


@pytest.mark.parametrize("problem", [masks.Problem("window", 100, window=30), masks.Problem("window", 20, window=30),
                                     masks.Problem("documents", 90, lengths=(1, 50, 39)),
                                     masks.Problem("padding", 40, B=3, lengths=(40, 7, 1))], ids=lambda p: p.label)
def test_pairs_and_tiles_are_the_masks(problem):
    dense = masks.dense_mask(problem, "cpu").expand(problem.B, 1, problem.N, problem.N)
    assert masks.kept_pairs(problem) == int(dense.sum())
    kinds = masks.tile_kinds(problem, 16, 32)
    assert torch.equal(kinds, mb.classify(dense, 16, 32)) or problem.kind == "padding"
    assert masks.computed_tiles(kinds) == int((mb.classify(dense, 16, 32) != mb.SKIPPED).sum())
    if problem.kind == "documents":  # attention_varlen's tiles: blocks start at each document
        per_doc = masks.tile_kinds(problem, 16, 32, per_document=True)
        assert masks.computed_tiles(per_doc) == sum(
            int((mb.window_kinds(n, n, 16, 32, causal=True) != mb.SKIPPED).sum()) for n in problem.lengths)


@pytest.mark.skipif(runtime.MODE != "interpreter", reason="FlexAttention eager on the CPU")
@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile:UserWarning")
@pytest.mark.parametrize("problem", [masks.Problem("window", 64, window=20),
                                     masks.Problem("documents", 64, lengths=(30, 1, 33)),
                                     masks.Problem("padding", 64, B=2, lengths=(64, 9))], ids=lambda p: p.label)
def test_every_kernel_of_a_cell_computes_the_same(problem, monkeypatch):
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(masks, "HEADS", 2)
    monkeypatch.setattr(masks, "FLEX_BLOCK", 32)  # several blocks at this toy size
    q, k, v, do = masks.inputs(problem, 16, torch.float32, "cpu")
    state, mods = masks.flex_mask_mods("cpu")
    fns = masks.kernels(problem, "cpu", state, mods, flex_attention)
    assert set(fns) == {"ours", "flex", "sdpa", "fast_full"}
    assert masks.reference_rows(problem, q, k, v)[2].shape == (64, 16)  # 256 rows asked: all 64 there are
    b, rows, ref = masks.reference_rows(problem, q, k, v, rows=20)
    outs = {name: masks.timed(fn, q, k, v, do, False, masks.takes_packed(problem, name))()
            for name, fn in fns.items() if name != "fast_full"}
    for name, out in outs.items():
        assert rel_error(out[b, 0, rows], ref) < 1e-5, name
        assert rel_error(out, outs["sdpa"]) < 1e-5, name
    grads = masks.timed(fns["ours"], q, k, v, do, True, masks.takes_packed(problem, "ours"))()
    assert all(g.shape == q.shape for g in grads)
    ref_grads = masks.timed(fns["sdpa"], q, k, v, do, training=True)()
    assert max(rel_error(g, r) for g, r in zip(grads, ref_grads, strict=True)) < 1e-5
    assert len(masks.timed(fns["fast_full"], q, k, v, do, training=True)()) == 3  # the baseline has gradients too


def test_groups_of_a_run_and_the_rows_it_keeps(monkeypatch):
    monkeypatch.setenv("FLASHATTN_MASKS_GROUPS", "float16:64,bfloat16:64")
    assert masks.chosen_groups() == (("float16", 64), ("bfloat16", 64))
    monkeypatch.setenv("FLASHATTN_MASKS_GROUPS", "float32:64")
    with pytest.raises(ValueError, match="not in"):
        masks.chosen_groups()
    monkeypatch.delenv("FLASHATTN_MASKS_GROUPS")
    assert masks.chosen_groups() == masks.GROUPS
    previous = {"recorded_at": "then", "rows": [{"dtype": "float16", "D": 128, "x": 1}, {"dtype": "float16", "D": 64},
                                                {"dtype": "bfloat16", "D": 64, "measured_at": "before"}]}
    monkeypatch.setattr(masks.recorded, "find", lambda name, gpu=None: previous)
    kept = masks._carried_rows({("float16", 128)})
    assert kept == [{"dtype": "float16", "D": 64, "measured_at": "then"},
                    {"dtype": "bfloat16", "D": 64, "measured_at": "before"}]


def test_each_row_names_the_kernel_that_ran_its_forward(monkeypatch):
    """``ours_block`` follows masking's routing: on Hopper, at the head dimensions in GLUON_KEY_MASK_DIMS, a padding
    mask runs the Gluon kernel (a program's rows against 128 keys), and so do packed documents at the head
    dimensions in GLUON_DOCUMENTS_DIMS (D = 128 by default); padding or documents at a head dimension not listed, and
    every problem where Gluon is not available, the Triton kernel's first tiles."""
    from flashattn import masking_gluon
    from flashattn.kernels import masked

    pad = masks.Problem("padding", 256, B=2, lengths=(256, 100))
    docs = masks.Problem("documents", 256, lengths=(100, 156))
    for D, want_pad in ((64, "triton"), (128, "gluon")):
        q = torch.randn(2, 4, 256, D, dtype=torch.float16)
        monkeypatch.setattr(masking_gluon, "gluon_available", lambda dtype, D: False)  # not Hopper
        assert masks.ours_block(pad, q, q, q)[0] == "triton"
        monkeypatch.setattr(masking_gluon, "gluon_available", lambda dtype, D: True)
        monkeypatch.setattr(masked, "GLUON_KEY_MASK_DIMS", (128,))
        monkeypatch.setattr(masked, "GLUON_DOCUMENTS_DIMS", ())
        kernel, bm, bn = masks.ours_block(pad, q, q, q)
        assert kernel == want_pad, D
        assert (bm, bn) == ((128, 128) if want_pad == "gluon"
                            else masked.tiles_for(q.dtype, D, mask=torch.bool)[0][:2])
        assert masks.ours_block(docs, q[:1], q[:1], q[:1])[0] == "triton"
        monkeypatch.undo()
    monkeypatch.setattr(masking_gluon, "gluon_available", lambda dtype, D: True)
    q = torch.randn(2, 4, 256, 64, dtype=torch.float16)  # the default lists 64: three consumers of 64 rows each
    assert masks.ours_block(pad, q, q, q) == ("gluon", 192, 128)
    assert masks.ours_block(docs, q[:1], q[:1], q[:1])[0] == "triton"  # packed documents: D = 128 only by default
    q = torch.randn(1, 4, 256, 128, dtype=torch.float16)
    assert masks.ours_block(docs, q, q, q) == ("gluon", 128, 128)
    monkeypatch.setattr(masked, "GLUON_DOCUMENTS_DIMS", ())
    assert masks.ours_block(docs, q, q, q)[0] == "triton"
