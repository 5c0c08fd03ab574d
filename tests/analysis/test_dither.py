"""Stochastic rounding draws independently within a call and across calls, for every stochastic
quantizer (gvq/analysis/dither.py's statistics; a few seconds), and the check catches draws reused
across calls."""
from __future__ import annotations

import pytest

from gvq.analysis.dither import CONFIGS, LAGS, independence, independence_table, verdict
from gvq.bench.quantizers import laplace_vector

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def test_every_dither_path_draws_independently_across_2000_calls():
    """One quantizer per way to the dither (all share ``dither_floor_``): QSGD and TernGrad directly,
    ORQ through Eq. 7's ``round_to_levels``, BinGrad-pb with its clipping; ``python -m gvq.analysis
    dither`` runs all eleven configurations at 2,048 and 100,000 values."""
    df = independence_table(["qsgd4_max", "terngrad", "orq5", "bingrad_pb"], [2048], calls=2000)
    bad = df[[not verdict(r) for _, r in df.iterrows()]]
    assert bad.empty, bad.to_string()


def test_independent_on_a_100k_vector_too():
    comp = CONFIGS["qsgd4_max"]()
    comp.reseed(1)
    stats = independence(comp, laplace_vector(100_000, seed=1), calls=2000)
    assert verdict(stats), stats


class ReusedDraws:
    """A quantizer whose every draw serves two consecutive calls (reseeded from the call count halved):
    the errors of consecutive calls correlate, as with any scheme that reuses uniforms across calls."""

    def __init__(self, comp):
        self.comp, self.calls = comp, 0

    def compress(self, x, seg):
        self.comp.reseed(self.calls // 2)
        self.calls += 1
        return self.comp.compress(x, seg)

    def decompress(self, payload, seg):
        return self.comp.decompress(payload, seg)


def test_the_check_catches_draws_reused_across_calls():
    comp = ReusedDraws(CONFIGS["qsgd4_max"]())
    stats = independence(comp, laplace_vector(2048, seed=1), calls=2000)
    assert not verdict(stats)
    assert stats["z_lag1"] > 5 or stats["z_block"] > 4, stats
    assert set(f"z_lag{k}" for k in LAGS) <= set(stats)


def test_the_command_refuses_an_unknown_quantizer_or_key_in_one_line(capsys):
    from gvq.analysis.__main__ import main
    assert main(["dither", "quantizers=[qsgd4_max,nope]"]) == 2
    assert capsys.readouterr().err.strip() == ("gvq.analysis: error: quantizers=nope: expected one of "
                                               + ", ".join(CONFIGS))
    assert main(["dither", "call=5"]) == 2
    assert "call: unknown key; did you mean calls?" in capsys.readouterr().err


def test_the_command_writes_what_the_flags_version_wrote(tmp_path):
    """``dither`` through the tool's command line, seeded, writes the table the flags' version wrote for the
    same quantizers, size and calls (tests/records/analysis_dither.json, issue 62)."""
    from gvq.analysis.__main__ import main
    from tests.helpers.records import assert_csv_matches_record
    out = tmp_path / "dither.csv"
    assert main(["dither", "quantizers=[qsgd4_max,orq3,terngrad]", "sizes=[2048]", "calls=100", "block=25",
                 "--out", str(out)]) == 0
    import pandas as pd
    assert_csv_matches_record(pd.read_csv(out), "analysis_dither")
