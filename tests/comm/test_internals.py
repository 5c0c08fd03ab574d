"""The private Python and torch APIs gvq relies on (gvq/comm/internals.py) still exist with the shape it
uses: a Python or torch upgrade that moves one fails here, by name, instead of a run misbehaving."""
from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from gvq.aggregators.ddp_memory import hook_compresses
from gvq.comm import internals

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter (these APIs act on a whole process); its stdout's lines."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_fork_server_pid_is_where_multiprocessing_keeps_it():
    from multiprocessing import forkserver
    assert forkserver.ForkServer()._forkserver_pid is None          # the attribute, before a server runs
    pid, alive = _python("import os\nfrom multiprocessing import forkserver\n"
                         "from gvq.comm.internals import fork_server_pid\n"
                         "before = fork_server_pid()\nforkserver.ensure_running()\npid = fork_server_pid()\n"
                         "print(pid, before is None and os.path.exists(f'/proc/{pid}'))")
    assert int(pid) > 0 and alive == "True"


def test_run_exit_handlers_runs_them_now_last_first_and_once():
    code = ("import atexit, os\nfrom gvq.comm.internals import run_exit_handlers\n"
            "atexit.register(print, 'first')\natexit.register(print, 'second')\n"
            "run_exit_handlers()\nprint('after')\n")
    assert _python(code) == ["second", "first", "after"]                # an ordinary exit runs none again


def _raise_on_rank_1(rank: int) -> None:
    if rank == 1:
        raise RuntimeError("raised on rank 1")


def test_rank_error_trace_reads_torchs_error_file():
    assert list(inspect.signature(mp.ProcessRaisedException).parameters)[:3] == ["msg", "error_index",
                                                                                 "error_pid"]
    assert "grace_period" in inspect.signature(mp.ProcessContext.join).parameters   # torch >= 2.6
    ctx = mp.start_processes(_raise_on_rank_1, nprocs=2, join=False, start_method="spawn")
    with pytest.raises(mp.ProcessRaisedException):
        while not ctx.join(timeout=30):
            pass
    assert len(ctx.error_files) == len(ctx.processes) == 2 and all(p.pid for p in ctx.processes)
    trace = internals.rank_error_trace(ctx, 1)
    assert isinstance(trace, str) and "RuntimeError: raised on rank 1" in trace
    assert internals.rank_error_trace(ctx, 0) is None                  # rank 0 raised nothing


def test_torch_optim_first_step_imports_the_preloaded_module():
    assert importlib.util.find_spec(internals.TORCH_FIRST_STEP_MODULE) is not None
    code = ("import sys, torch\nfrom gvq.comm.internals import TORCH_FIRST_STEP_MODULE as name\n"
            "before = name in sys.modules\nm = torch.nn.Linear(2, 1)\n"
            "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nm(torch.ones(1, 2)).sum().backward()\nopt.step()\n"
            "print(before, name in sys.modules)")
    assert _python(code)[1] == "True"          # imported by the first step: worth preloading in the server


def test_powersgd_hook_compresses_by_the_rule_gvq_mirrors():
    """gvq/aggregators/ddp_memory.py lays out the hook's P / Q memory by restating its private rule."""
    rule = powerSGD_hook._should_compress
    assert list(inspect.signature(rule).parameters) == ["num_rows", "num_cols", "matrix_approximation_rank",
                                                         "min_compression_rate"]
    assert "_should_compress(" in inspect.getsource(powerSGD_hook.powerSGD_hook)
    for n in (1, 2, 3, 8, 16, 64, 576):
        for m in (1, 3, 9, 27, 144, 576):
            for rank in (1, 2, 4, 8):
                for rate in (1, 2, 1.5):
                    assert hook_compresses(n, m, rank, rate) == rule(n, m, rank, rate)[0], (n, m, rank, rate)


#: a private name reached through torch or the standard library: ``dist._X``, ``torch.x._y``,
#: ``forkserver._f``, ``atexit._f``, ``from torch.x import _y``, ``import torch._x``
PRIVATE = re.compile(r"\b(?:torch|dist|F|nn|forkserver|atexit|multiprocessing|traceback)(?:\.\w+)*\._[A-Za-z]\w*"
                     r"|from\s+torch[\w.]*\s+import\s+(?:\([^)]*)?\b_[a-zA-Z]\w*|import\s+torch\.(?:\w+\.)*_\w+")


def private_names(text: str) -> list[str]:
    return [m.group(0) for m in PRIVATE.finditer(text)]


def test_internals_is_the_one_home_of_private_apis():
    """Outside internals.py no gvq module reaches a private torch or Python name (any, not a list)."""
    found = [f"{p.relative_to(ROOT)}: {n}" for p in sorted((ROOT / "gvq").rglob("*.py"))
             if p.name != "internals.py" for n in private_names(p.read_text())]
    assert found == [], found
    assert os.path.isfile(ROOT / "gvq" / "comm" / "internals.py")


def test_the_scan_finds_private_names_however_they_are_spelt():
    text = ("x = dist._DEFAULT_FIRST_BUCKET_BYTES\nfrom torch.distributed.algorithms import _comm\n"
            "import torch._dynamo\ny = torch.nn.modules._utils.f\nz = forkserver._forkserver\n"
            "ok = torch.distributed.all_reduce\nself._private = 1\n")
    assert private_names(text) == ["dist._DEFAULT_FIRST_BUCKET_BYTES", "from torch.distributed.algorithms import _comm",
                                   "import torch._dynamo", "torch.nn.modules._utils", "forkserver._forkserver"]
