"""python -m gvq.bench quantizers: codec throughput with its setting; the dispatcher of python -m gvq.bench."""
from __future__ import annotations

import pytest
import torch

from gvq.bench.__main__ import main as bench_main
from gvq.bench.quantizers import quantizer_throughput
from gvq.compressors.qsgd import QSGD


def test_quantizer_throughput_reports_every_field_and_restores_threads():
    before = torch.get_num_threads()
    res = quantizer_throughput(QSGD(bits=4), numel=20_000, reps=3)
    assert set(res) >= {"quantize_gbps", "dequantize_gbps", "bytes", "ratio", "ideal_ratio"}
    assert res["quantize_gbps"] > 0 and res["bytes"] == QSGD(bits=4).payload_nbytes(slice(0, 20_000))
    assert torch.get_num_threads() == before          # timed on one thread, then put back


def test_quantizers_subcommand_prints_its_setting_and_ratios(capsys):
    rows = bench_main(["quantizers", "numel=8192", "reps=1", "aggregators=[qsgd,orq]",
                       "set=[qsgd:aggregator.compressor.bits=3]"])
    by = {r["aggregator"]: r for r in rows}
    assert by["qsgd"]["ratio"] == pytest.approx(QSGD(bits=3).ratio(8192))   # the name-scoped override applied
    assert by["orq"]["ratio"] > by["qsgd"]["ratio"] > 1
    assert "8,192 fp32 values, 1 thread" in capsys.readouterr().out


def test_unknown_subcommand_exits_with_usage(capsys):
    with pytest.raises(SystemExit) as e:
        bench_main(["nope"])
    usage = capsys.readouterr().err
    listed = usage.split("{", 1)[1].split("}", 1)[0].split(",")
    assert e.value.code == 2 and sorted(listed) == sorted(["aggregate", "train", "netns", "netns-train", "paper",
                                                           "gpucheck", "overlap", "soak", "quantizers", "clock",
                                                           "startup", "codecs"])


@pytest.mark.slow
def test_histogram_and_sorted_fits_are_timed_side_by_side():
    from gvq.bench.quantizers import alternated_ms
    a_ms, b_ms = alternated_ms(QSGD(bits=4), QSGD(bits=3), numel=20_000, reps=3)
    assert a_ms > 0 and b_ms > 0
    rows = bench_main(["quantizers", "numel=8192", "reps=2", "aggregators=[qsgd,bingrad_b]"])
    by = {r["aggregator"]: r for r in rows}
    assert "sorted_over_histogram" not in by["qsgd"]         # no fitted levels
    b = by["bingrad_b"]                                      # fitted: the histogram fit against fit=sorted
    assert b["sorted_over_histogram"] == pytest.approx(b["quantize_ms_sorted"] / b["quantize_ms_hist_alt"])
