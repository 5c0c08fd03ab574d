"""Figures never put two clocks on one axis (gvq/report/plots.py), and each run's clock is named.  Every PNG
the report writes, opened as rendered (Agg, read back with imread) and as drawn (the figure objects, kept past
savefig): each setting in its palette colour (gvq.schema.palette.colour_of) in curves.png and frontier.png, the
same in two reports that hold it beside different company, a legend entry for every mark, the target line in
the panel's unit, a never-reached setting marked on the frontier."""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib
import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from gvq.report.__main__ import main
from gvq.report.frontier import NOT_REACHED
from gvq.report.plots import BAND_LABEL, TARGET_STYLE, breakdown, curve_columns, plot_curves, time_clock
from gvq.report.runs import Group, Run, clock_of
from gvq.schema.palette import colour_of


def _run(name: str, net: dict) -> Run:
    m = pd.DataFrame({"iteration": range(4), "wall_s": [0.1, 0.2, 0.3, 0.4], "train_loss": [2, 1.5, 1, 0.8],
                      "test_acc": [None, 0.5, None, 0.8], "compute_s": 0.05, "aggregate_s": 0.05})
    return Run(Path(name), "completed", "", "rar", [f"x={name}"], {"net": net}, m)


def test_clock_names_say_which_clock_and_scales():
    assert clock_of(_run("a", {"bandwidth_bps": 5e7})) == "wall-clock"
    virt = clock_of(_run("b", {"bandwidth_bps": 5e7, "clock": "virtual", "compute_scale": 1 / 6, "codec_scale": 1}))
    assert virt == "virtual time (compute ×0.167, codec ×1)"


def test_breakdown_and_time_axis_keep_to_one_clock(tmp_path):
    wall = Group("wall run", ("a",), [_run("a", {"bandwidth_bps": 5e7})])
    virt = Group("virtual run", ("b",), [_run("b", {"bandwidth_bps": 5e7, "clock": "virtual",
                                                    "compute_scale": 0.5, "codec_scale": 1})])
    groups = [virt, wall]
    assert time_clock(groups) == virt.clock
    table = breakdown(groups, lambda g: {"compute_s": 0.05, "aggregate_s": 0.05})
    assert list(table["group"]) == ["virtual run"] and set(table["clock"]) == {virt.clock}
    assert plot_curves(groups, tmp_path / "c.png", "test").stat().st_size > 1000


def test_breakdown_shows_hidden_and_exposed_communication_of_an_overlapped_run(tmp_path):
    from gvq.report.plots import plot_breakdown
    post = Group("rar", ("a",), [_run("a", {"bandwidth_bps": 5e7})])
    over = Group("rar overlapped", ("b",), [_run("b", {"bandwidth_bps": 5e7})])
    stats = {"rar": {"compute_s": 0.5, "aggregate_s": 0.4, "compress_s": 0.0, "wire_s": 0.3, "decompress_s": 0.0},
             # the codec and wire ran during backward: 0.35 s of communication, 0.1 s of it after backward
             "rar overlapped": {"compute_s": 0.5, "aggregate_s": 0.1, "compress_s": 0.0, "wire_s": 0.3,
                                "decompress_s": 0.0, "comm_s": 0.35, "exposed_s": 0.1}}
    table = breakdown([post, over], lambda g: stats[g.label]).drop(columns="clock").set_index("group")
    stack = ["compute_s", "compress_s", "wire_s", "decompress_s", "other_s", "exposed_s"]
    # every bar stacks to the iteration time, compute_s + aggregate_s
    assert table.loc["rar", stack].sum() == pytest.approx(0.9)
    assert table.loc["rar overlapped", stack].sum() == pytest.approx(0.6)
    assert table.loc["rar", "exposed_s"] == 0 and table.loc["rar", "wire_s"] == pytest.approx(0.3)
    assert table.loc["rar", "other_s"] == pytest.approx(0.1) and table.loc["rar", "hidden_s"] == 0
    assert table.loc["rar overlapped", "wire_s"] == 0                      # not stacked: it was hidden
    assert table.loc["rar overlapped", "exposed_s"] == pytest.approx(0.1)
    assert table.loc["rar overlapped", "hidden_s"] == pytest.approx(0.25)
    png = plot_breakdown(breakdown([post, over], lambda g: stats[g.label]), tmp_path / "b.png", "test")
    assert png.stat().st_size > 1000


