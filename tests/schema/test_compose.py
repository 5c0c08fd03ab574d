"""gvq/schema/compose.py: the option files are found from the package (a checkout's conf/ here; a
wheel's gvq/conf/ is tested by tests/test_wheel.py), and compose() refuses as the CLI does, in one line."""
from __future__ import annotations

import pytest

from gvq.schema.compose import compose, conf_dir
from gvq.schema.errors import ConfigError
from tests.helpers.cli import ROOT
from tests.helpers.errors import assert_one_line_unchained


def test_a_checkouts_conf_is_found_beside_the_package():
    assert conf_dir() == ROOT / "conf"


def test_compose_is_the_clis_composition(compose_cfg):
    ours = compose(["aggregator=qsgd", "lambda=0.05", "aggregator.compressor.bits=2"])
    assert ours == compose_cfg("aggregator=qsgd", "lambda=0.05", "aggregator.compressor.bits=2")


@pytest.mark.parametrize("overrides,line", [
    (["aggregator=qsdg"], "aggregator=qsdg: no such option; did you mean aggregator=qsgd? options: "),
    (["lamda=0.05"], "lamda: unknown key; did you mean lambda? allowed: "),
    (["aggregator=qsgd", "aggregator.compressor.bits=abc"], "aggregator.compressor.bits=abc: expected integer"),
])
def test_a_bad_override_raises_the_clis_line(overrides, line):
    with pytest.raises(ConfigError) as e:
        compose(overrides)
    assert str(e.value).startswith(line)
    assert_one_line_unchained(e.value)


def test_overrides_for_reads_a_scope_as_the_bench_applies_it_and_the_report_checks_it():
    """``key=value`` is every option's, ``option:key=value`` that option's alone (scope stripped); a ':'
    in a value is no scope; ``scoped_only`` keeps just the scoped ones (what names a bench mode)."""
    from gvq.schema.setting import overrides_for
    sets = ["L_t=50", "powersgd:aggregator.rank=4", "gradiveq:aggregator.warmup_by=qsgd",
            "gradiveq_bf16:aggregator.compressor.K=x1", "hydra.run.dir=a:b"]
    assert overrides_for("gradiveq", sets) == ["L_t=50", "aggregator.warmup_by=qsgd", "hydra.run.dir=a:b"]
    assert overrides_for("powersgd", sets, scoped_only=True) == ["aggregator.rank=4"]
    assert overrides_for("rar", sets) == ["L_t=50", "hydra.run.dir=a:b"]
    assert overrides_for("rar", sets, scoped_only=True) == []


def test_a_composition_is_made_once_and_every_caller_gets_its_own_copy():
    """compose() keeps each distinct override list's config for the process (the hook and the tools
    compose the same options again and again); a caller that changes its copy changes no other."""
    first = compose(["aggregator=qsgd", "lambda=0.05"])
    first.aggregator.compressor.bits = 7
    first.optim.lr = 123.0
    again = compose(["aggregator=qsgd", "lambda=0.05"])
    assert again.aggregator.compressor.bits != 7 and again.optim.lr != 123.0
    assert again is not first and again.aggregator is not first.aggregator
    for _ in range(2):                         # a refusal is never kept: raised each time
        with pytest.raises(ConfigError):
            compose(["aggregator=qsdg"])
