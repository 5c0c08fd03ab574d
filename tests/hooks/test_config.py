"""gvq/hooks/config.py: a user's script builds any conf/aggregator ring option by name, with overrides,
interpolations resolved as the CLI resolves them; torch DDP's options and unknown names are refused."""
from __future__ import annotations

import pytest

from gvq.hooks.config import build_aggregator, option_config


def test_an_option_by_name_with_overrides():
    agg = build_aggregator("qsgd", compressor={"bits": 2})
    assert agg.compressor.levels == 3 and agg.name == "qsgd"          # 2 bits: 2^2 - 1 levels


def test_gradiveqs_interpolations_resolve_against_the_run_config():
    cfg = option_config("gradiveq")
    assert cfg["compressor"]["lam"] == 0.01 and cfg["L_t"] == 100 and "defaults" not in cfg


@pytest.mark.parametrize("name,message", [("ddp", "not a gvq ring aggregator"), ("nope", "no aggregator option")])
def test_what_is_not_a_gvq_ring_option_is_refused(name, message):
    with pytest.raises(ValueError, match=message):
        build_aggregator(name)