def _kept_figure(monkeypatch):
    """Keep the figure a plotting function closes, to read its labels back."""
    import matplotlib.pyplot as plt
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    return plt


def _overlaps(ax) -> list[tuple[str, str]]:
    """Pairs of the axis' x tick labels that overlap on the drawn canvas."""
    renderer = ax.figure.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.get_xticklabels(minor=False) +
             ax.get_xticklabels(minor=True) if t.get_text() and t.get_visible()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_the_frontiers_tick_labels_do_not_overlap_over_a_narrow_span_of_bytes(tmp_path, monkeypatch):
    """Settings from 0.002 to 0.06 MB per iteration (under two decades): matplotlib labelled every minor
    tick of the log axis (2x10^-3, 3x10^-3, ...) and they ran into each other."""
    from gvq.report.frontier import plot_setting_frontier
    plt = _kept_figure(monkeypatch)
    mb = [0.00195, 0.0021, 0.0039, 0.0077, 0.0155, 0.0307, 0.0614]
    df = pd.DataFrame({"setting": [f"s{i}" for i in range(len(mb))], "MB_per_iter": mb, "variant": "post",
                       "setting_name": [f"qsgd bits={i}" for i in range(len(mb))],
                       "final_acc": [0.8, 0.84, 0.1, 0.86, 0.87, 0.88, 0.88], "final_acc_std": 0.01,
                       "iters_to_target": [120, 100, float("inf"), 100, 80, 60, 60], "iters_to_target_std": 5.0,
                       "reached": ["2/2"] * len(mb), "ranked": True, "all_at_chance": False,
                       "frontier_acc": True, "frontier_iters": True})
    plot_setting_frontier(df, tmp_path / "f.png", 0.8)
    fig = plt.gcf()
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert len(labels) >= 2 and _overlaps(ax) == [], labels
    plt.close("all")


def test_the_breakdowns_axis_says_per_iteration_whatever_the_runs_length(tmp_path, monkeypatch):
    """A 200-iteration sweep's bars were labelled "seconds per 500 iterations": the axis is per iteration."""
    from gvq.report.plots import plot_breakdown
    plt = _kept_figure(monkeypatch)
    run = Group("rar", ("a",), [_run("a", {"bandwidth_bps": 5e7})])
    table = breakdown([run], lambda g: {"compute_s": 0.05, "aggregate_s": 0.02, "wire_s": 0.015})
    assert table.loc[0, "compute_s"] == pytest.approx(0.05)                    # seconds per iteration
    plot_breakdown(table, tmp_path / "b.png", "test")
    ax = plt.gcf().axes[0]
    assert ax.get_ylabel().startswith("ms per iteration") and "500" not in ax.get_ylabel()
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    assert max(tops) == pytest.approx(70.0)                                    # 0.05 + 0.02 s, in ms
    plt.close("all")


def test_an_lms_curves_add_validation_bits_per_byte_with_seed_bands(tmp_path, monkeypatch):
    """Runs that logged ``test_bpb`` (a language model's) get a third row: validation bpb against iteration
    and the clock, mean ± std over seeds; a CNN's curves keep two rows."""
    plt = _kept_figure(monkeypatch)
    cnn = Group("rar", ("a",), [_run("a", {})])
    assert curve_columns([cnn]) == ["test_acc", "train_loss"]
    seeds = []
    for seed, bpb in enumerate((3.4, 3.6)):
        r = _run(f"lm{seed}", {})
        r.metrics["test_bpb"] = [None, bpb + 0.5, None, bpb]
        seeds.append(r)
    lm = Group("rar", ("b",), seeds)
    assert curve_columns([lm]) == ["test_acc", "train_loss", "test_bpb"]
    plot_curves([lm], tmp_path / "c.png", "test")
    axes = plt.gcf().axes
    assert len(axes) == 6 and axes[4].get_ylabel().startswith("validation bits per byte")
    assert axes[4].get_xlabel() == "iteration"
    line = axes[4].get_lines()[0]
    assert list(line.get_xdata()) == [1, 3] and list(line.get_ydata()) == pytest.approx([4.0, 3.5])   # the mean
    band = axes[4].collections[0].get_paths()[0].vertices[:, 1]                                     # ± std
    assert band.min() == pytest.approx(3.5 - np.std([3.4, 3.6], ddof=1))
    plt.close("all")


