"""Bitwise resume for every ``conf/aggregator/`` option: a run that checkpoints part-way and the same run
resumed from that checkpoint write identical metrics (times aside).  The checkpoint lands where each
aggregator holds state (GradiVeQ: mid-sampling with samples kept, after a refresh; PowerSGD: its error
memory and warm-started Q; quantizers: the dither generator and bank), so a state piece missing from a
``state_dict`` changes the resumed rows."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.cli import ROOT, cli

AGGREGATORS = sorted(p.stem for p in (ROOT / "conf" / "aggregator").glob("*.yaml"))
TIMES = ["compute_s", "aggregate_s", "compress_s", "decompress_s", "wire_s", "wall_s", "real_wall_s",
         "fit_s", "monitor_s", "ddp_comm_s", "ddp_wait_s"]
# 16 iterations, resumed at 11: GradiVeQ warms up 2, samples 3 (2-4), refreshes, compresses 4 (5-8) and
# samples again from 9, so the checkpoint holds a fitted basis and two samples; PowerSGD (ours and DDP's
# hook) compresses from iteration 3.
COMMON = ["logger=csv", "logger.progress=false", "model.width=4", "iterations=16", "eval_every=8",
          "world_size=2", "batch_size=16", "warmup=2", "L_t=3", "L_c=4", "checkpoint.every=11"]
EXTRA = {"powersgd": ["aggregator.start_iter=3"], "ddp_powersgd": ["aggregator.start_iter=3"]}


def _metrics(run: Path) -> pd.DataFrame:
    df = pd.read_csv(run / "metrics.csv")
    return df.drop(columns=[c for c in TIMES if c in df])


@pytest.mark.slow
@pytest.mark.parametrize("name", AGGREGATORS)
def test_resume_is_bitwise(tmp_path, name):
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    args = [*COMMON, f"aggregator={name}", *EXTRA.get(name, [])]
    r = cli(*args, f"hydra.run.dir={run}", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((run / "checkpoint" / "latest.json").read_text())["iteration"] == 11
    r = cli(*args, f"resume={run}", f"hydra.run.dir={resumed}", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = _metrics(run), _metrics(resumed)
    assert list(b.iteration) == list(range(16))
    pd.testing.assert_frame_equal(a, b)
    if name.startswith("gradiveq"):                  # the checkpoint really sat inside GradiVeQ's state
        assert list(a.phase[4:12]) == ["sample"] + ["compress"] * 4 + ["sample"] * 3
