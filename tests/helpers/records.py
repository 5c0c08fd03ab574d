"""What a tool's CSV or JSON records held before issue 62 typed its keys
(``tests/records/<tool>_<command>.json``), and the check that the converted command still writes them.

A JSON records file (a bench's ``--out``) holds ``command``, ``fields`` (each record's, in order),
``timing`` (the fields left out of ``records``) and ``records``: per record, every timing-free value.
A CSV record file holds ``command`` (how it was made: the flags' command line and the commit), ``columns`` (the
CSV's, in order), ``timing`` (the columns left out of the rows: they measure the machine) and ``rows``: per
CSV row, every value that does not depend on timing (``null`` for an empty cell).  A value the run does not
settle (a comparison of two floating-point round-off figures) is left out of its row."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

RECORDS = Path(__file__).parents[1] / "records"


def load_record(name: str) -> dict:
    return json.loads((RECORDS / f"{name}.json").read_text())


def assert_csv_matches_record(df: pd.DataFrame, name: str, rel: float = 1e-4, abs_: float = 1e-9) -> None:
    """``df`` (a CSV as read back) has the record's columns and rows, each held value equal (floats
    within ``rel`` / ``abs_``: thread counts and BLAS builds change the last digits)."""
    record = load_record(name)
    assert list(df.columns) == record["columns"], name
    assert len(df) == len(record["rows"]), name
    for i, (got, want) in enumerate(zip(df.to_dict("records"), record["rows"])):
        for key, value in want.items():
            assert _same(got[key], value, rel, abs_), f"{name} row {i} {key}: {got[key]!r}, recorded {value!r}"


def _same(got, want, rel: float, abs_: float) -> bool:
    empty = got is None or (isinstance(got, float) and math.isnan(got))
    if want is None or empty:
        return want is None and empty
    if isinstance(want, float) and not isinstance(got, (bool, str)):
        return got == pytest.approx(want, rel=rel, abs=abs_)
    return got == want


def assert_records_match(records: list[dict], name: str, rel: float = 1e-6, abs_: float = 1e-12) -> None:
    """``records`` (a bench's ``--out``) have the record file's fields in order and, record by record, its
    timing-free values (floats within ``rel`` / ``abs_``)."""
    record = load_record(name)
    assert len(records) == len(record["records"]), name
    for i, (got, want) in enumerate(zip(records, record["records"])):
        assert list(got) == record["fields"], f"{name} record {i}: fields {list(got)}"
        for key, value in want.items():
            assert _same(got[key], value, rel, abs_), f"{name} record {i} {key}: {got[key]!r}, recorded {value!r}"
