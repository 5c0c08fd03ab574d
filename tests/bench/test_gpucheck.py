"""``python -m gvq.bench gpucheck`` on a CPU machine: the plan, the judges and the table with stand-in
results (a runner that returns outcomes instead of running subprocesses), and the one-line refusal where no
CUDA device is visible.  The real runs happen on a GPU machine (``make gpu-check``)."""
from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from gvq.bench import gpucheck
from gvq.bench.__main__ import main as bench_main
from gvq.bench.gpucheck.judge import Check, Proc, first_error, judge_cli, judge_tests, outcome

ROOT = gpucheck.ROOT


def run(argv: list[str], runner, gpus: int = 1) -> list[dict]:
    """``python -m gvq.bench gpucheck <argv>`` composed as the tool composes it, with ``runner`` and ``gpus``
    standing in for the subprocesses and the machine."""
    from types import SimpleNamespace

    from gvq.bench.__main__ import COMMANDS
    from gvq.schema.tool import parse_command
    args, cfg = parse_command("python -m gvq.bench gpucheck", COMMANDS["gpucheck"], argv)
    return gpucheck.bench_gpucheck(cfg, SimpleNamespace(out=args.out), runner, gpus)
OPTIONS = {p.stem for p in (ROOT / "conf" / "aggregator").glob("*.yaml")}


