"""Checkpoint / resume: an interrupted-and-resumed run equals an uninterrupted one (times aside);
and same seed + same config => identical metrics (determinism).  Runs go through the launcher's entry
function in-process (``tests.helpers.launch``); refusals (one line, exit 2) through the CLI's ``main``
in-process (``cli_in_process``); kills through the CLI as a process."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.helpers.cli import ROOT, TEST_CONF, cli_in_process
from tests.helpers.launch import launch_job

TIME_COLS = ["compute_s", "aggregate_s", "compress_s", "decompress_s", "wire_s", "wall_s", "real_wall_s"]
COMMON = ["logger=csv", "iterations=24", "eval_every=6", "world_size=2", "batch_size=16",
          f"hydra.searchpath=[file://{TEST_CONF}]"]


def _newest(run: Path) -> Path:
    from gvq.run import checkpoint
    return checkpoint.newest(str(run))[0]


def _metrics(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "metrics.csv").drop(columns=TIME_COLS)


@pytest.mark.parametrize("split", ["pooled", "by_label"])    # by_label: each rank its own digits' classes
def test_interrupted_and_resumed_run_equals_uninterrupted(tmp_path, split):
    full, broken, resumed = tmp_path / "full", tmp_path / "broken", tmp_path / "resumed"
    common = [*COMMON, f"dataset.split={split}"]
    code, sa = launch_job(full, *common, "aggregator=qsgd")
    assert code == 0, sa
    code, _ = launch_job(broken, *common, "aggregator=qsgd_dies", "checkpoint.every=5")
    assert code != 0                                           # rank 1 died at iteration 13
    assert json.loads((broken / "checkpoint" / "latest.json").read_text())["iteration"] == 10
    code, sb = launch_job(resumed, *common, "aggregator=qsgd", f"resume={broken}")
    assert code == 0, sb
    a, b = _metrics(full), _metrics(resumed)
    assert list(b.iteration) == list(range(24))
    pd.testing.assert_frame_equal(a, b)                        # bitwise, as written (same ranks, threads)
    assert sa["final_test_acc"] == sb["final_test_acc"] and sb["replicas_identical"]


@pytest.mark.slow
def test_same_seed_same_config_gives_identical_metrics(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        code, summary = launch_job(run, *COMMON, "aggregator=terngrad")
        assert code == 0, summary
    pd.testing.assert_frame_equal(_metrics(runs[0]), _metrics(runs[1]))


@pytest.mark.slow
def test_resume_without_checkpoint_is_a_config_error(tmp_path):
    r = cli_in_process(*COMMON, f"resume={tmp_path}", f"hydra.run.dir={tmp_path}/x")
    assert r.returncode == 2 and "resume=" in r.stderr and "Traceback" not in r.stderr


class _RunsCode:
    """A pickle that would run a command when loaded (what a hostile shared checkpoint could hold)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    from gvq.run import checkpoint
    folder, marker = checkpoint.set_dir(tmp_path, 5), tmp_path / "pwned"
    folder.mkdir(parents=True)
    (folder / "complete.json").write_text(json.dumps({"iteration": 5, "world_size": 1}))
    torch.save({"iteration": 5, "model": _RunsCode(marker)}, folder / "rank0.pt")
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.load(str(tmp_path), 0, 1)
    assert not marker.exists()


