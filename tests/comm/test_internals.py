"""The private Python, torch and Hydra APIs gvq relies on (gvq/comm/internals.py) still exist with the shape
it uses: an upgrade that moves one fails here, by name, instead of a run misbehaving.  No other gvq module
reaches a private name of torch, Python, OmegaConf or Hydra."""
from __future__ import annotations

import ast
import importlib
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


def test_hydras_basic_sweeper_is_where_gvq_names_it():
    module, _, name = internals.HYDRA_BASIC_SWEEPER.rpartition(".")
    assert isinstance(getattr(importlib.import_module(module), name), type)
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        cfg = compose("config", return_hydra_config=True, overrides=["hydra/sweeper=basic"])
    assert cfg.hydra.sweeper._target_ == internals.HYDRA_BASIC_SWEEPER
    from hydra.plugins.sweeper import Sweeper
    base = internals.hydra_basic_sweeper()         # gvq's sweeper extends it: what it overrides still exists
    assert issubclass(base, Sweeper) and callable(base.split_arguments) and callable(base.sweep)


#: a private name reached through torch, the standard library, OmegaConf or Hydra: ``dist._X``,
#: ``torch.x._y``, ``forkserver._f``, ``atexit._f``, ``OmegaConf._f``, ``omegaconf._utils``, ``hydra._internal``,
#: ``from torch.x import _y``, ``import torch._x``.  Hydra's own keys end in ``_`` (``_target_``): public.
_LIBS = r"torch|dist|F|nn|forkserver|atexit|multiprocessing|traceback|omegaconf|OmegaConf|hydra|HydraConfig"
_NAME = r"_[A-Za-z]\w*(?<!_)(?!\w)"
PRIVATE = re.compile(rf"\b(?:{_LIBS})(?:\.\w+)*\.{_NAME}"
                     rf"|from\s+(?:torch|omegaconf|hydra)[\w.]*\s+import\s+(?:\([^)]*?|[^\n(]*?)(?<![\w.]){_NAME}"
                     rf"|import\s+(?:torch|omegaconf|hydra)\.(?:\w+\.)*{_NAME}")


def private_names(text: str) -> list[str]:
    return [m.group(0) for m in PRIVATE.finditer(text)]


def omegaconf_privates() -> set[str]:
    """The private attributes of OmegaConf's configs and nodes (``_get_node``, ``_metadata``, ...): what
    their classes define and what an instance holds."""
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.nodes import AnyNode, StringNode
    names = {n for c in (DictConfig, ListConfig, AnyNode, StringNode, OmegaConf) for k in c.__mro__
             if k.__module__.startswith("omegaconf") for n in vars(k)}
    names |= {*vars(OmegaConf.create({"a": 1})), *vars(OmegaConf.create([1])), *vars(AnyNode(1))}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def own_names(texts: list[str]) -> set[str]:
    """Every name gvq's own code defines or assigns (a ``_value`` of its own is not OmegaConf's)."""
    found = set()
    for node in (n for t in texts for n in ast.walk(ast.parse(t))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
    return found


def node_privates(text: str, omegaconf: set[str], own: set[str]) -> list[str]:
    """``x._get_node``-style reaches in ``text``: an attribute that only OmegaConf's nodes define."""
    return [f"{n.lineno}: .{n.attr}" for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.Attribute) and n.attr in omegaconf - own]


def _gvq_sources() -> dict[Path, str]:
    return {p: p.read_text() for p in sorted((ROOT / "gvq").rglob("*.py")) if p.name != "internals.py"}


def test_internals_is_the_one_home_of_private_apis():
    """Outside internals.py no gvq module reaches a private torch, Python, OmegaConf or Hydra name (any,
    not a list), nor a private attribute of an OmegaConf config or node."""
    sources = _gvq_sources()
    found = [f"{p.relative_to(ROOT)}: {n}" for p, text in sources.items() for n in private_names(text)]
    assert found == [], found
    omegaconf, own = omegaconf_privates(), own_names(list(sources.values()))
    found = [f"{p.relative_to(ROOT)}:{n}" for p, text in sources.items() for n in node_privates(text, omegaconf, own)]
    assert found == [], f"private OmegaConf attributes (use OmegaConf's public API): {found}"
    assert os.path.isfile(ROOT / "gvq" / "comm" / "internals.py")


def test_the_node_scan_finds_omegaconf_privates_and_spares_gvqs_own():
    omegaconf = omegaconf_privates()
    assert {"_get_node", "_metadata", "_content", "_parent", "_set_flag"} <= omegaconf
    text = ("child = node._get_node(k)\nkind = cfg._metadata.object_type\nok = cfg.get('a')\n"
            "v = mine._value()\n")
    assert node_privates(text, omegaconf, own_names(["class A:\n    def _value(self):\n        pass\n"])) == [
        "1: ._get_node", "2: ._metadata"]


def test_the_scan_finds_private_names_however_they_are_spelt():
    text = ("x = dist._DEFAULT_FIRST_BUCKET_BYTES\nfrom torch.distributed.algorithms import _comm\n"
            "import torch._dynamo\ny = torch.nn.modules._utils.f\nz = forkserver._forkserver\n"
            "ok = torch.distributed.all_reduce\nself._private = 1\n")
    assert private_names(text) == ["dist._DEFAULT_FIRST_BUCKET_BYTES", "from torch.distributed.algorithms import _comm",
                                   "import torch._dynamo", "torch.nn.modules._utils", "forkserver._forkserver"]


def test_the_scan_finds_omegaconf_and_hydra_privates_and_spares_hydras_keys():
    text = ("from omegaconf._utils import get_ref_type\nx = OmegaConf._get_obj_type(c)\n"
            "from hydra.core.utils import _flush_loggers, JobReturn\nimport hydra._internal.utils\n"
            "s = 'hydra._internal.core_plugins.basic_sweeper.BasicSweeper'\nk = HydraConfig._instance\n"
            "ok = cfg.aggregator._target_\nok = OmegaConf.select(c, 'hydra.sweeper._target_')\n"
            "ok = hydra.utils.instantiate\n")
    assert private_names(text) == ["omegaconf._utils", "OmegaConf._get_obj_type",
                                   "from hydra.core.utils import _flush_loggers", "import hydra._internal",
                                   "hydra._internal", "HydraConfig._instance"]