def test_without_cuda_it_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(SystemExit) as e:
        bench_main(["gpucheck", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("gvq.bench: error: no CUDA device is visible: torch ")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []                        # nothing planned, nothing written


def test_why_no_gpu_names_a_hiding_variable_or_a_missing_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpucheck.visible_gpus() == (0, "CUDA_VISIBLE_DEVICES='' hides every GPU")
    monkeypatch.setitem(sys.modules, "torch", None)              # import torch raises ImportError
    gpus, why = gpucheck.visible_gpus()
    assert gpus == 0 and why.startswith("torch is not importable by ")


def _planned(checks: list[Check], world: int) -> dict[str, Check]:
    return {re.search(r"aggregator=(\w+)", " ".join(c.argv)).group(1): c for c in checks
            if f"world_size={world}" in c.argv}


def test_every_aggregator_option_is_planned_at_world_size_1_and_3(tmp_path):
    """One GPU: world 1 on NCCL, world 3 the shared plan, where torch DDP must be refused."""
    checks = gpucheck.cli_plan(tmp_path, gpus=1)
    assert len(checks) == 2 * len(OPTIONS) and len({c.path for c in checks}) == len(checks)
    one, three = _planned(checks, 1), _planned(checks, 3)
    assert set(one) == set(three) == OPTIONS
    assert all(c.expect == {"plan": "nccl"} for c in one.values())
    assert {n for n, c in three.items() if "refusal" in c.expect} == {n for n in OPTIONS if n.startswith("ddp")}
    assert all(c.expect == {"plan": "shared"} for n, c in three.items() if not n.startswith("ddp"))
    for c in checks:
        assert {"device=cuda", "logger=csv"} <= set(c.argv) and f"hydra.run.dir={c.path}" in c.argv
        assert c.path.startswith(str(tmp_path)) and c.timeout_s > 0
    assert all(c.expect == {"plan": "nccl"} for c in gpucheck.cli_plan(tmp_path, gpus=3))  # a GPU per rank


def _stand_in(check: Check) -> list[dict]:
    """What the runs might report: qsgd fails with a traceback's last line, powersgd times out."""
    if "aggregator=qsgd" in check.argv:
        return [outcome(check, "failed", 2.0, "RuntimeError: a host | tensor")]
    if "aggregator=powersgd" in check.argv:
        return [outcome(check, "timeout", 300.0, "killed after 300 s")]
    return [outcome(check, "passed", 1.5)]


def test_the_table_counts_stand_in_outcomes_and_fails_the_exit(tmp_path, capsys):
    argv = ["part=[cli]", "--out", str(tmp_path), "aggregators=[rar,qsgd,powersgd,ddp]"]
    with pytest.raises(SystemExit) as e:
        run(argv, _stand_in)
    assert e.value.code == 1
    out = capsys.readouterr().out
    table = (tmp_path / "gpucheck.md").read_text()
    assert table.strip() in out and out.count("| check | setting |") == 1          # one table, printed
    assert "4 passed, 2 failed, 2 timeout, 0 skipped" in table
    assert "| cli.py device=cuda | aggregator=qsgd world_size=1 (nccl) | failed | 2.0 | RuntimeError: a host \\| " \
           "tensor |" in table                                                    # a | in an error stays one cell
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    assert len(data["rows"]) == 8 and data["parts"][0]["part"] == "cli"
    # the keys given, in key order whatever order they were typed in, quoted for a shell (brackets glob)
    assert data["parts"][0]["command"] == \
        "python -m gvq.bench gpucheck 'part=[cli]' 'aggregators=[rar,qsgd,powersgd,ddp]'"


def test_parts_run_apart_merge_into_one_table(tmp_path):
    run(["part=[cli]", "--out", str(tmp_path), "aggregators=[rar]", "world_sizes=[3]"], _stand_in)
    rows = run(["part=[codecs]", "--out", str(tmp_path), "codecs=[qsgd,fp16]"], _stand_in)
    assert [r["setting"] for r in rows] == ["qsgd, cuda", "fp16, cuda"]
    table = (tmp_path / "gpucheck.md").read_text()
    assert "- cli: " in table and "- codecs: " in table and "3 passed, 0 failed" in table
    assert "aggregator=rar world_size=3 (shared)" in table


def test_a_check_run_again_keeps_its_newest_row(tmp_path):
    """World sizes run apart both stay; a later run of the same check replaces its row, not the others."""
    for world in ("1", "3"):
        run(["part=[cli]", "--out", str(tmp_path), "aggregators=[rar]", f"world_sizes=[{world}]"], _stand_in)
    with pytest.raises(SystemExit):
        run(["part=[cli]", "--out", str(tmp_path), "aggregators=[qsgd,rar]", "world_sizes=[1]"],
            lambda c: [outcome(c, "failed", 1.0, "E: later")])
    rows = json.loads((tmp_path / "gpucheck.json").read_text())["rows"]
    assert [(r["setting"], r["result"]) for r in rows] == [
        ("aggregator=rar world_size=1 (nccl)", "failed"), ("aggregator=rar world_size=3 (shared)", "passed"),
        ("aggregator=qsgd world_size=1 (nccl)", "failed")]
    assert (tmp_path / "gpucheck.md").read_text().count("\n- cli: ") == 2      # the first run's rows are all superseded


def test_an_unknown_aggregator_or_part_is_one_line(tmp_path):
    from gvq.schema.errors import ConfigError
    with pytest.raises(ConfigError, match="^aggregators=nope: expected one of .*rar"):
        run(["part=[cli]", "--out", str(tmp_path), "aggregators=[nope]"], _stand_in)
    with pytest.raises(ConfigError, match="^part=gpu: expected one of tests, codecs, cli$"):
        run(["part=[gpu]", "--out", str(tmp_path)], _stand_in)


def _cli_check(tmp_path, **expect) -> Check:
    return Check("cli", "cli.py device=cuda", "s", [], 60, expect, str(tmp_path))


def test_a_cli_run_passes_only_completed_identical_and_on_its_plan(tmp_path):
    ok = Proc(0, "", "", 3.0, False)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "replicas_identical": True,
                                                       "cuda_plan": "shared"}))
    assert judge_cli(_cli_check(tmp_path, plan="shared"), ok)[0]["result"] == "passed"
    wrong = judge_cli(_cli_check(tmp_path, plan="nccl"), ok)[0]
    assert wrong["result"] == "failed" and wrong["detail"] == "replicas_identical=True, cuda_plan=shared"
    crash = Proc(1, "", "Traceback (most recent call last):\n  File x\n    raise E\nValueError: boom\n", 1.0, False)
    assert judge_cli(_cli_check(tmp_path, plan="shared"), crash)[0]["detail"] == "ValueError: boom"


def test_ddp_on_shared_gpus_passes_only_as_a_one_line_refusal(tmp_path):
    check = _cli_check(tmp_path, refusal=gpucheck.DDP_REFUSAL)
    line = f"gvq: config error: aggregator=ddp with device=cuda: 3 ranks, 1 GPU; {gpucheck.DDP_REFUSAL}\n"
    refused = judge_cli(check, Proc(2, "", line, 1.0, False))[0]
    assert refused["result"] == "passed" and refused["detail"].startswith("refused as expected: gvq: config error")
    assert judge_cli(check, Proc(2, "", "Traceback\n" + line, 1.0, False))[0]["result"] == "failed"
    assert judge_cli(check, Proc(0, "", "", 1.0, False))[0]["detail"] == "expected a one-line refusal: it ran"


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.run.test_placement" name="test_a[1]" time="12.5"/>
<testcase classname="tests.run.test_placement" name="test_a[3]" time="3.0">
  <failure message="AssertionError: status failed&#10;assert False">long text</failure></testcase>
