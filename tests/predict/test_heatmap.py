"""The projection's heatmaps (gvq/predict/heatmap.py): a winner's colour is its setting's and mode's palette
colour in every heatmap, a tie grey, the legend holds every mark and the figure says what a cell's text is;
checked on scripted winners and on the PNGs ``project overlap=true`` writes, opened as images."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gvq.predict import __main__ as cli
from gvq.predict import heatmap
from gvq.schema.palette import colour_of, marker_of


def test_a_tied_cell_is_coloured_as_a_tie_and_a_winner_by_its_name_and_mode():
    win = pd.DataFrame({"winner": ["qsgd post", "rar post", "qsgd bits=2 overlap"], "tied": ["fp16 overlap", "", None]})
    tied, label, colours = heatmap.cell_colours(win, modes=True)
    assert list(label) == [heatmap.TIE, "rar post", "qsgd bits=2 overlap"]
    assert colours == {"qsgd bits=2 overlap": colour_of("qsgd bits=2", "overlap"), "rar post": colour_of("rar"),
                       heatmap.TIE: heatmap.TIE_COLOUR}
    # a colour is the name's alone: the same mode among other winners keeps it
    assert heatmap.cell_colours(win.iloc[1:2], modes=True)[2] == {"rar post": colour_of("rar")}
    assert heatmap.legend_name("qsgd bits=2 overlap", True) == "qsgd bits=2 (overlap)"
    assert heatmap.legend_name("qsgd bits=2", False) == "qsgd bits=2"


def test_a_heatmap_with_many_winners_keeps_its_legend_inside_the_figure(tmp_path, monkeypatch):
    """Eight winners and the GradiVeQ line in two panels: the legend wraps into rows instead of one line
    wider than the figure (the transformer's projection cut its first and last names off)."""
    import matplotlib.pyplot as plt
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    winners = [f"signsgd _target_=ErrorFeedback k={k} post" for k in range(8)]
    rows = [{"N": n, "link_bps": b, "compute_scale": c, "winner": winners[(i + j) % 8], "margin": 1.5,
             "gradiveq_vs_rar": 0.5 + j, "tied": ""}
            for c in (1.0, 1 / 6) for i, n in enumerate((8, 16)) for j, b in enumerate((5e7, 1e9, 1e10))]
    heatmap.plot(pd.DataFrame(rows), "m", tmp_path / "h.png", note="baseline: a long line " * 6,
                 caption="number in a cell: a gain", modes=True)
    (fig,) = kept
    renderer = fig.canvas.get_renderer()
    box, whole = fig.legends[0].get_window_extent(renderer), fig.bbox
    assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and whole.y0 <= box.y0
    assert all(not box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)
    shown = [t.get_text() for t in fig.legends[0].get_texts()]
    assert shown == sorted(heatmap.legend_name(w, True) for w in {r["winner"] for r in rows}) + ["GradiVeQ-RAR = RAR"]
    assert "number in a cell: a gain" in fig.get_suptitle()
    assert (tmp_path / "h.png").stat().st_size > 1000


def _cell_pixel(image: np.ndarray, ax, i: int, j: int) -> np.ndarray:
    """The RGB of cell (row ``i``, column ``j``) of panel ``ax`` in the saved ``image``, sampled left of the
    cell's centre (its number is written there) and away from its edges."""
    box, (x0, x1), (y0, y1) = ax.get_position(), ax.get_xlim(), ax.get_ylim()
    height, width = image.shape[:2]
    fx = box.x0 + (j - 0.3 - x0) / (x1 - x0) * box.width
    fy = box.y0 + (i - y0) / (y1 - y0) * box.height
    return image[int(round((1 - fy) * height)), int(round(fx * width)), :3]


def test_each_mode_has_its_palette_colour_in_both_projection_heatmaps(calibrated_settings, tmp_path, monkeypatch):
    """``project overlap=true iterations_to_target=[...]`` writes the per-iteration and the time-to-target
    heatmaps; opened as PNGs, every cell is its winner's ``colour_of(name, mode)`` (a mode that wins in
    both is one colour in both; index-picked colours gave one colour to different modes), each figure's
    legend names every winner and its title says what the cell's number is."""
    import matplotlib.image as mpimg
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure
    drawn, save = {}, Figure.savefig

    def keep(fig, path, *args, **kwargs):                   # the figures as drawn, to find their cells
        drawn[Path(path).name] = fig
        return save(fig, path, *args, **kwargs)
    monkeypatch.setattr(Figure, "savefig", keep)
    # 2-bit QSGD: the fewest bytes per iteration but (scripted) many more iterations, so the two rankings differ
    full = cli.main(["project", "overlap=true", "models=[cnn]", "--calibration", str(calibrated_settings.parent),
                     "max_world_size=32", "--out", str(tmp_path), "baseline=gvq_ring",
                     "iterations_to_target=[fp16=100,qsgd=110,qsgd bits=2=400]"])
    both = set(full["winner"]) & set(full["tta_winner"])
    assert both, "no mode wins in both heatmaps: the comparison would be empty"
    for png, column in (("projection_overlap_cnn.png", "winner"), ("projection_overlap_tta_cnn.png", "tta_winner")):
        fig, image = drawn[png], mpimg.imread(tmp_path / png)
        panels = sorted((ax for ax in fig.axes if ax.images), key=lambda ax: ax.get_position().x0)
        for ax, scale in zip(panels, sorted(full["compute_scale"].unique(), reverse=True)):
            cells = full[full["compute_scale"] == scale]
            Ns, Bs = sorted(cells["N"].unique()), sorted(cells["link_bps"].unique())
            for _, r in cells.iterrows():
                want = to_rgb(colour_of(*r[column].rsplit(" ", 1)))
                got = _cell_pixel(image, ax, Ns.index(r["N"]), Bs.index(r["link_bps"]))
                assert got == pytest.approx(want, abs=0.02), (png, r[column], r["N"], r["link_bps"])
        legend = {t.get_text() for t in fig.legends[0].get_texts()}
        assert {"{} ({})".format(*w.rsplit(" ", 1)) for w in full[column]} <= legend, png
        assert "number in a cell" in fig.get_suptitle()


def test_a_cells_number_reads_on_its_colour_and_its_marker_tells_apart_settings_of_one_colour(tmp_path, monkeypatch):
    """rar's family colour is black: its cells' numbers are white (black text on them could not be read);
    ddp shares rar's colour, so each cell and legend entry carries its setting's marker too."""
    import matplotlib.pyplot as plt
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    win = pd.DataFrame([{"N": 8, "link_bps": b, "compute_scale": 1.0, "winner": w, "margin": 1.5,
                         "gradiveq_vs_rar": np.nan} for b, w in ((5e7, "qsgd bits=2"), (1e9, "rar"))])
    heatmap.plot(win, "m", tmp_path / "h.png", caption="number in a cell: a margin")
    (fig,) = kept
    assert [t.get_color() for t in fig.axes[0].texts] == ["black", "white"]
    assert [ln.get_marker() for ln in fig.axes[0].lines] == [marker_of("qsgd bits=2"), marker_of("rar")]
    assert colour_of("ddp") == colour_of("rar") and marker_of("ddp") != marker_of("rar")
