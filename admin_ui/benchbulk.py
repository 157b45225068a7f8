"""The Results tab's view of a bulk run (`hare bench bulk`): its candidates, its goals and its notes, as text
rows from the run's stored summary (bench/bulk_tables.py). Nothing here touches Streamlit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from admin_ui.tables import MISSING, cell
from bench.bulk_tables import DIGITS, candidate_rows, goals, notes
from bench.store import Run

GOAL_DIGITS = {"figure": 3}


@dataclass(frozen=True)
class BulkView:
    candidates: list[dict[str, str]]  # one text row per candidate, "–" where it has no figure
    goals: list[dict[str, str]]
    notes: list[str]
    numeric: list[str]  # the columns the page right-aligns


def bulk_view(run: Run) -> BulkView:
    """A bulk run as the console shows it: its candidates (rows/s, tokens/s, share of the model-only rate, CPU
    per row, cosine p1 to torch, why a peer was skipped), the issue's goals, and the lines under them."""
    rows = [_text(r, DIGITS) for r in candidate_rows(run.summary)]
    judged = [_text(g, GOAL_DIGITS) for g in goals(run.summary)]
    return BulkView(rows, judged, notes(run.summary, run.settings), [*DIGITS, *GOAL_DIGITS, "target"])


def _text(row: Mapping[str, Any], digits: Mapping[str, int]) -> dict[str, str]:
    out = {}
    for column, value in row.items():
        if column in digits and isinstance(value, float):
            out[column] = f"{value:,.{digits[column]}f}"
        else:
            out[column] = cell(value) if value != "" else MISSING
    return out