<testcase classname="tests.bench.test_train" name="test_b" time="0.0">
  <skipped type="pytest.skip" message="no CUDA device visible"/></testcase>
</testsuite></testsuites>"""


def test_the_cuda_tests_are_rows_from_pytests_junit_xml(tmp_path):
    (tmp_path / "t.xml").write_text(JUNIT)
    check = Check("tests", "pytest -m cuda", "every CUDA test", [], 60, path=str(tmp_path / "t.xml"))
    rows = judge_tests(check, Proc(1, "", "", 20.0, False))
    assert [(r["setting"], r["result"], r["detail"]) for r in rows] == [
        ("tests.run.test_placement::test_a[1]", "passed", ""),
        ("tests.run.test_placement::test_a[3]", "failed", "AssertionError: status failed"),
        ("tests.bench.test_train::test_b", "skipped", "no CUDA device visible")]
    (tmp_path / "t.xml").unlink()
    deselected = judge_tests(check, Proc(5, "", "", 2.0, False))           # -k left none in this file
    assert [(r["result"], r["detail"]) for r in deselected] == [("skipped", "no CUDA test selected")]
    broken = judge_tests(check, Proc(4, "", "ERROR: file or directory not found: x\n", 2.0, False))
    assert [(r["result"], r["detail"]) for r in broken] == [("failed", "ERROR: file or directory not found: x")]


def test_first_error_prefers_gvqs_line_then_the_exception():
    assert first_error("gvq: warning: x\nW0 something\ngvq: run failed: rank 1: E\n") == \
        "gvq: run failed: rank 1: E"
    assert first_error("noise\n  raise ConfigError(x)\ntorch.AcceleratorError: CUDA error\n") == \
        "torch.AcceleratorError: CUDA error"
    assert first_error("just\nlast\n") == "last" and first_error("") == ""


def test_a_check_past_its_limit_is_killed_and_reported(tmp_path):
    """The real runner: a subprocess that outlives its limit is killed with its group; a failing one is
    reported by its error line."""
    sleeper = Check("codecs", "gvq.bench codecs", "s", [sys.executable, "-c", "import time; time.sleep(60)"], 1,
                    path=str(tmp_path / "c" / "x.json"))
    (killed,) = gpucheck.run_check(sleeper)
    assert killed["result"] == "timeout" and killed["detail"] == "killed after 1 s"
    failing = Check("codecs", "gvq.bench codecs", "s",
                    [sys.executable, "-c", "raise ValueError('boom')"], 60, path=str(tmp_path / "c" / "y.json"))
    assert gpucheck.run_check(failing)[0]["detail"] == "ValueError: boom"


def test_every_test_that_skips_without_cuda_is_in_the_tests_part(tmp_path):
    """Each file whose tests skip where no GPU is visible marks them ``cuda``, and gets a pytest run."""
    skipping = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                if re.search(r"skipif\(\s*not torch\.cuda\.is_available\(\)", p.read_text())}
    files = gpucheck.cuda_test_files()
    assert skipping <= set(files) and "tests/run/test_placement.py" in files
    checks = gpucheck.tests_plan(tmp_path, k="resume")
    assert [c.argv[c.argv.index("-k") - 1] for c in checks] == files
    assert all({"-m", "cuda"} <= set(c.argv) and c.path.startswith(str(tmp_path)) for c in checks)


def test_checks_run_several_at_a_time_and_keep_plan_order(tmp_path):
    """--jobs: checks overlap (the whole check fits one bounded command), rows and the table keep plan order."""
    import threading
    live, peak, lock, beside = [0], [0], threading.Lock(), threading.Event()

    def slow(check):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            if live[0] > 1:
                beside.set()
        # held until a second check runs beside it (not a fixed sleep, which a busy host outlasts); a
        # runner that never overlaps leaves each check here 10 s and fails the test below
        beside.wait(10)
        with lock:
            live[0] -= 1
        return _stand_in(check)

    argv = ["part=[cli]", "--out", str(tmp_path), "jobs=4", "aggregators=[rar,qsgd,fp16]"]
    with pytest.raises(SystemExit):                      # the stand-in fails some checks on purpose
        run(argv, slow)
    serial = tmp_path / "serial"
    with pytest.raises(SystemExit):
        run(["part=[cli]", "--out", str(serial), "jobs=1", "aggregators=[rar,qsgd,fp16]"], _stand_in)
    assert peak[0] > 1
    rows = json.loads((tmp_path / "gpucheck.json").read_text())["rows"]
    serial_rows = json.loads((serial / "gpucheck.json").read_text())["rows"]
    assert [r["setting"] for r in rows] == [r["setting"] for r in serial_rows]
