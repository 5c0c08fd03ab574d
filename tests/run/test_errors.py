"""Bad command lines, tried as a new user would (gvq/run/errors.py and the launcher's preflight): each
exits non-zero with exactly one line on stderr naming the offending key, option or file, no traceback,
no process left behind and nothing under runs/.

Every invocation runs once, in a module fixture, through cli.py's ``main`` in this process (the exit
status and the lines it prints are the CLI's own: ``tests.helpers.cli.cli_in_process``); each case is then
its own test.  One case of each kind (Hydra's composition, a range checked in code, the preflight's data
and checkpoint checks) also runs as ``python cli.py``, a few at a time, where what the process does is
checked: its status, its stderr, and no process of its left behind."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT, cli_in_process

# (arguments, what the one line must contain); {empty}, {garbage}, {partial} are made by the fixture
CASES = [
    # Hydra composition: unknown keys (with the closest match), unknown options, ill-typed values
    ("foo=1", "foo: unknown key"),
    ("+foo=1", "foo: unknown key"),
    ("wrld_size=2", "did you mean world_size"),
    ("optim.lrr=3", "did you mean optim.lr"),
    ("checkpoint.evry=1", "did you mean checkpoint.every"),
    ("logger.wandb.mod=x", "did you mean logger.wandb.mode"),
    ("net.clok=virtual", "did you mean net.clock"),
    ("aggregator=qsdg", "did you mean aggregator=qsgd"),
    ("model=resnet3", "model=resnet3: no such option"),
    ("dataset=cifar", "dataset=cifar: no such option"),
    ("optim=adam", "optim=adam: no such option"),
    ("net=10gbit", "net=10gbit: no such option"),
    ("logger=tensorboard", "logger=tensorboard: no such option"),
    ("experiment=nope", "experiment=nope: no such option"),
    ("hydra/launcher=nope", "hydra/launcher=nope: no such option"),
    ("world_size=abc", "world_size=abc: expected integer"),
    ("world_size=1.5", "world_size=1.5: expected integer"),
    ("iterations=many", "iterations=many: expected integer"),
    ("batch_size=[1,2]", "batch_size"),
    ("lambda=abc", "lambda=abc: expected float"),
    ("seed=abc", "seed=abc: expected integer"),
    ("timeout_s=soon", "timeout_s=soon: expected float"),
    ("L_t=x", "L_t=x: expected integer"),
    ("L_c=1.5", "L_c=1.5: expected integer"),
    ("warmup=abc", "warmup=abc: expected integer"),
    ("checkpoint.every=often", "checkpoint.every=often: expected integer"),
    ("optim.lr=fast", "optim.lr=fast: expected float"),
    ("optim.momentum=abc", "optim.momentum=abc"),
    ("logger.csv=maybe", "logger.csv=maybe"),
    ("net.bandwidth_bps=fast", "net.bandwidth_bps=fast"),
    ("device=[1,2]", "device"),
    ("=3", "'=3': an override needs a key"),
    # inside an option group: its schema (gvq/schema/options.py) names the key and what it takes
    ("aggregator=powersgd aggregator.rnk=4", "aggregator.rnk: unknown key; did you mean aggregator.rank?"),
    ("aggregator=qsgd aggregator.compressor.bitz=3", "did you mean aggregator.compressor.bits?"),
    ("model.width=abc", "model.width=abc: expected integer"),
    ("aggregator=qsgd aggregator.topology=rng", "aggregator.topology=rng: expected one of ring, allgather, ps"),
    ("aggregator=qsgd aggregator.compressor.norm=l1", "aggregator.compressor.norm=l1: expected one of l2, max"),
    ("dataset=cifar10 dataset.download=maybe", "dataset.download=maybe: expected boolean"),
    ("model=resnet20 model.width=8", "model.width: unknown key; this option takes no keys"),
    # ranges and combinations checked in code before any rank starts
    ("world_size=0", "world_size=0: must be >= 1"),
    ("world_size=-2", "world_size=-2: must be >= 1"),
    ("iterations=0", "iterations=0"),
    ("batch_size=0", "batch_size=0"),
    ("eval_every=0", "eval_every=0"),
    ("timeout_s=0", "timeout_s=0"),
    ("device=tpu", "device=tpu: expected one of cpu, cuda"),
    ("checkpoint.every=-1", "checkpoint.every=-1"),
    ("checkpoint.keep=0", "checkpoint.keep=0"),
    ("restarts=-1", "restarts=-1: must be >= 0"),
    ("nan_policy=ignore", "nan_policy=ignore"),
    ("lambda=1.5", "lambda=1.5"),
    ("lambda=-0.1", "lambda=-0.1"),
    ("K=abc", "K='abc'"),
    ("K=x0", "K='x0'"),
    ("K=0", "K=0"),
    ("s=0", "s=0"),
    ("L_t=1", "L_t=1"),
    ("L_c=0", "L_c=0"),
    ("warmup=-1", "warmup=-1"),
    ("seed=-1", "seed=-1"),
    ("seed=99999999999999999999", "seed=99999999999999999999"),
    ("optim.lr=-1", "optim.lr=-1"),
    ("optim.momentum=1.5", "optim.momentum=1.5"),
    ("optim.schedule=exp", "optim.schedule=exp"),
    ("optim.gamma=0", "optim.gamma=0"),
    ("net.clock=sundial", "net.clock=sundial: expected one of wall, virtual"),
    ("net.clock=virtual", "no link model"),
    ("net=mbit50 net.clock=virtual aggregator=ddp", "kernel shaping"),
    ("net.compute_scale=2", "net.compute_scale=2"),
    ("net.latency_s=-1", "net.latency_s=-1"),
    ("logger.wandb.mode=sometimes", "logger.wandb.mode=sometimes"),
    ("device=cuda", "device=cuda"),
    ("resume=/nonexistent/run", "resume=/nonexistent/run: no such directory"),
    ("resume={empty}", "no complete checkpoint set"),
    ("resume={partial}", "no complete checkpoint set"),
    # what needs the data or the model: checked in the launcher's preflight, still before any rank
    ("batch_size=100000", "batch_size=100000"),
    ("world_size=1000 batch_size=2", "batch_size=2"),
    ("aggregator=gradiveq K=7", "K=7: must be a multiple of F*D"),
    ("aggregator.nonsense=3", "nonsense"),
    ("dataset=cifar10 dataset.root=/nonexistent", "dataset.root=/nonexistent"),
    ("dataset=cifar100 dataset.root=/nonexistent", "dataset.root=/nonexistent"),
    ("dataset=cifar10 dataset.root={garbage}", "data_batch_1: not a CIFAR python batch"),
    ("dataset.test_fraction=1.5", "dataset.test_fraction=1.5"),
    ("dataset.split=by_source", "dataset.split=by_source: expected one of pooled, by_label"),
    ("dataset.split=by_label world_size=12 batch_size=100", "smallest rank's groups (dataset.split"),
    ("dataset=fashion_mnist dataset.root=/nonexistent", "no Fashion-MNIST under /nonexistent"),
    ("dataset=fashion_mnist dataset.root={idx_garbage}", "train-images-idx3-ubyte: not the Fashion-MNIST IDX"),
    ("dataset=fashion_mnist dataset.n_train=many", "dataset.n_train=many"),
]


#: one case of each kind, run as a process too
AS_PROCESS = ("foo=1", "world_size=0", "batch_size=100000", "resume={partial}",
              "dataset=fashion_mnist dataset.root={idx_garbage}")


def _invoke(args: str, tmp: Path, slots: dict, process: bool) -> dict:
    runs = tmp / uuid.uuid4().hex[:8] / "runs"
    argv = [*(a.format(**slots) for a in args.split()), f"hydra.run.dir={runs}/day/run"]
    if process:
        mark = uuid.uuid4().hex
        env = dict(os.environ, WANDB_MODE="disabled", GVQ_TEST_MARK=mark)
        env.pop("HYDRA_FULL_ERROR", None)
        r = subprocess.run([sys.executable, str(ROOT / "cli.py"), *argv], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
        stray = _marked(mark)
    else:
        r, stray = cli_in_process(*argv), []
    return {"rc": r.returncode, "stderr": r.stderr, "stdout": r.stdout, "runs": runs,
            "left": sorted(str(p) for p in runs.rglob("*")) if runs.exists() else [], "stray": stray}


def _marked(mark: str) -> list[int]:
    """Live processes started by an invocation (they carry its marker in their environment)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"GVQ_TEST_MARK={mark}".encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "empty").mkdir()
    (tmp / "partial" / "checkpoint" / "iter-000000004").mkdir(parents=True)    # a set never completed
    garbage = tmp / "garbage" / "cifar-10-batches-py"
    garbage.mkdir(parents=True)
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (garbage / f).write_bytes(pickle.dumps({b"labels": [1, 2]}))             # no b"data"
    idx_garbage = tmp / "idx_garbage"
    idx_garbage.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (idx_garbage / name).write_bytes(b"\x00\x00\x08\x01" + bytes(100))       # a labels header everywhere
    slots = {"empty": tmp / "empty", "partial": tmp / "partial", "garbage": tmp / "garbage",
             "idx_garbage": idx_garbage}
    with ThreadPoolExecutor(max_workers=3) as pool:
        processes = list(pool.map(lambda args: _invoke(args, tmp, slots, True), AS_PROCESS))
    in_process = {args: _invoke(args, tmp, slots, False) for args, _ in CASES}   # one at a time: argv is global
    return {**{(args, False): out for args, out in in_process.items()},
            **{(args, True): out for args, out in zip(AS_PROCESS, processes)}}


