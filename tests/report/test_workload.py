"""gvq/report/workload.py: ``--tta`` prices runs only at a bench of their own workload.  Before it, CNN runs on
Fashion-MNIST (resnet20, 1x28x28) were priced at a bench of ``gvq.bench overlap``'s own defaults (resnet32,
3x32x32) without a word; now that is refused in one line naming both and the command to re-run."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gvq.report import workload
from gvq.report.__main__ import main
from gvq.report.runs import ReportError, load_run

SETTING = {"model": "resnet20", "input_shape": [1, 28, 28], "batch_per_rank": 16, "num_classes": 10, "set": [],
           "defaults": {}, "iters": 3, "warmup": 1, "codec_scale": 1.0, "clock": "virtual"}
#: ``gvq.bench overlap``'s own defaults: what a bench run without workload flags measures
BENCH_DEFAULTS = {**SETTING, "model": "resnet32", "input_shape": [3, 32, 32]}


def _bench(path: Path, setting: dict) -> Path:
    modes = [{"N": 4, "compute_scale": 1.0, "link_Mbps": 200.0, "aggregator": a, "setting": a, "variant": v,
              "iter_s": 0.1} for a in ("rar", "fp16") for v in ("post", "overlap")]
    path.write_text(json.dumps({"setting": setting, "modes": modes, "cells": []}))
    return path


def _run(root: Path, name: str, agg: str, model: dict, dataset: dict, classes: int = 10) -> Path:
    """A finished run as ``cli.py`` writes it: its resolved config and the identity of its checkpoints."""
    d = root / name
    d.mkdir(parents=True)
    config = {"world_size": 4, "seed": 0, "batch_size": 16, "aggregator": {"overlap": False},
              "net": {"clock": "wall"}, "model": model, "dataset": dataset}
    (d / "summary.json").write_text(json.dumps({
        "status": "completed", "config": config, "job_type": agg, "overrides": [f"aggregator={agg}", "seed=0"],
        "identity": {"num_classes": classes, "in_channels": 1}}))
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["iteration", "phase", "compute_s", "aggregate_s", "wall_s", "test_acc"])
        for i in range(10):
            w.writerow([i, agg, 0.01, 0.01, i, 0.85 if i == 9 else ""])
    return d


RESNET20 = {"_target_": "gvq.models.resnet20"}
FMNIST = {"_target_": "gvq.data.fashion_mnist", "root": None, "n_train": 6000, "n_test": None, "seed": 0}


def test_a_bench_of_another_workload_is_refused_in_one_line_naming_both_and_the_command(tmp_path, capsys):
    runs = tmp_path / "sweep"
    for agg in ("rar", "fp16"):
        _run(runs, agg, agg, RESNET20, FMNIST)
    wrong = _bench(tmp_path / "defaults.json", BENCH_DEFAULTS)
    assert main(["tta", str(runs), "--bench", str(wrong), "target_acc=0.8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"bench {wrong} is model=resnet32 input 3x32x32 10 classes" in err[0]
    assert "the runs are model=resnet20 on fashion_mnist input 1x28x28 10 classes" in err[0]
    assert "differs in model, input_shape" in err[0]
    command = "python -m gvq.bench overlap model=resnet20 input_shape=[1,28,28] num_classes=10 batch_size=16"
    assert command in err[0]
    assert not (runs / "report" / "tta.md").exists()
    # the bench of the runs' own workload prices them
    right = _bench(tmp_path / "own.json", SETTING)
    assert main(["tta", str(runs), "--bench", str(right), "target_acc=0.8"]) == 0
    assert (runs / "report" / "tta.md").is_file()


def test_each_part_of_the_workload_is_compared_where_the_run_records_it(tmp_path):
    cnn = load_run(_run(tmp_path, "cnn", "rar", {"_target_": "gvq.models.DigitsCNN", "width": 32},
                        {"_target_": "gvq.data.digits", "test_fraction": 0.2, "seed": 0}))
    assert workload.run_workload(cnn) == {"model": "cnn model.width=32", "dataset": "digits",
                                          "input_shape": (1, 8, 8), "num_classes": 10}
    assert workload.differences(workload.run_workload(cnn), {**SETTING, "model": "cnn", "input_shape": [1, 8, 8]}) \
        == ["model"]                                            # the bench's cnn is width 16
    synthetic = load_run(_run(tmp_path, "syn", "rar", RESNET20, {"_target_": "gvq.data.synthetic", "num_classes": 100,
                                                                 "image_size": 16, "channels": 3}, classes=100))
    assert workload.run_workload(synthetic)["input_shape"] == (3, 16, 16)
    with pytest.raises(ReportError, match=r"differs in input_shape, num_classes\)"):
        workload.check_bench([synthetic], SETTING, "b.json")
    # a language model's inputs are token windows: its model and vocabulary are compared, not an image shape
    gpt = load_run(_run(tmp_path, "gpt", "rar", {"_target_": "gvq.models.GPT", "layers": 4, "heads": 4, "width": 128,
                                                 "context": 64}, {"_target_": "gvq.data.austen"}, classes=256))
    assert workload.run_workload(gpt) == {"model": "gpt_tiny", "dataset": "austen", "num_classes": 256}
    workload.check_bench([gpt], {**SETTING, "model": "gpt_tiny", "num_classes": 256}, "b.json")
    with pytest.raises(ReportError, match=r"model=gpt_tiny on austen 256 classes .*differs in model\)"):
        workload.check_bench([gpt], {**SETTING, "model": "gpt_small", "num_classes": 256}, "b.json")
    small = load_run(_run(tmp_path, "gpt6", "rar", {"_target_": "gvq.models.GPT", "layers": 6, "heads": 6,
                                                    "width": 384, "context": 256}, {"_target_": "gvq.data.austen"}))
    assert workload.run_workload(small)["model"] == "gpt_small"    # its file builds on gpt_tiny's
    # a run that records no model or data set (an older one) is not refused for what it does not say
    bare = load_run(_run(tmp_path, "bare", "rar", {}, {}))
    bare.summary.pop("identity")
    workload.check_bench([bare], BENCH_DEFAULTS, "b.json")
