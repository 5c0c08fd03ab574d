"""``report.html``: one self-contained page (figures inlined as base64 PNG) with the summary table, time to
the target, the accuracy-cost frontier, the figures and the run dirs."""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pandas as pd

CSS = """body{font-family:sans-serif;margin:2em;max-width:1300px}
table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #bbb;padding:3px 7px;text-align:right}td:nth-child(-n+4),th{text-align:left}
tr.failed td{background:#fdd}tr.incomplete td{background:#ffe9c4}.setting{background:#eef;padding:6px}
.warn{color:#a00}img{max-width:100%}figcaption{font-size:12px;color:#444}"""


@dataclass
class Sections:
    """What the page shows besides its setting and runs: the summary (``display``, the numeric ``table``
    whose statuses colour its rows, ``note``), figures ((path, caption) pairs), time to the target (a
    display table) and the frontier ((display table, its PNG, its quality axis: accuracy or bpb), None where
    there is none)."""
    display: pd.DataFrame
    table: pd.DataFrame
    note: str
    figures: list
    time_to_target: pd.DataFrame
    frontier: tuple | None


def html_table(display: pd.DataFrame, statuses=None, table_id: str = "summary") -> str:
    """``display`` as an HTML table; ``statuses``: each row's class (failed and incomplete rows coloured)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in display.columns)
    statuses = list(statuses) if statuses is not None else [""] * len(display)
    body = []
    for (_, row), status in zip(display.iterrows(), statuses):
        cells = "".join(f"<td>{html.escape(str(v))}</td>" for v in row)
        body.append(f'<tr class="{html.escape(status)}">{cells}</tr>')
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _img(path: Path, alt: str, setting: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(alt)}. Setting: {html.escape(setting)}</figcaption></figure>")


def _target_and_frontier(s: Sections, setting: str) -> list[str]:
    from gvq.report.frontier import FRONTIER_NOTE
    parts = ["<h2>Time to target</h2>"]
    parts += [html_table(s.time_to_target, table_id="time-to-target"),
              "<p>Seconds on each run's clock to its first evaluation at or beyond the target, iteration 0's "
              "one-off start-up left out (it counts as a typical iteration); mean ± std over the seeds that "
              "reached it.</p>"] if len(s.time_to_target) else ["<p>No completed run.</p>"]
    if s.frontier is None:
        return [*parts, "<h2>Accuracy-cost frontier</h2>", "<p>No completed setting with its bytes logged.</p>"]
    shown, png, axis = s.frontier
    return [*parts, f"<h2>{html.escape(axis.title)}</h2>", html_table(shown, table_id="frontier"),
            f"<p>{html.escape(FRONTIER_NOTE)}.</p>",
            _img(png, f"{axis.label[0].upper()}{axis.label[1:]} and iterations to the target against MB a rank "
                 "sends per iteration", setting)]


def write_html(path: Path, title: str, setting: str, s: Sections, groups) -> Path:
    bad = [f"<li>{html.escape(r.status)}: {html.escape(str(r.path))} ({html.escape(r.reason or '?')})</li>"
           for g in groups for r in g.runs if r.status != "completed"]
    runs = "".join(f"<li>{html.escape(g.label)}: {html.escape(', '.join(str(r.path) for r in g.runs))}</li>"
                   for g in groups)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p class='setting'><b>Setting</b> · {html.escape(setting)}</p>",
             f"<div class='warn'><b>Not completed:</b><ul>{''.join(bad)}</ul></div>" if bad else "",
             "<h2>Summary</h2>", html_table(s.display, s.table["status"]),
             *(f"<p class='note'>{html.escape(line)}</p>" for line in s.note.splitlines()),
             *_target_and_frontier(s, setting),
             "<h2>Figures</h2>", *(_img(p, alt, setting) for p, alt in s.figures),
             f"<h2>Runs</h2><details><summary>{sum(len(g.runs) for g in groups)} run dirs</summary>"
             f"<ul>{runs}</ul></details>",
             f"<p><small>gvq.report, {datetime.now():%Y-%m-%d %H:%M}</small></p></body></html>"]
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
