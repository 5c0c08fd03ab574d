"""Every ``conf/aggregator/`` option trains into its compressed phase at world_size 1 and 3, and rar,
qsgd, gradiveq and powersgd at 5: the configs composed as the CLI composes them, each run through the
real training loop (``gvq.run.train.train``) on gloo ranks; one spawn per world size, the options run
one after another in it (a spawn per option would cost ~4 s of imports each)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from tests.helpers.dist import run_ranks

pytestmark = pytest.mark.slow          # every test here starts processes (make test-fast skips them)

ALL = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "aggregator").glob("*.yaml"))
AT_FIVE = ("rar", "qsgd", "gradiveq", "powersgd")
ITERS = 8
#: warm-ups short enough that every compressor works within ITERS: GradiVeQ samples iterations 1-3,
#: fits, compresses 4-6; PowerSGD compresses from iteration 2
SHORT = ["iterations=8", "eval_every=8", "logger=csv", "batch_size=16", "warmup=1", "L_t=3", "L_c=3"]
WARMUP_PHASES = {"warmup", "sample", "allreduce", "skipped"}
UNCOMPRESSED = {"rar", "ddp"}                   # nothing to warm up: every row is the plain sum


def _configs(compose_cfg, names, world, tmp_path) -> list[tuple[str, dict, dict]]:
    out = []
    for name in names:
        cfg = compose_cfg(f"aggregator={name}", f"world_size={world}", *SHORT)
        if "start_iter" in cfg.aggregator:
            cfg.aggregator.start_iter = 2
        run_dir = tmp_path / name
        run_dir.mkdir()
        meta = {"run_dir": str(run_dir), "group": None, "name": name, "job_type": name,
                "overrides": [f"aggregator={name}", *SHORT], "inert_knobs": []}
        out.append((name, OmegaConf.to_container(cfg, resolve=True), meta))
    return out


def _train_each(rank, world, configs):
    from gvq.run.train import train
    done = {}
    for name, cfg, meta in configs:
        train(cfg, rank, world, meta["run_dir"], meta)
        done[name] = True
    return done


@pytest.mark.parametrize("world,names", [(1, ALL), (3, ALL), (5, AT_FIVE)],
                         ids=["1-rank", "3-ranks", "5-ranks"])
def test_every_aggregator_completes_its_compressed_phase(compose_cfg, tmp_path, world, names):
    configs = _configs(compose_cfg, names, world, tmp_path)
    results = run_ranks(_train_each, world, tmp_path, configs, timeout=600.0)
    assert all(r == {n: True for n in names} for r in results)
    for name in names:
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["status"] == "completed", (name, summary.get("error"))
        assert summary["config"]["world_size"] == world
        df = pd.read_csv(tmp_path / name / "metrics.csv")
        assert list(df.iteration) == list(range(ITERS)), name
        assert df.train_loss.notna().all(), name
        if name in UNCOMPRESSED:
            continue
        compressed, warm = df[~df.phase.isin(WARMUP_PHASES)], df[df.phase.isin(WARMUP_PHASES)]
        assert len(compressed) > 0, (name, list(df.phase))
        if world > 1 and len(warm):                             # and it sends fewer bytes than the warm-up
            assert compressed.bytes_sent.max() < warm.bytes_sent.max(), name
