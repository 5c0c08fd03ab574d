"""gvq/schema/columns.py, the one declaration of every logged column: every column an aggregator, the
overlapped wrapper or the runner logs is declared there, docs/columns.md is generated from it, the CSV's
base columns and the bench's come from it, and a skipped step writes each column's declared value."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from hydra.utils import get_class

from gvq.hooks import Overlapped
from gvq.hooks.config import build_aggregator
from gvq.run.logs import BASE_FIELDS, RunLog
from gvq.schema import columns
from gvq.schema.compose import compose

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = sorted(p.stem for p in (ROOT / "conf" / "aggregator").glob("*.yaml"))


@pytest.mark.parametrize("option", OPTIONS)
def test_every_aggregators_columns_are_declared(option):
    cls = get_class(compose([f"aggregator={option}"]).aggregator._target_)
    undeclared = [f for f in cls.extra_fields if f not in columns.BY_NAME]
    assert undeclared == [], f"{option}: declare {undeclared} in gvq/schema/columns.py"


@pytest.mark.parametrize("option", ["rar", "qsgd", "gradiveq"])
def test_the_overlapped_wrappers_columns_are_declared(option):
    wrapped = Overlapped(build_aggregator(option))
    assert [f for f in wrapped.extra_fields if f not in columns.BY_NAME] == []


def test_a_logged_column_that_is_not_declared_is_refused(tmp_path):
    cfg = {"logger": {"csv": True, "wandb": {"enabled": False, "mode": "disabled"}}}
    with pytest.raises(KeyError, match="'made_up_s' is not a declared column"):
        RunLog(tmp_path, ("made_up_s",), cfg, {})


def test_docs_columns_is_the_registry():
    assert columns.docs_table() in (ROOT / "docs" / "columns.md").read_text()


def test_declarations_are_well_formed():
    names = [c.name for c in columns.COLUMNS]
    assert len(names) == len(set(names))
    assert all(c.reduce in columns.REDUCTIONS for c in columns.COLUMNS)
    assert all(c.unit == "s" for c in columns.COLUMNS if c.name.endswith("_s"))
    assert BASE_FIELDS[:3] == ("iteration", "epoch", "phase")          # the CSV's first columns, as before
    assert len({c.wandb_key for c in columns.COLUMNS}) == len(names)


def test_a_skipped_step_writes_each_declared_value():
    row = columns.skipped_row()
    assert row["skipped"] == 1 and row["phase"] == "skipped" and math.isnan(row["train_loss"])
    assert all(row[k] == 0 for k in ("aggregate_s", "compress_s", "decompress_s", "wire_s", "stage_s",
                                     "bytes_sent"))
