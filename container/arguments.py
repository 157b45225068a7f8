"""argparse types shared by the command lines (`hare optimize`, `hare tune`, `hare bench`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def comma_ints(text: str) -> list[int]:
    """`--batch 1,8,32`: the whole numbers, each at least 1, or a usage error (exit 2) that names what was given."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers of at least 1, got {text!r}")
    return values


def comma_floats(text: str) -> list[float]:
    """`--rate 50,100.5`: the numbers, each finite and above 0, or a usage error (exit 2) that names what was
    given."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers above 0, got {text!r}")
    return values


def positive_int(text: str) -> int:
    """`--max-chars 2000`: a whole number of at least 1, or a usage error (exit 2) that names what was given."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def whole_number_to(high: int, why: str) -> Callable[[str], int]:
    """`--chunk-rows 4096`: a whole number from 1 to `high`, or a usage error (exit 2) that says `why` not more."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"expected at most {high:,}, got {value:,}: {why}")
        return value

    return parse


def count(text: str) -> int:
    """`--tune-streams 0`: a whole number of at least 0, or a usage error (exit 2)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    """`--tune-seconds 0.2`: a finite number above 0, or a usage error (exit 2)."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


def seconds(text: str) -> float:
    """`--warmup 0`: a finite number of at least 0, or a usage error (exit 2)."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return value


def finite_float(text: str) -> float:
    """A gate's threshold: a finite number (nan compared false with everything, and no variant passed)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
