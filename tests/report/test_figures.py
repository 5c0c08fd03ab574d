"""Every PNG the report writes, opened as rendered (matplotlib's Agg, read back with imread) and as drawn
(the figure objects, kept past savefig): each setting in its palette colour (gvq.schema.palette.colour_of) in
curves.png and frontier.png, the same in two reports that hold it beside different company, a legend entry
for every mark, the target line in the panel's unit, a never-reached setting marked on the frontier."""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib
import matplotlib.image as mpimg
import numpy as np
import pytest

from gvq.report.__main__ import main
from gvq.report.frontier import NOT_REACHED
from gvq.report.plots import BAND_LABEL, TARGET_STYLE
from gvq.schema.palette import colour_of

BYTES_PER_TOKEN = 1.5       # the fabricated LM's text: bpb = loss / ln 2 / 1.5


def _run(d: Path, agg: str, seed: int, sent: float, accs: dict[int, float], own=(), lm=False) -> None:
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
            _run(root / f"{name}-{seed}", agg, seed, sent, evals, own, lm)
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
    # the second report's groups are labelled by what differs: bits=2 and bits=4
    assert seen[0]["qsgd bits=2"] == seen[1]["bits=2"] == colour_of("qsgd bits=2")
    assert seen[1]["bits=4"] == colour_of("qsgd bits=4") != seen[1]["bits=2"]
