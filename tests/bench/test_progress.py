"""Every bench says how far it is: a line on stderr as each cell, mode or run is done
(``gvq.bench <bench>: <k>/<n> <what>: <seconds> s``, gvq/bench/__init__.py's Progress), so that minutes of work
are never silent; stdout keeps the tables.  The spawns are stood in for where the line, not the timing, is the
point; the quantizer bench runs for real."""
from __future__ import annotations

import importlib
import inspect
import re
from types import SimpleNamespace

from gvq.bench import Progress
from gvq.bench.__main__ import COMMANDS, main as bench_main

LINE = re.compile(r"^gvq\.bench (?P<bench>[\w-]+): (?P<k>\d+)/(?P<n>\d+) (?P<what>.+): \d+\.\d s$")


def lines(err: str) -> list[tuple[str, int, int, str]]:
    """The progress lines of ``err`` as (bench, k, n, what); every line of it must be one."""
    found = [LINE.match(ln) for ln in err.splitlines()]
    assert all(found), err
    return [(m["bench"], int(m["k"]), int(m["n"]), m["what"]) for m in found]


def test_each_done_is_one_flushed_line_on_stderr_counting_up_to_the_total(capsys):
    shown = Progress("x", 2)
    shown.done("first")
    shown.done("second, timed by its caller", 1.5)
    out = capsys.readouterr()
    assert out.out == "" and lines(out.err) == [("x", 1, 2, "first"), ("x", 2, 2, "second, timed by its caller")]
    assert out.err.endswith("timed by its caller: 1.5 s\n")


def test_every_bench_reports_its_progress():
    """Each command's module builds a Progress (a new bench without one would run silent)."""
    silent = [name for name, c in COMMANDS.items()
              if "Progress(" not in inspect.getsource(importlib.import_module(c.run.partition(":")[0]))]
    assert silent == []


def test_the_quantizer_bench_prints_a_line_per_setting(capsys):
    bench_main(["quantizers", "numel=4096", "reps=1", "aggregators=[qsgd,orq]"])
    assert lines(capsys.readouterr().err) == [("quantizers", 1, 2, "qsgd"), ("quantizers", 2, 2, "orq")]


def test_the_overlap_bench_prints_a_line_per_cell(monkeypatch, capsys):
    from gvq.bench import overlap
    from gvq.bench.train import COLS
    from gvq.schema.tool import compose_command
    monkeypatch.setattr(overlap, "run_iterations",
                        lambda run, world: {"rows": {s.label: [dict.fromkeys(COLS, 0.0)] for s in run.specs}})
    args = overlap.overlap_args(compose_command(COMMANDS["overlap"], [
        "grid.world_sizes=[2,3]", "grid.links_bps=[5e7,1e9]", "grid.compute_scales=[1]", "grid.settings=[rar]"]),
        SimpleNamespace(out=None))
    overlap.run_table(args)
    assert lines(capsys.readouterr().err) == [
        ("overlap", k + 1, 4, f"N={w}, compute x1, {mbps} Mbit/s: 3 modes")
        for k, (w, mbps) in enumerate([(2, 50), (2, 1000), (3, 50), (3, 1000)])]


def test_the_train_and_aggregate_benches_print_a_line_per_world_size_and_link(monkeypatch, capsys):
    from gvq.bench import aggregate, train
    monkeypatch.setattr(train, "run_iterations", lambda args, world: {})
    monkeypatch.setattr(train, "summarize_iterations", lambda raw, args, world, link, rate_bps=None: [{}, {}])
    monkeypatch.setattr(train, "print_iterations", lambda recs, header: None)
    bench_main(["train", "grid.world_sizes=[2,3]", "grid.settings=[rar,torch_ddp]", "net.clock=wall"])
    monkeypatch.setattr(aggregate, "run_aggregation", lambda args: [{}])
    monkeypatch.setattr(aggregate, "print_aggregation", lambda recs: None)
    bench_main(["aggregate", "grid.world_sizes=[4]", "grid.links_bps=[5e7,2e8]"])
    assert lines(capsys.readouterr().err) == [
        ("train", 1, 2, "N=2, unshaped loopback: 2 modes"), ("train", 2, 2, "N=3, unshaped loopback: 2 modes"),
        ("aggregate", 1, 2, "N=4, 50 Mbit/s: 1 settings"), ("aggregate", 2, 2, "N=4, 200 Mbit/s: 1 settings")]


def test_the_clock_and_paper_benches_print_a_line_per_link_and_run(monkeypatch, capsys, tmp_path):
    from gvq.bench import paper
    from gvq.bench import validate_clock as V
    rec = {"median_s": 1.0, "iter_s": 1.0, "compress_s": 1.0, "decompress_s": 1.0}
    monkeypatch.setattr(V, "_aggregation", lambda args, world, bw, clock, pin=False: dict.fromkeys(V.AGGREGATORS, rec))
    monkeypatch.setattr(V, "_iterations", lambda args, bw, clock, pin=False: dict.fromkeys(V.AGGREGATORS, rec))
    monkeypatch.setattr(V.shutil, "which", lambda name: None)
    V.validate_clock(SimpleNamespace(bandwidth=[5e7], model="cnn", reps=1, iters=1))
    monkeypatch.setattr(paper, "run_job", lambda out, w, bps, scale, method, *rest: out / method)
    monkeypatch.setattr(paper.subprocess, "run", lambda cmd, **kw: None)
    bench_main(["paper", "links=[1e9]", "grid.world_sizes=[8]", "grid.compute_scales=[1]",
                "grid.settings=[rar,qsgd]", "--out", str(tmp_path)])
    assert lines(capsys.readouterr().err) == [
        ("clock", 1, 1, "50 Mbit/s: V1, V3"),
        ("paper", 1, 2, f"rar, N=8, 1000 Mbit/s, compute x1 -> {tmp_path / 'rar'}"),
        ("paper", 2, 2, f"qsgd, N=8, 1000 Mbit/s, compute x1 -> {tmp_path / 'qsgd'}")]
