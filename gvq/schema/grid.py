"""The typed schema of a benchmark grid (``conf/grid/<name>.yaml``): which settings a tool times or
prices, at which world sizes, on which links, at which compute scales.  The grids are config, typed once
here; the tools read them through :func:`gvq.schema.compose.load_grid`, and a command's ``grid`` key
defaults to its grid (``grid.KEY=VALUE`` on its command line replaces one key).  Stored as ``schema/grid``
by :func:`gvq.schema.config.register`; a grid file names it first, so a misspelt key (``world_size:``) or an
ill-typed value is refused at compose time, in one line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class GridSchema:
    # settings, each OPTION or OPTION:KEY=VALUE[,KEY=VALUE] (gvq.schema.setting.Setting.parse); more =>
    # a longer run
    settings: List[str] = field(default_factory=list)
    # overrides every setting starts from (KEY=VALUE for all, OPTION:KEY=VALUE for one);
    # a setting's own key replaces the same key here
    set: List[str] = field(default_factory=list)
    world_sizes: List[int] = field(default_factory=list)      # ranks N per cell; more => more spawns
    links_bps: List[float] = field(default_factory=list)      # per-rank link, bit/s; lower => the wire dominates
    # net.compute_scale per regime: 1 a CPU cluster, 1/6 the GradiVeQ paper's GPUs; lower => compute
    # hides less communication
    compute_scales: List[float] = field(default_factory=list)
