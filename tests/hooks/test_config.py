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


@pytest.mark.parametrize("name,key,value", [("gradiveq_pooled", "pool", True),
                                            ("gradiveq_bf16", "basis_dtype", "bfloat16")])
def test_a_derived_option_starts_from_its_base(name, key, value):
    cfg = option_config(name)               # `defaults: [gradiveq]` followed, as the CLI composes it
    assert cfg["_target_"] == "gvq.aggregators.gradiveq.GradiVeQAggregator"
    assert cfg["compressor"][key] == value and cfg["L_t"] == 100
    assert build_aggregator(name).name.startswith("gradiveq")


def test_a_misspelt_override_is_refused_naming_it():
    with pytest.raises(Exception, match="bitz"):
        build_aggregator("qsgd", compressor={"bitz": 2})


def test_an_unknown_name_lists_only_the_options_a_hook_can_run():
    with pytest.raises(ValueError) as e:
        build_aggregator("qsdg")
    offered = str(e.value).split("(one of: ", 1)[1].rstrip(")").split(", ")
    assert {"rar", "qsgd", "powersgd", "gradiveq_pooled"} <= set(offered)
    assert not [o for o in offered if o.startswith("ddp")]     # torch DDP's own: the hook refuses them
    for name in offered:                                        # and every one offered is built
        assert build_aggregator(name).name