@pytest.fixture(scope="module")
def rar_checkpoint(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("ckpt") / "rar"
    code, summary = launch_job(run, *COMMON, "aggregator=rar", "iterations=8", "checkpoint.every=4")
    assert code == 0, summary
    return run


def _refused(r, new: Path, *needles: str) -> None:
    """One line on stderr naming what differs, no traceback, and nothing of ours in the new run dir."""
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gvq:")]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert all(n in lines[0] for n in needles), lines[0]
    made = {p.name for p in new.iterdir()} if new.exists() else set()
    assert made <= {".hydra", "cli.log"}, made                     # Hydra's own files only


@pytest.mark.slow
@pytest.mark.parametrize("override, needles", [
    ("aggregator=gradiveq", ("aggregator=rar", "aggregator=gradiveq")),
    ("aggregator=qsgd", ("aggregator=rar", "aggregator=qsgd")),
    ("model.width=8", ("model=", '"width": 8')),
    ("world_size=3", ("world_size=2", "world_size=3")),
    ("dataset.split=by_label", ("dataset=", '"split": "by_label"')),
])
def test_resuming_another_runs_checkpoint_is_refused_in_one_line(rar_checkpoint, tmp_path, override, needles):
    new = tmp_path / "new"
    r = cli_in_process(*COMMON, "aggregator=rar", override, f"resume={rar_checkpoint}", f"hydra.run.dir={new}")
    _refused(r, new, f"resume={rar_checkpoint}", *needles)


@pytest.mark.slow
def test_a_truncated_rank_file_is_refused_naming_it(rar_checkpoint, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(rar_checkpoint, copy)
    rank1 = _newest(copy) / "rank1.pt"
    rank1.write_bytes(rank1.read_bytes()[: rank1.stat().st_size // 2])
    new = tmp_path / "new"
    r = cli_in_process(*COMMON, "aggregator=rar", f"resume={copy}", f"hydra.run.dir={new}")
    _refused(r, new, str(rank1), "unreadable or not a gvq checkpoint")


@pytest.mark.slow
def test_a_foreign_marker_is_refused(rar_checkpoint, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(rar_checkpoint, copy)
    (_newest(copy) / "complete.json").write_text(json.dumps({"iteration": 4, "world_size": 2}))
    new = tmp_path / "new"
    r = cli_in_process(*COMMON, "aggregator=rar", f"resume={copy}", f"hydra.run.dir={new}")
    _refused(r, new, "complete.json is not a gvq checkpoint record")


def test_the_same_run_resumes_past_the_identity_check(rar_checkpoint, tmp_path):
    code, summary = launch_job(tmp_path / "r", *COMMON, "aggregator=rar", "iterations=8", f"resume={rar_checkpoint}")
    assert code == 0, summary
    meta = json.loads((rar_checkpoint / "checkpoint" / "latest.json").read_text())
    assert meta["identity"]["aggregator"] == "rar" and meta["identity"]["gvq_version"]


def test_a_pooled_runs_identity_is_the_one_written_before_dataset_split_existed():
    """Checkpoints from before dataset.split (pooled, unnamed) resume: pooled is left out of the identity."""
    from gvq.run.checkpoint import identity
    from gvq.schema.options import LabelSplit
    before = {"_target_": "gvq.data.digits", "seed": 0, "test_fraction": 0.2}
    def ident(dataset):
        return identity({"model": {}, "optim": {}, "method": {}, "dataset": dataset}, "rar", 10, 1, 2)
    assert ident({**before, "split": LabelSplit.pooled}) == ident({**before, "split": "pooled"}) == ident(before)
    assert ident({**before, "split": LabelSplit.by_label})["dataset"] != ident(before)["dataset"]


def _strip_method(run: Path) -> None:
    """Make ``run``'s newest set look written before methods existed: no method in its identity or state."""
    folder = _newest(run)
    for name in ("complete.json", "../latest.json"):
        meta = json.loads((folder / name).read_text())
        del meta["identity"]["method"]
        (folder / name).write_text(json.dumps(meta))
    for path in folder.glob("rank*.pt"):
        state = torch.load(path, weights_only=True)
        del state["identity"]["method"], state["method"]
        torch.save(state, path)


@pytest.mark.slow
def test_a_checkpoint_from_before_methods_resumes_as_every_step_only(rar_checkpoint, tmp_path):
    """A set without the method in its identity was written by every_step: it resumes as that, and a run of
    another method is refused in one line naming it."""
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(rar_checkpoint, copy)
    _strip_method(copy)
    code, summary = launch_job(tmp_path / "r", *COMMON, "aggregator=rar", "iterations=8", f"resume={copy}")
    assert code == 0, summary
    new = tmp_path / "new"
    r = cli_in_process(*COMMON, "aggregator=rar", "method=diloco", f"resume={copy}", f"hydra.run.dir={new}")
    _refused(r, new, f"resume={copy}", "EveryStep", "method=", "DiLoCo")


# Bitwise resume for every conf/aggregator option, post-backward and overlapped, is a contract of
# tests/aggregators/test_every_aggregator.py (test_resume_is_bitwise): one group of ranks runs them all.


# -- atomic checkpoint sets ----------------------------------------------------------------------------
def test_sets_are_published_whole_and_only_the_newest_kept(tmp_path):
    from gvq.run import checkpoint
    run = tmp_path / "run"
    code, summary = launch_job(run, *COMMON, "aggregator=rar", "iterations=9", "checkpoint.every=2",
                               "checkpoint.keep=2")
    assert code == 0, summary
    sets = checkpoint.complete_sets(run / "checkpoint")
    assert [p.name for p in sets] == ["iter-000000006", "iter-000000008"]      # 2 and 4 pruned
    assert all({f.name for f in p.iterdir()} == {"rank0.pt", "rank1.pt", "complete.json"} for p in sets)
    assert json.loads((run / "checkpoint" / "latest.json").read_text())["set"] == "iter-000000008"


def test_an_unfinished_newer_set_is_never_resumed(rar_checkpoint, tmp_path):
    """What a kill mid-write leaves: a newer set with some rank files, one torn, and no complete.json."""
    import shutil

    from gvq.run import checkpoint
    copy = tmp_path / "copy"
    shutil.copytree(rar_checkpoint, copy)
    good, meta = checkpoint.newest(str(copy))
    torn = checkpoint.set_dir(copy, 99)
    torn.mkdir()
    (torn / "rank0.pt").write_bytes((good / "rank0.pt").read_bytes()[:100])
    assert checkpoint.newest(str(copy))[0] == good
    checkpoint.check_resume(str(copy), meta["identity"])
    assert checkpoint.load(str(copy), 1, 2)["iteration"] == meta["iteration"]
    shutil.rmtree(good)                                         # only the unfinished set left
    with pytest.raises(checkpoint.ResumeError, match="no complete checkpoint set .*only unfinished sets"):
        checkpoint.newest(str(copy))


#: kills per run of the test: each costs a CLI start-up; an instant the write does not survive fails at any
#: attempt, so more attempts only raise the chance of catching a rare window
ATTEMPTS = 3


@pytest.mark.slow
def test_a_kill_at_any_instant_of_a_write_leaves_a_resumable_checkpoint(tmp_path):
    """The whole process group SIGKILLed at random instants of a run that checkpoints every iteration
    (so most instants fall inside a write): every time, the newest complete set loads on every rank."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from gvq.run import checkpoint
    rng, mid_write = random.Random(0), 0
    for attempt in range(ATTEMPTS):
        run = tmp_path / f"run{attempt}"
        p = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), *COMMON, "iterations=100000", "checkpoint.every=1",
                              "logger.progress=false", f"hydra.run.dir={run}"], cwd=ROOT,
                             env=dict(os.environ, WANDB_MODE="disabled"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while len(checkpoint.complete_sets(run / "checkpoint")) < 2:
                assert time.monotonic() < deadline and p.poll() is None
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.5))
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        folder, meta = checkpoint.newest(str(run))
        mid_write += any(d.name > folder.name for d in (run / "checkpoint").glob("iter-*"))
        checkpoint.check_resume(str(run), meta["identity"])
        assert [checkpoint.load(str(run), r, 2)["iteration"] for r in (0, 1)] == [meta["iteration"]] * 2
    print(f"kills that landed inside a write (an unfinished newer set present): {mid_write} of {ATTEMPTS}")
