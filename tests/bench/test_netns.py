"""``python -m gvq.bench netns-train`` (and ``netns``): runner and torch DDP iterations behind kernel-shaped
per-rank links.

Root + iproute2 only (network namespaces, veth, tc tbf); skipped elsewhere with the reason."""
from __future__ import annotations

import os
import subprocess

import pytest

from gvq.bench import netns_links
from gvq.bench.__main__ import main as bench_main

pytestmark = pytest.mark.skipif(netns_links.available() is not None,
                                reason=f"kernel shaping: {netns_links.available()}")

AGGS = ["rar", "ddp", "ddp_fp16", "ddp_powersgd"]


def _ours() -> list[str]:
    """Namespaces this process's harness would have made (names carry our pid)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{netns_links.PREFIX}{os.getpid()}")]


@pytest.mark.slow
def test_train_harness_shapes_runner_and_ddp_and_labels_the_link(tmp_path, capsys):
    """N=2, tiny model, 5 Mbit/s: every aggregator in both tables, and the shaped ring really is slowed
    to its link (so the test cannot pass on an unshaped path)."""
    recs = bench_main(["netns-train", "grid.links_bps=[5e6]", "grid.world_sizes=[2]", "model=cnn", "iters=4",
                       "warmup=2", f"grid.settings=[{','.join(AGGS)}]",
                       "grid.set=[ddp_powersgd:aggregator.start_iter=2]", "--out", str(tmp_path / "t.json")])
    loop = {r["aggregator"]: r for r in recs if r["rate_bps"] is None}
    shaped = {r["aggregator"]: r for r in recs if r["rate_bps"] == 5e6}
    assert list(loop) == AGGS and list(shaped) == AGGS
    for r in recs:
        assert r["N"] == 2 and r["iter_s"] > 0 and r["compute_s"] > 0 and r["iters"] == 4
    rar = shaped["rar"]
    assert rar["link"] == "kernel tc tbf, 5 Mbit/s per rank (burst 3000b), N=2"
    # bounds, not ratios of two wall times (a busy host slows either side): 61 kB per rank at 5 Mbit/s is
    # ~0.1 s, which an unshaped loopback path beats several times over, and a busy host only adds to
    assert rar["iter_s"] >= 0.9 * rar["bound_s"]
    assert rar["aggregate_s"] >= 0.9 * rar["bound_s"]            # no faster than its link
    assert shaped["ddp"]["iter_s"] >= 0.9 * shaped["ddp"]["bound_s"]   # DDP's collectives shaped too
    fp16, ddp = shaped["ddp_fp16"], shaped["ddp"]                 # half the bytes on the link, and shaped
    assert fp16["MB_per_rank"] == pytest.approx(ddp["MB_per_rank"] / 2, rel=0.02)
    assert fp16["iter_s"] >= 0.9 * fp16["bound_s"]
    out = capsys.readouterr().out
    assert "# iteration time, kernel tc tbf, 5 Mbit/s per rank (burst 3000b), N=2" in out
    assert "# iteration time, unshaped loopback, N=2" in out and "# summary" in out
    assert _ours() == []


@pytest.mark.slow
def test_train_harness_removes_namespaces_when_a_rank_fails():
    with pytest.raises(RuntimeError, match="a shaped rank failed"):
        bench_main(["netns-train", "grid.links_bps=[5e7]", "grid.world_sizes=[2]", "model=cnn", "iters=1",
                    "loopback=false", "grid.settings=[rar]", "grid.set=[aggregator.no_such_key=1]"])
    assert _ours() == []


@pytest.mark.slow
def test_links_are_removed_when_setup_fails_half_way():
    with pytest.raises(RuntimeError, match="tc qdisc add"):
        with netns_links.Links(2, 5e7, burst="not-a-size"):
            pass
    assert _ours() == []


@pytest.mark.slow
@pytest.mark.skipif(netns_links.available() is not None, reason=f"kernel shaping: {netns_links.available()}")
def test_kernel_shaped_ring_is_bounded_by_the_link(tmp_path):
    """Root only: per-rank veth + tbf really shape (a ring cannot beat its links), and the emulator
    comparison runs end to end."""
    rows = bench_main(["netns", "grid.links_bps=[2e8]", "grid.world_sizes=[2]", "reps=3", "model=resnet20",
                       "--out", str(tmp_path / "n.json")])
    (row,) = rows
    assert row["kernel_over_bound"] >= 0.9 and row["emulated_over_bound"] >= 0.9
    assert 0.2 < row["emulated_over_kernel"] < 5


def test_links_default_to_a_small_bucket():
    """The default tbf bucket is 1 ms of the rate: a large bucket (tc's common 512kb) hands a ~1 MB ring
    half its bytes at line speed, so the shaped ring would beat its own link (CI caught 0.89x)."""
    assert netns_links.Links(2, 2e8).burst == "25000b" and netns_links.Links(2, 1e6).burst == "3000b"
    assert netns_links.Links(2, 2e8, burst="64kb").burst == "64kb"
