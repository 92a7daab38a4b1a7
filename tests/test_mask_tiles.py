"""flashattn.models.mask_tiles and notebook 14's widget: the example masks, the tiles and work they count, the
picture of the tiles, and the widget over them."""

import ipywidgets
import matplotlib.pyplot as plt
import pytest
import torch

from flashattn import widgets
from flashattn.kernels import mask_blocks as mb
from flashattn.models import mask_tiles
from flashattn.teaching import schedule_plots


def test_example_masks():
    causal = mask_tiles.example_mask("causal", 64)
    assert torch.equal(causal, torch.ones(64, 64, dtype=torch.bool).tril())
    window = mask_tiles.example_mask("sliding window", 64, window=8)
    assert window.sum(1).tolist() == [min(i + 1, 8) for i in range(64)]  # itself and the 7 keys before
    docs = mask_tiles.example_mask("documents", 64, documents=3, seed=2)
    lengths = mask_tiles.document_lengths(64, 3, seed=2)
    assert len(lengths) == 3 and sum(lengths) == 64 and min(lengths) >= 1
    assert int(docs.sum()) == sum(n * (n + 1) // 2 for n in lengths)
    padding = mask_tiles.example_mask("padding", 64, valid=0.25)
    assert padding.sum(1).tolist() == [16] * 64 and not padding[:, 16:].any()
    for bad, match in ((dict(mask="banded"), "mask must be one of"), (dict(mask="sliding window", window=0), "window"),
                       (dict(mask="documents", documents=0), "documents"), (dict(mask="padding", valid=0), "valid")):
        with pytest.raises(ValueError, match=match):
            mask_tiles.example_mask(N=64, **bad)


@pytest.mark.parametrize("mask", mask_tiles.MASKS)
def test_tiles_count_what_the_classification_says(mask):
    kinds, found = mask_tiles.tiles(mask, 256, 32, 16, window=40, documents=3, valid=0.5)
    assert kinds.shape == (8, 16)
    dense = mask_tiles.example_mask(mask, 256, window=40, documents=3, valid=0.5)
    assert torch.equal(kinds, mb.classify(dense, 32, 16))
    assert found["computed"] == found["full"] + found["partial"] == int((kinds != mb.SKIPPED).sum())
    assert found["vs_dense"] == pytest.approx(found["computed"] / 128)
    causal = int((mb.window_kinds(256, 256, 32, 16, causal=True) != mb.SKIPPED).sum())
    assert found["vs_causal"] == pytest.approx(found["computed"] / causal)
    if mask == "documents":
        assert found["varlen_computed"] == sum(int((mb.window_kinds(n, n, 32, 16, causal=True) != mb.SKIPPED).sum())
                                               for n in found["lengths"])
    if mask == "causal":
        assert found["vs_causal"] == 1.0


def test_plot_tile_kinds_draws_the_matrix():
    kinds = mb.window_kinds(100, 100, 16, 16, (20, 0), causal=True)
    fig = schedule_plots.plot_tile_kinds(kinds, "window", block_m=16, block_n=16)
    try:
        image = fig.axes[0].images[0].get_array()
        assert image.shape == (7, 7) and (image == kinds.numpy()).all()
        counts = [int((kinds == k).sum()) for k in range(3)]
        assert f"{counts[2]} full, {counts[1]} partial, {counts[0]} skipped" in fig.axes[0].get_title()
    finally:
        plt.close(fig)


def test_mask_view_and_widget():
    fig, summary = widgets.mask_view(**widgets.mask_defaults())
    plt.close(fig)
    assert summary["text"].startswith("sliding window, N=2048, tiles 128×64:") and summary["computed"] > 0
    box = widgets.mask_widget()
    controls = {c.description: c for row in box.children if isinstance(row, ipywidgets.HBox) for c in row.children}
    assert set(controls) == {"mask", "N", "block_m", "block_n", "window", "documents", "valid keys"}
    assert all(c.continuous_update is False for c in controls.values())
    before = bytes(box.image.value)
    controls["mask"].value = "documents"
    assert "attention_varlen" in box.text and bytes(box.image.value) != before
    with pytest.raises(ValueError, match="block_m must be one of"):
        widgets.mask_widget(block_m=48)
    assert plt.get_fignums() == []
