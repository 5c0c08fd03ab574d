"""gvq/schema/grid.py: every conf/grid/ file composes through gvq.schema.compose.grid into its typed schema;
an unknown or ill-typed key is refused in one line naming it; the tools' defaults are the grids'."""
from __future__ import annotations

import pytest

from gvq.schema.compose import conf_dir, load_grid
from gvq.schema.errors import ConfigError
from gvq.schema.grid import GridSchema
from gvq.schema.setting import Setting
from tests.helpers.errors import assert_one_line_unchained

GRIDS = sorted(p.stem for p in (conf_dir() / "grid").glob("*.yaml"))


@pytest.mark.parametrize("name", GRIDS)
def test_every_grid_composes_into_its_schema_and_its_settings_parse(name):
    g = load_grid(name)
    assert isinstance(g, GridSchema) and g.settings
    assert all(isinstance(n, int) for n in g.world_sizes) and all(isinstance(b, float) for b in g.links_bps)
    for entry in g.settings:
        Setting.parse(entry, g.set)


def test_a_grid_takes_overrides_and_refuses_an_unknown_or_ill_typed_key_in_one_line():
    assert load_grid("overlap", ["grid.world_sizes=[2,3]"]).world_sizes == [2, 3]
    assert load_grid("overlap").world_sizes != [2, 3]          # the override did not stick to the cached grid
    for bad, named in ((["grid.world_size=[4]"], "grid.world_size"), (["+grid.links=[1]"], "grid.links"),
                       (["grid.links_bps=[fast]"], "grid.links_bps")):
        with pytest.raises(ConfigError) as e:
            load_grid("overlap", bad)
        assert named in str(e.value)
        assert_one_line_unchained(e.value)
    with pytest.raises(ConfigError, match="nosuch"):
        load_grid("nosuch")


def test_an_unknown_key_in_a_grid_file_is_named(tmp_path, monkeypatch):
    import shutil
    from gvq.schema import compose
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    (conf / "grid" / "typo.yaml").write_text("defaults:\n  - /schema/grid@_here_\n  - _self_\nworld_size: [2]\n")
    monkeypatch.setattr(compose, "conf_dir", lambda: conf)
    with pytest.raises(ConfigError) as e:
        load_grid("typo")
    assert "grid.world_size: unknown key; did you mean grid.world_sizes?" in str(e.value)
    assert_one_line_unchained(e.value)


def test_the_tools_defaults_are_their_grids():
    from gvq.bench import overlap, validate_clock
    from gvq.predict import structure
    cal, clock, table = load_grid("calibration"), load_grid("clock"), load_grid("overlap")
    assert (list(structure.AGGREGATORS), structure.SETTINGS, structure.structure_ns()) == (
        cal.settings, cal.set, cal.world_sizes)
    assert (validate_clock.AGGREGATORS, validate_clock.SETTINGS) == (clock.settings, clock.set)
    from types import SimpleNamespace
    from gvq.bench.__main__ import COMMANDS
    from gvq.schema.tool import compose_command
    args = overlap.overlap_args(compose_command(COMMANDS["overlap"]), SimpleNamespace(out=None))
    assert (args.aggregators, args.world_size, args.bandwidth, args.compute_scale) == (
        table.settings, table.world_sizes, table.links_bps, table.compute_scales)


def test_every_bench_command_with_a_grid_starts_from_its_file():
    """A command's ``grid`` key composes to conf/grid/<its grid>.yaml, untouched by anything typed in code."""
    import dataclasses

    from omegaconf import OmegaConf

    from gvq.bench.__main__ import COMMANDS
    from gvq.schema.tool import compose_command
    gridded = {name: c for name, c in COMMANDS.items() if c.grid is not None}
    assert {"aggregate", "train", "overlap", "clock", "paper", "netns", "netns-train"} <= set(gridded)
    for name, command in gridded.items():
        composed = OmegaConf.to_container(compose_command(command).grid)
        assert composed == dataclasses.asdict(load_grid(command.grid)), name
