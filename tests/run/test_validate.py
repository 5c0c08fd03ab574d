"""The clock's rules live in one place (gvq.run.validate.check_clock), for a run's ``net.*`` keys and for
the benchmarks' ``--clock`` flags alike, each message in its caller's spelling."""
from __future__ import annotations

import argparse

import pytest

from gvq.bench.common import add_clock_args, check_clock_args
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
    p = argparse.ArgumentParser()
    add_clock_args(p)
    with pytest.raises(SystemExit):
        check_clock_args(p, p.parse_args(argv), [None])
    assert needle in capsys.readouterr().err
