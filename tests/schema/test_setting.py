"""gvq/schema/setting.py: one setting parsed, named, round-tripped and aliased as the bench, the cost model
and the report all read it; a bench record's typed key; an old-format bench JSON read through it."""
from __future__ import annotations

import json

import pytest

from gvq.schema.setting import (BENCH_VERSION, BenchKey, Setting, aliases, canonical, canonical_name, name_of,
                                read_bench, split_name)


def test_a_setting_parses_the_benches_syntax_and_starts_from_the_common_overrides():
    assert Setting.parse("qsgd:compressor.bits=2") == Setting("qsgd", ("aggregator.compressor.bits=2",))
    common = ["K=x1", "powersgd:aggregator.rank=6", "qsgd:aggregator.compressor.bits=8"]
    assert Setting.parse("powersgd", common).overrides == ("K=x1", "aggregator.rank=6")
    # the entry's own key replaces the common one of the same key
    assert Setting.parse("powersgd:rank=8", common).overrides == ("K=x1", "aggregator.rank=8")
    for bad in ("qsgd:", "qsgd:bits", "qsgd:=2", ":bits=2"):
        with pytest.raises(ValueError, match="OPTION:KEY=VALUE"):
            Setting.parse(bad)


def test_a_setting_is_named_as_the_report_names_runs():
    assert Setting.parse("qsgd:compressor.bits=2").name == "qsgd bits=2"
    assert Setting.parse("powersgd", ["powersgd:aggregator.rank=4"]).name == "powersgd rank=4"
    assert Setting.parse("powersgd").name == "powersgd"
    assert name_of("g", ["aggregator.a=True", "aggregator.b=8.0", "aggregator.c=null", "K=x1"]) == "g a=true b=8 c=null"
    # the variant's keys are not the setting: it travels beside the name
    over = Setting("g", ("aggregator.overlap=true", "aggregator.bucket_cap_mb=0.25", "aggregator.b=2"), "overlap")
    assert over.name == "g b=2" and over.variant == "overlap"
    assert name_of("signsgd", ["aggregator._target_=gvq.aggregators.error_feedback.ErrorFeedbackAggregator"]
                   ) == "signsgd _target_=ErrorFeedbackAggregator"
    assert split_name("qsgd bits=2 stochastic=true") == ("qsgd", [("bits", "2"), ("stochastic", "true")])


def test_a_settings_canonical_name_carries_every_value_that_differs_from_its_options_defaults_and_no_other():
    """The name every tool keys figures by: a grid's ``set`` is part of it (PowerSGD at rank 6 is never
    ``powersgd``), a default written out is not (QSGD's 4 bits, gradiveq_pooled's K/d = 8)."""
    assert Setting.parse("powersgd", ["K=x1", "powersgd:aggregator.rank=6"]).canonical == "powersgd rank=6"
    assert Setting.parse("powersgd", ["powersgd:aggregator.rank=2"]).canonical == "powersgd"
    assert Setting.parse("qsgd:compressor.bits=4").canonical == "qsgd"
    assert canonical_name("qsgd", ["aggregator.compressor.bits=2", "aggregator.compressor.norm=max"]) == "qsgd bits=2"
    assert canonical_name("qsgd", ["aggregator.compressor.bits=2", "aggregator.compressor.bits=4"]) == "qsgd"
    assert canonical("qsgd bits=4 norm=l2") == "qsgd norm=l2"          # a typed (enum) key compared by its name
    assert canonical("gradiveq_pooled target_ratio=8") == "gradiveq_pooled"
    assert canonical("signsgd _target_=ErrorFeedbackAggregator") == "signsgd _target_=ErrorFeedbackAggregator"
    assert canonical("qsgd new_key=null") == "qsgd new_key=null"        # a key the option lacks is a value it sets
    assert canonical_name("qsgd", ["aggregator.overlap=true", "aggregator.compressor.bits=2"]) == "qsgd bits=2"
    assert canonical("torch_ddp") == "torch_ddp"                       # no option file: nothing to compare


@pytest.mark.parametrize("entry", ["rar", "qsgd:compressor.bits=2", "gradiveq:warmup_by=qsgd,samples_in_warmup=true"])
def test_an_entry_round_trips_through_the_setting(entry):
    s = Setting.parse(entry)
    assert s.entry == entry and Setting.parse(s.entry) == s


def test_a_default_written_out_is_an_alias_of_the_setting_at_its_default():
    assert aliases(["qsgd", "qsgd:compressor.bits=2", "gradiveq:samples_in_warmup=true", "gradiveq"]) == {
        "qsgd bits=4": "qsgd", "gradiveq samples_in_warmup=false": "gradiveq"}
    assert aliases(["powersgd", "powersgd:rank=8"], ["powersgd:aggregator.rank=4"]) == {}


def test_a_bench_record_is_keyed_by_cell_and_mode_and_equals_the_plain_tuple():
    rec = {"N": 4, "compute_scale": 1 / 6, "link_Mbps": 50.0, "setting": "qsgd bits=2", "variant": "post"}
    key = BenchKey.of(rec)
    assert key == (4, 0.1667, 50.0, "qsgd bits=2", "post") and key.setting == "qsgd bits=2"
    assert BenchKey.of(rec, "qsgd bits=2 stochastic=false").setting == "qsgd bits=2 stochastic=false"


def test_a_bench_json_of_the_old_format_still_loads(tmp_path):
    """Written before ``version`` (and, older still, before records carried their setting's name)."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"setting": {"model": "resnet20", "aliases": {"qsgd bits=4": "qsgd"}}, "modes": [
        {"N": 4, "compute_scale": 1.0, "link_Mbps": 50.0, "aggregator": "qsgd", "setting": "qsgd",
         "variant": "post", "iter_s": 0.5},
        {"N": 4, "compute_scale": 1.0, "link_Mbps": 50.0, "aggregator": "rar", "variant": "post", "iter_s": 0.9}],
        "cells": []}))
    bench = read_bench(json.loads(path.read_text()))
    assert bench["version"] == 1 and [r["setting"] for r in bench["modes"]] == ["qsgd", "rar"]
    from gvq.report.tta import bench_seconds, merge_benches
    secs = bench_seconds(merge_benches([(str(path), json.loads(path.read_text()))]))
    assert secs[(4, 1.0, 50.0, "qsgd bits=4", "post")] == pytest.approx(0.5)
    assert secs[(4, 1.0, 50.0, "rar", "post")] == pytest.approx(0.9)
    with pytest.raises(ValueError, match="newer"):
        read_bench({"version": BENCH_VERSION + 1, "modes": []})


def test_an_entry_yaml_read_as_a_mapping_is_one_line_not_a_traceback(capsys):
    """``grid.settings=[qsgd:]``: YAML reads ``qsgd:`` inside a list as a mapping, which the list's type
    lets through; the bench says so in one line, naming the key, and how to write it."""
    from gvq.bench.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["overlap", "grid.settings=[qsgd:]"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("gvq.bench: error: grid.settings {'qsgd': None}: not OPTION") and "quote" in err