# -- every PNG as written: palette colours, legends, the target line ------------------------------------
BYTES_PER_TOKEN = 1.5       # the fabricated LM's text: bpb = loss / ln 2 / 1.5


def _run_dir(d: Path, agg: str, seed: int, sent: float, accs: dict[int, float], own=(), lm=False) -> None:
    """A finished run of ``agg`` with its ``aggregator.*`` overrides ``own``: 40 iterations sending ``sent``
    bytes each, evaluated every 10 (test accuracy ``accs``; ``lm``: validation loss 3 - acc and its bpb)."""
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({
        "status": "completed", "job_type": agg, "overrides": [f"aggregator={agg}", *own, f"seed={seed}"],
        "config": {"world_size": 2, "seed": seed, "aggregator": {}, "net": {"clock": "wall"}}}))
    head = "iteration,phase,compute_s,aggregate_s,bytes_sent,wall_s,train_loss,test_acc,test_loss,test_bpb"
    rows = [head]
    for i in range(40):
        acc = accs.get(i)
        ev = "," * 3 if acc is None else f",{acc},{3 - acc},{(3 - acc) / math.log(2) / BYTES_PER_TOKEN}"
        rows.append(f"{i},{agg},0.01,0.01,{sent},{0.02 * (i + 1)},{2.0 / (i + 1) + 0.1 * seed}{ev}")
    text = "\n".join(rows) + "\n"
    (d / "metrics.csv").write_text(text if lm else text.replace(",test_loss,test_bpb", ",x,y"))


def _sweep(root: Path, settings: dict, lm=False) -> Path:
    """``settings``: name -> (option, overrides, bytes, accuracy at 9/19/29/39); two seeds each."""
    for name, (agg, own, sent, accs) in settings.items():
        for seed in (0, 1):
            evals = {9 + 10 * k: a + 0.01 * seed for k, a in enumerate(accs)}
            _run_dir(root / f"{name}-{seed}", agg, seed, sent, evals, own, lm)
    return root


SETTINGS = {"rar": ("rar", (), 4000, (0.5, 0.7, 0.8, 0.9)),
            "q2": ("qsgd", ("aggregator.compressor.bits=2",), 300, (0.4, 0.6, 0.75, 0.85)),
            "sign": ("signsgd", (), 150, (0.2, 0.3, 0.3, 0.35))}          # never reaches 0.6


@pytest.fixture
def kept(monkeypatch):
    """The figures a report draws, kept open past savefig (plt.close does nothing), by their first title."""
    import matplotlib.pyplot as plt
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    yield lambda: {(_kind(plt.figure(n))): plt.figure(n) for n in plt.get_fignums()}
    matplotlib.pyplot.close("all")


def _kind(fig) -> str:
    if fig._suptitle is not None and fig._suptitle.get_text().startswith("Convergence"):
        return "curves"
    labels = {ax.get_xlabel() for ax in fig.axes}
    return "frontier" if "MB a rank sends per iteration" in labels else "other"


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array(matplotlib.colors.to_rgb(hex_colour))


def _pixels_of(png: Path, hex_colour: str, tol: float = 0.02) -> int:
    """How many pixels of the PNG as written are ``hex_colour`` (within ``tol`` per channel)."""
    img = mpimg.imread(png)[..., :3]
    return int((np.abs(img - _rgb(hex_colour)) <= tol).all(axis=-1).sum())


