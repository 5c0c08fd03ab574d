"""Run discovery and grouping (gvq/report/runs.py): knobs a run's aggregator did not read do not split
its group, on a real sweep through the CLI."""
from __future__ import annotations

import json

import pytest

from gvq.report.runs import find_runs, group_runs, load_run
from tests.helpers.cli import cli


pytestmark = pytest.mark.slow          # every test here starts processes (make test-fast skips them)

def test_sweep_crossing_a_gradiveq_knob_with_rar_gives_one_rar_group(tmp_path):
    sweep = tmp_path / "sweep"
    r = cli("-m", "aggregator=rar,gradiveq", "lambda=0.01,0.05", "iterations=6", "eval_every=6",
            "model.width=4", "warmup=1", "L_t=2", "L_c=2", "logger=csv", "logger.progress=false",
            f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr[-3000:]
    warnings = [ln for ln in r.stderr.splitlines() if "warning" in ln and "lambda" in ln]
    assert len(warnings) == 2 and all("aggregator=rar does not read lambda=" in w for w in warnings), r.stderr
    summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]
    rar_inert = ("lambda", "L_t", "L_c", "warmup")                     # set for gradiveq, unread by rar
    assert sorted(tuple(s["inert_knobs"]) for s in summaries) == [(), (), rar_inert, rar_inert]
    groups = group_runs([load_run(p) for p in find_runs([sweep])])
    by_agg = {}
    for g in groups:
        by_agg.setdefault(g.aggregator, []).append(g)
    assert [len(g.runs) for g in by_agg["rar"]] == [2]                 # lambda does not split rar
    labels = sorted(g.label for g in by_agg["gradiveq"])               # gradiveq reads lambda: two groups
    assert len(labels) == 2 and "lambda=0.01" in labels[0] and "lambda=0.05" in labels[1], labels
    assert "lambda" not in by_agg["rar"][0].label


def test_wandbs_setting_groups_runs_as_the_report_does(tmp_path):
    """One setting per group, in wandb (``setting`` in each run's config, gvq.run.logs) as in the report
    and its frontier: seeds and logging knobs together, settings of one family apart."""
    from gvq.report.runs import Run
    from gvq.run.logs import setting_of
    sweep = [["aggregator=qsgd", f"aggregator.compressor.bits={b}", "world_size=4", f"seed={s}",
              "logger.progress=false"] for b in (2, 4) for s in (0, 1)]
    sweep += [["aggregator=signsgd", f"aggregator._target_={t}", "world_size=4", f"seed={s}"]
              for t in ("a.CompressedAggregator", "a.ErrorFeedbackAggregator") for s in (0, 1)]
    runs = [Run(tmp_path / str(i), "completed", "", o[0].split("=")[1], o, {}, None) for i, o in enumerate(sweep)]
    by_report = {id(r): g.label for g in group_runs(runs) for r in g.runs}
    pairs = {(by_report[id(r)], setting_of(r.overrides)) for r in runs}
    assert len(pairs) == 4 == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


@pytest.mark.parametrize("files, name", [
    ({".hydra/overrides.yaml": "- aggregator=qsgd\n- seed=1\n"}, "qsgd"),
    ({".hydra/config.yaml": "aggregator:\n  _target_: gvq.aggregators.powersgd.PowerSGDAggregator\n"},
     "PowerSGDAggregator"),
    ({".hydra/hydra.yaml": "hydra:\n  runtime:\n    choices:\n      aggregator: fp16\n",
      ".hydra/overrides.yaml": "- aggregator=qsgd\n"}, "fp16"),
])
def test_a_run_without_a_summary_is_named_from_what_hydra_left(tmp_path, files, name):
    """A run killed before its summary: its aggregator is Hydra's recorded choice, else the override that
    chose it, else its config's ``_target_``; it is reported incomplete, with what it logged."""
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "metrics.csv").write_text("iteration,wall_s\n0,0.5\n1,0.9\n2,1.")
    run = load_run(tmp_path)
    assert run.aggregator == name and run.status == "incomplete" and len(run.metrics) == 3


def test_a_groups_label_carries_every_value_off_the_options_defaults(tmp_path):
    """A report of only ``powersgd rank=6`` runs labels them ``powersgd rank=6``, never ``powersgd``
    (an override every group shares still names the setting); a run that restated a default
    (``bits=4``, qsgd's own) groups with the plain option under its name; overlapped runs stay apart."""
    from gvq.report.runs import Run

    def runs(option, *extra, seeds=(0, 1), overlap=False):
        return [Run(tmp_path / f"{option}{extra}{s}{overlap}", "completed", "", option,
                    [f"aggregator={option}", *extra, f"seed={s}"], {"aggregator": {"overlap": overlap}}, None)
                for s in seeds]
    alone = group_runs(runs("powersgd", "aggregator.rank=6"))
    assert [(g.label, len(g.runs)) for g in alone] == [("powersgd rank=6", 2)]
    mixed = group_runs(runs("qsgd", "aggregator.compressor.bits=4", seeds=(0,)) + runs("qsgd", seeds=(1,))
                       + runs("qsgd", "aggregator.overlap=true", overlap=True))
    assert sorted((g.label, len(g.runs)) for g in mixed) == [("qsgd", 2), ("qsgd overlap=true", 2)]
    assert {r.setting for g in mixed for r in g.runs} == {"qsgd"}


def test_a_method_other_than_every_step_is_in_the_label_even_when_every_run_shares_it(tmp_path):
    """A report of DiLoCo runs alone says DiLoCo (and its period); beside every-step runs of the same
    aggregator they are two groups, coloured apart; tta refuses to price them at the bench's every-step
    seconds."""
    from gvq.report.runs import Run
    from gvq.report.tta import ReportError, check_setting

    def run(i, *extra):
        return Run(tmp_path / str(i), "completed", "", "rar", ["aggregator=rar", *extra, f"seed={i}"],
                   {"batch_size": 16}, None)
    diloco = [run(i, "method=diloco", "method.every=10") for i in (0, 1)]
    assert [g.label for g in group_runs(diloco)] == ["rar diloco every=10"]
    both = group_runs(diloco + [run(2), run(3, "method=every_step"), run(5, "method=diloco", "method.every=30"),
                                run(6, "method=diloco")])          # every=30 is diloco's default: no knob named
    assert sorted((g.label, len(g.runs)) for g in both) == [("rar", 2), ("rar diloco", 2), ("rar diloco every=10", 2)]
    with pytest.raises(ReportError, match="method=diloco"):
        check_setting(diloco, {"batch_per_rank": 16, "set": []})
    check_setting([run(4)], {"batch_per_rank": 16, "set": []})
