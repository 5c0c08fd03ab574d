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


BENCHES = ["aggregate", "train", "topk", "netns", "netns-train", "netns-nodes", "paper", "gpucheck", "overlap", "soak",
           "quantizers", "clock", "startup", "codecs", "method-cost"]


def test_unknown_subcommand_exits_with_usage(capsys):
    with pytest.raises(SystemExit) as e:
        bench_main(["nope"])
    usage = capsys.readouterr().err
    listed = usage.split("{", 1)[1].split("}", 1)[0].split(",")
    assert e.value.code == 2 and sorted(listed) == sorted(BENCHES)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_the_benches_with_status_0_before_torch_is_imported(flag):
    """As the other tools' ``--help``: exit 0, the list on stdout; and nothing of torch imported for it
    (its import was most of the 11 s ``--help`` took)."""
    import subprocess
    import sys

    from tests.helpers.cli import ROOT
    r = subprocess.run([sys.executable, "-m", "gvq.bench", flag], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    listed = r.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert sorted(listed) == sorted(BENCHES) and all(f"  {b} " in r.stdout for b in BENCHES)
    probe = ("import sys\nfrom gvq.bench.__main__ import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n"
             "    pass\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "[]", r.stdout[-500:] + r.stderr[-2000:]


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
