"""The Results tab's view of a bulk run (`hare bench bulk`): its candidates, its goals and its notes, as text
rows from the run's stored summary (bench/bulk_tables.py). Nothing here touches Streamlit."""

from __future__ import annotations

from dataclasses import dataclass

from admin_ui.tables import numeric_columns, text_rows
from bench.bulk_tables import candidate_rows, goals, notes
from bench.store import Run

SKIPPED = "skipped because"


@dataclass(frozen=True)
class BulkView:
    candidates: list[dict[str, str]]  # one text row per candidate, "–" where it has no figure
    goals: list[dict[str, str]]
    notes: list[str]
    numeric: list[str]  # the columns the page right-aligns


def bulk_view(run: Run) -> BulkView:
    """A bulk run as the console shows it: its candidates (rows/s, tokens/s, share of the model-only rate, CPU
    per row, cosine p1 to torch), the issue's goals, and the lines under them (why a peer was skipped first); every
    figure printed as the console prints figures (admin_ui/tables.py: about three significant digits)."""
    rows, judged = candidate_rows(run.summary), goals(run.summary)
    # Why a peer was skipped is a sentence: said under the table, whole, rather than cut in a grid cell.
    skipped = [f"{r['candidate']} skipped: {r.pop(SKIPPED)}" for r in rows if r.get(SKIPPED)]
    for row in rows:
        row.pop(SKIPPED, None)
    numeric = numeric_columns(rows) + numeric_columns(judged)
    return BulkView(text_rows(rows), text_rows(judged), skipped + notes(run.summary, run.settings), numeric)
