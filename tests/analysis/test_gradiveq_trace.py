"""gvq/analysis/gradiveq_trace.py: the codec's error agrees with an independent float64 reference of Eq. 3-6,
and the trace separates a stale mean from a basis that misses the gradient."""
from __future__ import annotations

import pytest
import torch

from gvq.analysis.gradiveq_trace import summarise, trace

SHAPES = [torch.Size((8, 4, 1, 3)), torch.Size((8,)), torch.Size((16, 8, 1, 3))]   # one slice a layer (K = F*D*W)


def _grads(n_fit: int, n_eval: int, shrink: float, seed: int = 0) -> list[torch.Tensor]:
    """Model-order flat gradients: a fixed direction plus noise in a few directions while fitting, then
    the same structure scaled by ``shrink`` (a gradient that got smaller once the task was learned)."""
    g = torch.Generator().manual_seed(seed)
    numel = sum(s.numel() for s in SHAPES)
    mean, basis = torch.randn(numel, generator=g), torch.randn(6, numel, generator=g)
    out = []
    for t in range(n_fit + n_eval):
        scale = 1.0 if t < n_fit else shrink
        out.append(scale * (mean + torch.randn(6, generator=g) @ basis) + 0.01 * torch.randn(numel, generator=g))
    return out


def test_codec_error_equals_the_reference_and_a_stale_mean_shows_as_mean_share():
    df = trace(_grads(20, 30, shrink=1.0), SHAPES, warmup=0, L_t=20, L_c=30)
    assert set(df.iteration) == set(range(20, 50)) and set(df.layer) == {0, 2}
    assert df.err.values == pytest.approx(df.ref_err.values, rel=1e-3, abs=1e-6)   # gvq's Eq. 3-6 is the paper's
    assert df.err.median() < 0.05 and df.captured.median() > 0.9                   # same distribution: fits
    shrunk = trace(_grads(20, 30, shrink=0.01), SHAPES, warmup=0, L_t=20, L_c=30)
    assert shrunk.err.values == pytest.approx(shrunk.ref_err.values, rel=1e-3, abs=1e-6)
    assert shrunk.mean_share.median() > 100 and shrunk.err.median() > 10          # the stale mean dominates
    assert shrunk.err_no_mean.median() < 0.5 < 10 < shrunk.err.median()           # without the mean: no blow-up
    table = summarise(shrunk, window=10)
    assert len(table) == 3 and table["err (codec)"].iloc[0] == pytest.approx(table["err (reference)"].iloc[0], rel=1e-3)


def test_too_few_gradients_is_refused():
    with pytest.raises(ValueError, match="need more than warmup"):
        trace(_grads(5, 0, 1.0), SHAPES, warmup=0, L_t=5, L_c=10)


def test_the_command_traces_a_short_run_as_the_flags_version_did(tmp_path):
    """``gradiveq_trace`` end to end on digits (5 warm-up, 10 fitting, 5 compressed iterations): the rows
    (iteration, layer, K, d) and columns the flags' version wrote (tests/records/analysis_gradiveq_trace.json,
    issue 62), and the codec's error equal to the float64 reference's."""
    import pandas as pd

    from gvq.analysis.__main__ import main
    from tests.helpers.records import assert_csv_matches_record
    assert main(["gradiveq_trace", "dataset=digits", "warmup=5", "L_t=10", "L_c=5", "--out", str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "trace.csv")
    assert_csv_matches_record(df, "analysis_gradiveq_trace")
    assert df.err.to_numpy() == pytest.approx(df.ref_err.to_numpy(), rel=1e-5)
