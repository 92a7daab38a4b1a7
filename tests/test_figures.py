"""flashattn.figures: the committed PNGs are exactly the registered figures, and rebuilding one gives the same
bytes (``make figures``; the notebooks themselves write nothing)."""

import pytest

from flashattn import figures


def test_every_committed_figure_is_registered_and_every_registered_one_committed():
    committed = {p.stem for p in figures.FIGURES_DIR.glob("*.png")}
    assert committed == set(figures.FIGURES), (f"not registered: {sorted(committed - set(figures.FIGURES))}; "
                                               f"not committed: {sorted(set(figures.FIGURES) - committed)}")


def test_each_figure_builds_from_the_package_and_the_recorded_data_and_twice_gives_the_same_bytes(tmp_path):
    first = figures.write(out_dir=tmp_path / "a")
    second = figures.write(out_dir=tmp_path / "b")
    assert [p.name for p in first] == [f"{name}.png" for name in figures.FIGURES]
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
        assert a.read_bytes().startswith(b"\x89PNG")


def test_the_command_line(tmp_path, capsys):
    assert figures.main(["--list"]) == 0
    assert "06_layouts_4byte" in capsys.readouterr().out
    assert figures.main(["--only", "06_layouts_4byte", "--out", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["06_layouts_4byte.png"]
    with pytest.raises(SystemExit):
        figures.main(["--only", "00_nothing"])
