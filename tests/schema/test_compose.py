"""gvq/schema/compose.py: the option files are found from the package (a checkout's conf/ here; a
wheel's gvq/conf/ is tested by tests/test_wheel.py), and compose() refuses as the CLI does, in one line."""
from __future__ import annotations

import pytest

from gvq.schema.compose import compose, conf_dir
from gvq.schema.errors import ConfigError
from tests.helpers.cli import ROOT


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
    assert str(e.value).startswith(line) and "\n" not in str(e.value)
