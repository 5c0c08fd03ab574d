"""gvq/schema/tool.py: a tool's command line is ``key=value`` overrides of a typed config (a grid's keys under
``grid``), path arguments as flags, ``--cfg``; a bad key is one line naming it, before anything runs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import pytest

from gvq.schema.errors import ConfigError
from gvq.schema.grid import GridSchema
from gvq.schema.tool import Arg, Command, compose_command, dispatch, keys, parse_command
from tests.helpers.errors import assert_one_line_unchained

CALLS: list = []


@dataclass
class _Keys:
    reps: int = 20                    # a knob with a default
    model: str = "cnn"
    scales: List[float] = field(default_factory=lambda: [1.0])
    target: Optional[float] = None


@dataclass
class _GridKeys:
    reps: int = 3
    grid: GridSchema = field(default_factory=GridSchema)      # replaced by conf/grid/bench.yaml's


def record(cfg, paths):
    CALLS.append((cfg, paths))
    return "ran"


PLAIN = Command(_Keys, f"{__name__}:record", "a plain command",
                (Arg("dirs", "input dirs", nargs="*"), Arg("--out", "where"), Arg("--bench", "jsons", nargs="+")))
GRID = Command(_GridKeys, f"{__name__}:record", "a command on the bench grid", (), grid="bench")


def test_overrides_replace_defaults_typed():
    cfg = compose_command(PLAIN, ["reps=5", "model=resnet20", "scales=[1,0.5]", "target=2.4"])
    assert (cfg.reps, cfg.model, list(cfg.scales), cfg.target) == (5, "resnet20", [1.0, 0.5], 2.4)
    assert compose_command(PLAIN).reps == 20 and keys(PLAIN) == ["reps", "model", "scales", "target"]


@pytest.mark.parametrize("override, line", [
    ("rep=3", "rep: unknown key; did you mean reps? allowed: model, reps, scales, target"),
    ("reps=many", "reps=many: expected integer"),
    ("target=soon", "target=soon: expected float"),
    ("reps", "'reps': an override is KEY=VALUE (keys: model, reps, scales, target)"),
    ("grid.world_size=[4]", "grid.world_size: unknown key; did you mean grid.world_sizes?"),
    ("grid.links_bps=[fast]", "grid.links_bps"),
])
def test_a_bad_override_is_one_line_naming_the_key(override, line):
    with pytest.raises(ConfigError) as e:
        compose_command(GRID if override.startswith("grid.") else PLAIN, [override])
    assert line in str(e.value)
    assert_one_line_unchained(e.value)


def _tool_commands() -> list:
    import importlib
    return [pytest.param(command, id=f"{tool}-{name}") for tool in ("bench", "predict", "report", "analysis")
            for name, command in importlib.import_module(f"gvq.{tool}.__main__").COMMANDS.items()]


@pytest.mark.parametrize("command", _tool_commands())
def test_every_tools_refusal_is_raised_unchained(command):
    """In-process (a notebook, a script calling a tool's command), each tool's ConfigError is its one line
    with nothing chained: an unknown key, a number given a word, a grid's misspelt key."""
    from omegaconf import OmegaConf
    defaults = OmegaConf.to_container(compose_command(command))
    numeric = [k for k, v in defaults.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    bad = ["nosuchkey=1", *(f"{k}=abc" for k in numeric[:1]), *(["grid.world_size=[4]"] if command.grid else [])]
    for override in bad:
        with pytest.raises(ConfigError) as e:
            compose_command(command, [override])
        assert_one_line_unchained(e.value)


def test_a_grid_command_starts_from_its_grid_file_and_takes_its_keys():
    from gvq.schema.compose import load_grid
    cfg = compose_command(GRID, ["grid.world_sizes=[4,8]"])
    assert list(cfg.grid.world_sizes) == [4, 8] and list(cfg.grid.settings) == load_grid("bench").settings
    assert "grid.links_bps" in keys(GRID)


def test_paths_and_overrides_are_told_apart(tmp_path):
    run = tmp_path / "sweep" / "aggregator=qsgd,seed=0"      # a Hydra sweep's job dir: a path, not an override
    run.mkdir(parents=True)
    args, cfg = parse_command("prog", PLAIN, [str(run), "reps=4", "--bench", "a.json", "b.json", "target=1.5",
                                              "--out", str(tmp_path / "o"), "model=resnet20"])
    assert args.dirs == [run] and [str(b) for b in args.bench] == ["a.json", "b.json"]
    assert (cfg.reps, cfg.target, cfg.model) == (4, 1.5, "resnet20") and args.out == tmp_path / "o"


def test_an_override_longer_than_a_file_name_is_still_an_override():
    """A long list of settings is no path: asking the file system whether it exists must not end the
    command (its name is longer than a file name may be)."""
    long = "resnet" * 50
    _, cfg = parse_command("prog", PLAIN, [f"model={long}", "reps=2"])
    assert cfg.model == long and cfg.reps == 2


def test_a_value_yaml_cannot_read_is_one_line_naming_it():
    with pytest.raises(ConfigError, match="^model='a',b: YAML cannot read the value"):
        compose_command(PLAIN, ["model='a',b"])


def test_dispatch_runs_the_named_command_or_the_default_and_prints_cfg_without_running(capsys):
    table = {"plain": PLAIN, "grid": GRID}
    CALLS.clear()
    assert dispatch("python -m tool", table, ["grid", "reps=7"]) == "ran"
    assert CALLS[-1][0].reps == 7 and list(CALLS[-1][0].grid.world_sizes) == [4]
    assert dispatch("python -m tool", table, ["reps=2"], default="plain") == "ran" and CALLS[-1][0].reps == 2
    n = len(CALLS)
    assert dispatch("python -m tool", table, ["plain", "reps=9", "--cfg"]) is None and len(CALLS) == n
    assert "reps: 9" in capsys.readouterr().out


def test_dispatch_refuses_in_one_line_with_status_2(capsys):
    table = {"plain": PLAIN}
    with pytest.raises(SystemExit) as e:
        dispatch("python -m tool", table, ["plain", "rep=3"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("tool: error: rep: unknown key") and "\n" not in err
    with pytest.raises(SystemExit) as e:
        dispatch("python -m tool", table, ["nope"])
    assert e.value.code == 2 and "usage: python -m tool {plain}" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_without_a_default_command_lists_the_commands_on_stdout_with_status_0(capsys, flag):
    with pytest.raises(SystemExit) as e:
        dispatch("python -m tool", {"plain": PLAIN, "grid": GRID}, [flag])
    out = capsys.readouterr()
    assert e.value.code == 0 and out.out.startswith("usage: python -m tool {plain,grid}") and not out.err
    assert "  plain  a plain command" in out.out and "  grid   a command on the bench grid" in out.out