def _legend_texts(fig) -> list[str]:
    out = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    return out + [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def test_curves_draw_each_setting_in_its_palette_colour_and_the_accuracy_target(tmp_path, kept):
    root = _sweep(tmp_path / "s", SETTINGS)
    assert main([str(root), "target_acc=0.6"]) == 0
    fig = kept()["curves"]
    acc = fig.axes[0]
    colours = {line.get_label(): matplotlib.colors.to_hex(line.get_color()) for line in acc.get_lines()}
    assert colours["rar"] == colour_of("rar") and colours["signsgd"] == colour_of("signsgd")
    assert colours["qsgd bits=2"] == colour_of("qsgd bits=2")
    target = [ln for ln in acc.get_lines() if ln.get_label() == "target: test accuracy 0.6"]
    assert len(target) == 1 and list(target[0].get_ydata()) == [0.6, 0.6]
    assert matplotlib.colors.to_hex(target[0].get_color()) == TARGET_STYLE["color"]
    assert {"rar", "qsgd bits=2", "signsgd", "target: test accuracy 0.6", BAND_LABEL} <= set(_legend_texts(fig))
    png = root / "report" / "curves.png"
    for hex_colour in (colour_of("rar"), colour_of("qsgd bits=2"), colour_of("signsgd"), TARGET_STYLE["color"]):
        assert _pixels_of(png, hex_colour) > 20, hex_colour            # drawn in that colour, as written


def test_a_loss_target_is_drawn_on_the_bits_per_byte_panel_in_bits_per_byte(tmp_path, kept):
    """The target is validation loss in nats per token, the panel validation bits per byte: the line sits at
    the runs' own conversion (loss / ln 2 / bytes per token), with its legend entry; the accuracy panel
    gets no loss line."""
    root = _sweep(tmp_path / "lm", SETTINGS, lm=True)
    assert main([str(root), "target_loss=2.4"]) == 0
    fig = kept()["curves"]
    bpb = fig.axes[4]
    assert bpb.get_ylabel().startswith("validation bits per byte")
    want = 2.4 / math.log(2) / BYTES_PER_TOKEN
    target = [ln for ln in bpb.get_lines() if ln.get_label().startswith("target: validation loss 2.4")]
    assert len(target) == 1 and target[0].get_ydata()[0] == pytest.approx(want, rel=1e-9)
    assert f"= {want:.3g} bpb" in target[0].get_label()
    assert target[0].get_label() in _legend_texts(fig)
    assert not [ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("target")]
    assert _pixels_of(root / "report" / "curves.png", TARGET_STYLE["color"]) > 20


def test_the_frontier_colours_each_setting_and_marks_one_that_never_reached(tmp_path, kept):
    root = _sweep(tmp_path / "f", SETTINGS)
    assert main(["frontier", str(root), "target_acc=0.6", "--out", str(tmp_path / "out")]) == 0
    fig = kept()["frontier"]
    iters = fig.axes[1]
    never = [ln for ln in iters.get_lines() if ln.get_marker() == "^" and len(ln.get_xdata())]
    assert len(never) == 1 and never[0].get_xdata()[0] == pytest.approx(150 / 1e6)       # signsgd's bytes
    assert matplotlib.colors.to_hex(never[0].get_color()) == colour_of("signsgd")
    assert "signsgd: not reached" in [t.get_text() for t in iters.texts]
    texts = _legend_texts(fig)
    assert NOT_REACHED in texts and {"rar", "qsgd bits=2", "signsgd"} <= set(texts)
    assert {"on the frontier", "frontier (joined)"} <= set(texts)
    points = {matplotlib.colors.to_hex(c.lines[0].get_color()) for c in fig.axes[0].containers}
    assert points == {colour_of("rar"), colour_of("qsgd bits=2"), colour_of("signsgd")}
    png = tmp_path / "out" / "frontier.png"
    for name in ("rar", "qsgd bits=2", "signsgd"):
        assert _pixels_of(png, colour_of(name)) > 20, name


def test_a_settings_colour_does_not_change_with_the_company_it_keeps(tmp_path, kept):
    """qsgd bits=2 beside rar and signsgd, and alone beside one other qsgd: one colour in both reports."""
    first = _sweep(tmp_path / "a", SETTINGS)
    second = _sweep(tmp_path / "b", {"q4": ("qsgd", ("aggregator.compressor.bits=4",), 600, (0.5, 0.6, 0.7, 0.8)),
                                     "q2": SETTINGS["q2"]})
    seen = []
    for root in (first, second):
        assert main([str(root), "target_acc=0.6"]) == 0
        lines = kept()["curves"].axes[0].get_lines()
        seen.append({ln.get_label(): matplotlib.colors.to_hex(ln.get_color()) for ln in lines})
        matplotlib.pyplot.close("all")
    # the second report's groups are labelled by their whole names: qsgd bits=2, and qsgd (bits=4, its default)
    assert seen[0]["qsgd bits=2"] == seen[1]["qsgd bits=2"] == colour_of("qsgd bits=2")
    assert seen[1]["qsgd"] == colour_of("qsgd") != seen[1]["qsgd bits=2"]
