"""gvq/hooks/config.py: a user's script builds any conf/aggregator ring option by name, composed as the CLI
composes it (gvq/schema/): the command line's keys (knobs included) as overrides, the CLI's one-line
refusals with their closest match; torch DDP's options and unknown names are refused, offering only the
options a hook runs."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from gvq.hooks.config import build_aggregator, hook_options, option_config
from gvq.schema.errors import ConfigError
from tests.helpers.errors import assert_one_line_unchained


def _refusal(name: str, **overrides) -> str:
    """The line ``build_aggregator`` refuses with; raised unchained (a user's script, under torchrun each
    rank's, ends in this line, not below OmegaConf's and Hydra's reports)."""
    with pytest.raises(ConfigError) as e:
        build_aggregator(name, **overrides)
    assert_one_line_unchained(e.value)
    return str(e.value)


def test_an_option_by_name_with_overrides():
    agg = build_aggregator("qsgd", **{"compressor.bits": 2})
    assert agg.compressor.levels == 3 and agg.name == "qsgd"          # 2 bits: 2^2 - 1 levels


def test_the_clis_knob_names_reach_the_aggregator():
    agg = build_aggregator("gradiveq", **{"lambda": 0.05, "K": "x2", "s": 4, "L_t": 7, "L_c": 9, "warmup": 2})
    assert (agg.compressor.lam, agg.compressor.K, agg.compressor.s) == (0.05, "x2", 4)
    assert (agg.L_t, agg.L_c, agg.warmup) == (7, 9, 2)


def test_python_values_reach_the_config_as_given():
    cfg = option_config("gradiveq", {"aggregator.monitor_threshold": None, "compressor.pool": True,
                                     "s": float("inf"), "compressor.d": 3, "compressor.K": "x1"})
    assert cfg.monitor_threshold is None and cfg.compressor.pool is True and cfg.compressor.d == 3
    assert cfg.compressor.s == float("inf") and cfg.compressor.K == "x1"


def test_gradiveqs_interpolations_resolve_against_the_run_config():
    cfg = option_config("gradiveq")
    assert cfg["compressor"]["lam"] == 0.01 and cfg["L_t"] == 100 and "defaults" not in cfg


@pytest.mark.parametrize("name,overrides,cli", [
    ("qsgd", {"compressor.bits": 2, "topology": "allgather"},
     ["aggregator.compressor.bits=2", "aggregator.topology=allgather"]),
    ("gradiveq_pooled", {"lambda": 0.05, "L_t": 50, "aggregator.compressor.target_ratio": 4.0, "pieces": 2},
     ["lambda=0.05", "L_t=50", "aggregator.compressor.target_ratio=4", "aggregator.pieces=2"]),
    ("powersgd", {"rank": 3, "warm_start": False}, ["aggregator.rank=3", "aggregator.warm_start=false"]),
])
def test_the_same_composition_as_the_cli(compose_cfg, name, overrides, cli):
    cli_node = compose_cfg(f"aggregator={name}", *cli).aggregator
    hook_node = option_config(name, overrides)
    assert OmegaConf.to_container(hook_node, resolve=True) == OmegaConf.to_container(cli_node, resolve=True)
    assert OmegaConf.get_type(hook_node) is OmegaConf.get_type(cli_node)          # the same typed schema


@pytest.mark.parametrize("name,key,line", [
    ("qsgd", "compressor.bitz",
     "aggregator.compressor.bitz: unknown key; did you mean aggregator.compressor.bits? allowed: bits, "),
    ("qsgd", "aggregator.compressor.bitz",
     "aggregator.compressor.bitz: unknown key; did you mean aggregator.compressor.bits?"),
    ("powersgd", "rnk", "aggregator.rnk: unknown key; did you mean aggregator.rank? allowed: "),
    ("gradiveq", "lamda", "lamda: unknown key; did you mean lambda? allowed: K, L_c, L_t, "),
])
def test_a_misspelt_key_is_refused_in_one_line_with_the_closest_match(name, key, line):
    assert _refusal(name, **{key: 2}).startswith(line)


@pytest.mark.parametrize("name,overrides,line", [
    ("qsgd", {"compressor.bits": "abc"}, "aggregator.compressor.bits=abc: expected integer"),
    ("gradiveq", {"lambda": "much"}, "lambda=much: expected float"),
    ("qsgd", {"topology": "rng"}, "aggregator.topology=rng: expected one of ring, allgather, ps"),
    ("qsgd", {"seed": 1}, "seed: a key of the run, not of its aggregator"),
])
def test_an_ill_typed_value_or_a_runs_key_is_refused_in_one_line(name, overrides, line):
    assert _refusal(name, **overrides).startswith(line)


@pytest.mark.parametrize("name,message", [("ddp", "not a gvq ring aggregator"), ("nope", "no such option")])
def test_what_is_not_a_gvq_ring_option_is_refused(name, message):
    assert message in _refusal(name)


@pytest.mark.parametrize("name,key,value", [("gradiveq_pooled", "pool", True),
                                            ("gradiveq_bf16", "basis_dtype", "bfloat16")])
def test_a_derived_option_starts_from_its_base(name, key, value):
    cfg = option_config(name)               # `defaults: [gradiveq]` followed, as the CLI composes it
    assert cfg["_target_"] == "gvq.aggregators.gradiveq.GradiVeQAggregator"
    assert cfg["compressor"][key] == value and cfg["L_t"] == 100
    assert build_aggregator(name).name.startswith("gradiveq")


def test_an_unknown_name_lists_only_the_options_a_hook_can_run():
    line = _refusal("qsdg")
    assert line.startswith("aggregator=qsdg: no such option; did you mean aggregator=qsgd? options: ")
    offered = line.split("options: ", 1)[1].split(", ")
    assert offered == hook_options() and {"rar", "qsgd", "powersgd", "gradiveq_pooled"} <= set(offered)
    assert not [o for o in offered if o.startswith("ddp")]     # torch DDP's own: the hook refuses them
    for name in offered:                                        # and every one offered is built
        assert build_aggregator(name).name


def test_a_callers_own_hydra_keeps_its_state():
    """A script under its own ``@hydra.main`` (here: initialize_config_dir) builds a hook, then composes
    its own config as before."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.helpers.cli import ROOT
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        outer = GlobalHydra.instance().hydra
        assert build_aggregator("qsgd").name == "qsgd"
        assert GlobalHydra.instance().hydra is outer
        assert compose("config", overrides=["aggregator=rar"]).aggregator._target_.endswith("RingAllReduce")


# -- misuse through a hook: the CLI's one line, before anything runs ----------------------------------

OUT_OF_RANGE = [("qsgd", {"compressor.bits": 0}, "bits=0: must be an integer in [2, 16]"),
                ("powersgd", {"rank": -1}, "aggregator.rank=-1: must be an integer >= 1"),
                ("orq", {"compressor.levels": 4}, "levels=4: ORQ needs levels = 2^K + 1"),
                ("gradiveq", {"lambda": -1}, "lambda=-1.0: must be in [0, 1)"),
                ("gradiveq", {"L_t": 0}, "L_t=0: must be an integer >= 2"),
                ("topk", {"compressor.ratio": 1.5}, "ratio=1.5: must be a fraction in (0, 1]")]


@pytest.mark.parametrize("name,overrides,says", OUT_OF_RANGE)
def test_an_out_of_range_knob_is_the_clis_one_line_config_error(name, overrides, says):
    assert _refusal(name, **overrides).startswith(says)


def test_the_hook_and_the_cli_print_the_same_line_for_a_bad_value():
    from tests.helpers.cli import cli_in_process
    out = cli_in_process("aggregator=qsgd", "aggregator.compressor.bits=0", "iterations=1")
    assert out.returncode != 0 and _refusal("qsgd", **{"compressor.bits": 0}) in out.stderr


@pytest.mark.parametrize("call,says", [
    (lambda p: _state(None, p), "config=None: give an option name"),
    (lambda p: _state("qsgd", p, {"bits": 2}),
     "bits: not a key of aggregator=qsgd itself; did you mean compressor.bits?"),
    (lambda p: _state("qsgd", p, None, bits=2), "an option's keys go in overrides"),
    (lambda p: _state("qsgd", p, [("compressor.bits", 2)]), "overrides=.*give a dict"),
    (lambda p: _state("qsgd", torch.nn.Linear(2, 2).weight), "params=Parameter: pass the model's parameters"),
    (lambda p: _state("qsgd", p, rank=2, world_size=2), "rank=2, world_size=2: need world_size >= 1"),
    (lambda p: _state("qsgd", p, rank=0, world_size=0), "rank=0, world_size=0"),
])
def test_a_hooks_misuse_is_one_line_naming_what_to_pass(call, says):
    with pytest.raises(ValueError, match=says) as e:
        call(torch.nn.Linear(3, 2).parameters())
    assert_one_line_unchained(e.value)


def _state(config, params, overrides=None, rank=0, world_size=1, **context):
    from gvq.hooks import GvqHookState
    return GvqHookState.from_config(config, params, overrides, rank=rank, world_size=world_size, **context)


def test_the_lightning_callback_checks_its_option_when_built():
    pytest.importorskip("lightning")
    from gvq.hooks.lightning import GvqHook
    with pytest.raises(ConfigError, match=r"^aggregator=qsdg: no such option; did you mean aggregator=qsgd\?") as e:
        GvqHook("qsdg")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="bits=0"):
        GvqHook("qsgd", {"compressor.bits": 0})


# -- the same misuse in a user's script under torchrun: each rank's one line, nothing chained above it ---

MISUSE = '''import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from gvq.hooks import GvqHookState
dist.init_process_group("gloo")
GvqHookState.from_config("qsgd", DistributedDataParallel(torch.nn.Linear(4, 2)), {"compressor.bits": "two"})
'''


@pytest.mark.slow
def test_a_hook_misuse_under_torchrun_ends_each_rank_in_its_one_line(tmp_path):
    import subprocess
    import sys

    from tests.helpers.cli import ROOT
    from tests.helpers.dist import env_without_hydra
    from tests.helpers.errors import CHAINED
    (tmp_path / "misuse.py").write_text(MISUSE)
    env = dict(env_without_hydra(), PYTHONPATH=str(ROOT))        # this checkout's gvq, whatever is installed
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(tmp_path / "misuse.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    line = "ConfigError: aggregator.compressor.bits=two: expected integer"
    assert r.returncode != 0 and r.stderr.count(line) == 2, r.stderr[-3000:]        # once per rank
    assert not [c for c in CHAINED if c in r.stderr], r.stderr[-3000:]
    # each rank's traceback alone (3 chained ones each before; torchrun's own summary is the one more)
    assert r.stderr.count("Traceback (most recent call last)") <= 3 and len(r.stderr.splitlines()) < 100
