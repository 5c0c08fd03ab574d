"""The clock's rules live in one place (gvq.run.validate.check_clock), for a run's ``net.*`` keys and for
the benchmarks' ``net`` keys alike, each message naming its caller's link key."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gvq.bench.common import check_net, clock_label, configure_clock, net_defaults
from gvq.comm import clock
from gvq.run.validate import ConfigError, check_clock


@pytest.mark.parametrize("clock,compute,codec,link,needle", [
    ("wall", 2.0, 1.0, True, "net.compute_scale=2: scales apply to the virtual clock only"),
    ("virtual", 1.0, 0.0, True, "net.codec_scale=0: must be > 0"),
    ("virtual", 1.0, 1.0, False, "net.clock=virtual: there is no link model"),
])
def test_a_broken_clock_rule_names_the_run_key(clock, compute, codec, link, needle):
    with pytest.raises(ConfigError, match=needle):
        check_clock(clock, compute, codec, link)


def test_a_good_clock_passes():
    check_clock("wall", 1.0, 1.0, False)
    check_clock("virtual", 0.25, 0.5, True)


def _bench_net(keys: list[str], links) -> dict:
    """``gvq.bench aggregate``'s ``net`` node composed from ``keys`` and checked against ``links``."""
    from gvq.bench.__main__ import COMMANDS
    from gvq.schema.tool import compose_command, namespace
    net = namespace(compose_command(COMMANDS["aggregate"], keys), SimpleNamespace()).net
    check_net(net, links)
    return net


@pytest.mark.parametrize("keys,needle", [
    (["net.compute_scale=2"], "net.compute_scale=2: scales apply to the virtual clock only (add net.clock=virtual)"),
    (["net.clock=virtual"], "net.clock=virtual: there is no link model to advance the clock; pick a link, e.g. "
                            "grid.links_bps=[1e9]"),
    (["net.bandwidth_bps=1e9"], "net.bandwidth_bps: this benchmark sets it (its links: grid.links_bps)"),
])
def test_the_benchmarks_net_keys_obey_the_same_rules_naming_their_own_link(keys, needle):
    with pytest.raises(ConfigError) as e:
        _bench_net(keys, [None])
    assert str(e.value) == needle


def test_a_benchmark_takes_every_net_key_through_the_runs_schema():
    """Defaults from the schema (their one home), then net.KEY=VALUE: exclusive and comm_core can be
    benchmarked, typed as a run types them."""
    net = _bench_net([], [None])
    assert net == net_defaults() and net["clock"] == "wall" and net["exclusive"] is True
    net = _bench_net(["net.clock=virtual", "net.compute_scale=0.5", "net.comm_core=own", "net.exclusive=false"],
                     [1e9])
    assert {k: net[k] for k in ("clock", "compute_scale", "comm_core", "exclusive")} == \
        {"clock": "virtual", "compute_scale": 0.5, "comm_core": "own", "exclusive": False}
    assert clock_label(net) == "virtual time (compute x0.5, codec x1, exclusive false, comm_core own)"


@pytest.mark.parametrize("keys,needle", [
    (["net.comm_cor=own"], "net.comm_cor"),
    (["net.exclusive=maybe"], "net.exclusive"),
    (["net.clock=sundial"], "net.clock"),
])
def test_a_bad_net_key_is_refused_in_one_line(keys, needle):
    with pytest.raises(ConfigError) as e:
        _bench_net(keys, [1e9])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_each_rank_configures_its_clock_from_the_net_node(monkeypatch):
    seen = []
    monkeypatch.setattr(clock, "configure", lambda *a: seen.append(a))
    configure_clock({**net_defaults(), "clock": "virtual", "comm_core": "own", "exclusive": False}, "cpu")
    assert seen == [("virtual", 1.0, 1.0, False, "cpu", "own")]
