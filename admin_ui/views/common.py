"""What several pages draw the same way: the page's title with the appliance it works on, tables of text cells
with numbers right-aligned."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import streamlit as st

from admin_ui import state
from admin_ui.tables import MISSING, numeric_columns, text_rows

PICKER = "hare-appliance-picker"  # the picker's widget key; the choice itself lives in state.SELECTED


def title_and_appliance(title: str) -> str | None:
    """The page's title with the appliance picker beside it (the Playground, Benchmarks and Live metrics pages
    work on the appliance picked here); None when the console watches none."""
    head = st.columns([3, 2], vertical_alignment="bottom")
    head[0].title(title, anchor=False)
    urls = state.appliances()
    if not urls:
        return None
    current = state.selected() or urls[0]
    # Streamlit forgets a widget's value once a page without it has been shown, so the choice is copied to a
    # key of its own (state.SELECTED) and the picker starts from it on every page.
    head[1].selectbox(
        "Appliance",
        urls,
        index=urls.index(current),
        key=PICKER,
        on_change=lambda: state.select(st.session_state[PICKER]),
        help="the appliance the Playground, Benchmarks and Live metrics pages work on",
    )
    return current


def table(
    rows: Sequence[Mapping[str, str]],
    numeric: Sequence[str] = (),
    key: str | None = None,
    widths: Mapping[str, int] | None = None,
) -> None:
    """A data frame of text cells (no "None", no raw floats) with the `numeric` columns right-aligned; `widths`
    in pixels for columns whose text must be read whole (the grid cuts a cell's text at its column's edge)."""
    config: dict[str, Any] = {}
    for c in dict.fromkeys(k for r in rows for k in r):
        width = (widths or {}).get(c)
        if c in numeric or width:
            config[c] = st.column_config.TextColumn(alignment="right" if c in numeric else None, width=width)
    # Up to 30 rows show whole, without a scroll bar inside the page's own (35 px a row and the header).
    height: int | Literal["auto"] = 35 * (len(rows) + 1) + 3 if len(rows) <= 30 else "auto"
    st.dataframe(
        [dict(r) for r in rows],
        hide_index=True,
        width="stretch",
        height=height,
        column_config=config,
        key=key,
        placeholder=MISSING,
    )


def static_table(rows: Sequence[Mapping[str, Any]], header: bool = True, whole: Sequence[str] = ()) -> None:
    """A small table drawn as HTML in a Markdown block: text wraps inside its cell instead of being cut, numbers
    stay on one line, right-aligned; a table still too wide for its place scrolls sideways inside it, never
    under its neighbour. Every cell is text ("–" for nothing), and the page needs none of the data frame's
    JavaScript, so it paints sooner."""
    st.markdown(html_table(rows, header, whole), unsafe_allow_html=True)


def html_table(rows: Sequence[Mapping[str, Any]], header: bool = True, whole: Sequence[str] = ()) -> str:
    """Rows as an HTML table in a box that scrolls sideways when the table is wider than its place (without a
    header row, the first row's keys stay unsaid); the `whole` columns' cells stay on one line (names)."""
    if not rows:
        return ""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    numeric = set(numeric_columns(rows))
    cells = text_rows(rows)

    def td(tag: str, column: str, text: str) -> str:
        if column in numeric or column in whole:
            style = NUMBER_CELL if column in numeric else WHOLE_CELL
        else:
            style = TEXT_CELL if _has_long_word(text) else WORD_CELL
        return f'<{tag} style="{style}">{html.escape(text)}</{tag}>'

    head = "<thead><tr>" + "".join(td("th", c, c) for c in columns) + "</tr></thead>" if header else ""
    body = "".join("<tr>" + "".join(td("td", c, r.get(c, MISSING)) for c in columns) + "</tr>" for r in cells)
    return f'<div class="hare-table" style="overflow-x:auto"><table>{head}<tbody>{body}</tbody></table></div>'


NUMBER_CELL = "text-align:right;white-space:nowrap"
TEXT_CELL = "overflow-wrap:anywhere"  # a long path or class name breaks inside its cell
# Short words break between words only: a cell that may break anywhere lets the table squeeze its column to one
# letter a line ("pas/sed", "precis/ion") to make room for its neighbours.
WORD_CELL = "overflow-wrap:normal"
WHOLE_CELL = "white-space:nowrap"  # a name read whole: "fused-int8-per-channel", not "fused-/int8-per-/channel"
LONG_WORD = 24  # characters: a word longer than this (a path, a class name) may break anywhere


def _has_long_word(text: str) -> bool:
    return any(len(word) > LONG_WORD for word in text.split())


def rows_table(
    rows: Sequence[Mapping[str, Any]], key: str | None = None, widths: Mapping[str, int] | None = None
) -> None:
    """Rows of any values, each cell printed by admin_ui.tables.cell, numbers right-aligned."""
    table(text_rows(rows), numeric_columns(rows), key=key, widths=widths)