def test_the_table_is_wide():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)
    assert set(AS_PROCESS) <= {c[0] for c in CASES}


@pytest.mark.slow
@pytest.mark.parametrize("args, needle, process", [(a, n, False) for a, n in CASES] +
                         [(a, n, True) for a, n in CASES if a in AS_PROCESS],
                         ids=[c[0] for c in CASES] + [f"process-{a}" for a in AS_PROCESS])
def test_a_bad_invocation_is_one_line_and_leaves_nothing(outcomes, args, needle, process):
    out = outcomes[(args, process)]
    lines = [ln for ln in out["stderr"].splitlines() if ln.strip()]
    assert out["rc"] != 0, out["stderr"][-2000:]
    assert len(lines) == 1 and lines[0].startswith("gvq: config error: "), out["stderr"][-2000:]
    assert needle in lines[0], lines[0]
    assert "Traceback" not in out["stderr"] + out["stdout"]
    assert out["left"] == [], out["left"]                       # nothing under runs/
    assert out["stray"] == []


def test_a_run_into_a_directory_holding_a_run_is_refused_in_one_line(tmp_path):
    """A second run into the first's directory: refused before its ranks start (exit 2, one line), the
    first's records untouched; before, its logger's failure was taken for a failure after training."""
    from tests.helpers.cli import cli_in_process
    run = tmp_path / "run"
    args = ("iterations=2", "eval_every=2", "logger.progress=false", f"hydra.run.dir={run}")
    first = cli_in_process(*args)
    assert first.returncode == 0, first.stderr
    before = (run / "metrics.csv").read_bytes()
    second = cli_in_process(*args)
    assert second.returncode == 2
    lines = [line for line in second.stderr.splitlines() if line.startswith("gvq:")]
    assert len(lines) == 1 and "already holds a run" in lines[0], second.stderr
    assert (run / "metrics.csv").read_bytes() == before
