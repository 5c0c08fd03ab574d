"""The clock's rules live in one place (gvq.run.validate.check_clock), for a run's ``net.*`` keys and for
the benchmarks' ``--clock`` flags alike, each message in its caller's spelling."""
from __future__ import annotations

import argparse

import pytest

from gvq.bench.common import add_clock_args, check_clock_args, clock_label, configure_clock, net_defaults
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


@pytest.mark.parametrize("argv,needle", [
    (["--compute-scale", "2"], "--compute-scale=2: scales apply to the virtual clock only (add --clock=virtual)"),
    (["--clock", "virtual"], "--clock=virtual: there is no link model"),
    (["--clock", "sundial"], "invalid choice: 'sundial'"),
])
def test_the_benchmarks_flags_obey_the_same_rules_in_their_own_spelling(capsys, argv, needle):
    p = _parser()
    with pytest.raises(SystemExit):
        check_clock_args(p, p.parse_args(argv), [None])
    assert needle in capsys.readouterr().err


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_clock_args(p)
    p.add_argument("--set", nargs="*", default=[])
    return p


def test_a_benchmark_takes_every_net_key_through_the_runs_schema():
    """Defaults from the schema (their one home), the clock flags, then --set net.KEY=VALUE: exclusive
    and comm_core can be benchmarked, typed as a run types them."""
    p = _parser()
    args = p.parse_args([])
    check_clock_args(p, args, [None])
    assert args.net == net_defaults() and args.net["clock"] == "wall" and args.net["exclusive"] is True
    args = p.parse_args(["--clock", "virtual", "--compute-scale", "0.5", "--set", "net.comm_core=own",
                         "net.exclusive=false", "qsgd:aggregator.compressor.bits=2"])
    check_clock_args(p, args, [1e9])
    assert {k: args.net[k] for k in ("clock", "compute_scale", "comm_core", "exclusive")} == \
        {"clock": "virtual", "compute_scale": 0.5, "comm_core": "own", "exclusive": False}
    assert clock_label(args.net) == "virtual time (compute x0.5, codec x1, exclusive false, comm_core own)"


@pytest.mark.parametrize("argv,needle", [
    (["--set", "net.comm_cor=own"], "net.comm_cor"),
    (["--set", "net.exclusive=maybe"], "net.exclusive"),
    (["--clock", "virtual", "--set", "net.clock=wall"], "--set net.clock: given by its flag --clock too"),
    (["--set", "net.bandwidth_bps=1e9"], "--set net.bandwidth_bps: a benchmark's link is --bandwidth"),
])
def test_a_bad_net_setting_is_refused_in_one_line(capsys, argv, needle):
    p = _parser()
    with pytest.raises(SystemExit):
        check_clock_args(p, p.parse_args(argv), [1e9])
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1], err


def test_each_rank_configures_its_clock_from_the_net_node(monkeypatch):
    seen = []
    monkeypatch.setattr(clock, "configure", lambda *a: seen.append(a))
    configure_clock({**net_defaults(), "clock": "virtual", "comm_core": "own", "exclusive": False}, "cpu")
    assert seen == [("virtual", 1.0, 1.0, False, "cpu", "own")]
