"""How the console prints a value in a table cell: the same few rules on every page.

Tables get text, never raw floats or None: an empty value reads "–" (not "None"), a float keeps about three
significant digits ("0.995", "3.00", "33.4", "14,096"; a tiny one "7e-09"), a whole number gets thousands separators.
Pure functions; the pages right-align the columns `numeric_columns` names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MISSING = "–"


def figure(x: float) -> str:
    """A float with about three significant digits and no exponent unless it is tiny."""
    if math.isnan(x):
        return MISSING
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    size = abs(x)
    if size == 0:
        return "0"
    if size < 0.001:
        return f"{x:.2g}"
    if size < 1:  # three significant digits, at least two decimals: 0.20, 0.05, 0.995
        text = f"{x:.3g}"
        return text if len(text.partition(".")[2]) >= 2 else f"{x:.2f}"
    if size < 10:
        return f"{x:.2f}"
    if size < 100:
        return f"{x:.1f}"
    return f"{x:,.0f}"


def cell(value: Any) -> str:
    """One table cell as text: "–" for nothing, yes/no, 1,234, figure() for floats, str() for the rest."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return figure(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items()) or MISSING
    if isinstance(value, list | tuple):
        return ", ".join(cell(v) for v in value) or MISSING
    return str(value)


def text_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Every cell of every row through `cell` (cells that are already text are kept as they are)."""
    return [{k: v if isinstance(v, str) and v else cell(v) for k, v in r.items()} for r in rows]


def numeric_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Columns whose values are all numbers or empty, at least one a number (of the rows before `text_rows`):
    the pages right-align them."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    out = []
    for c in columns:
        values = [r.get(c) for r in rows]
        if any(_is_number(v) for v in values) and all(_is_number(v) or _blank(v) for v in values):
            out.append(c)
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _blank(v: Any) -> bool:
    return v is None or v == "" or (isinstance(v, float) and math.isnan(v))
