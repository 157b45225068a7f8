"""argparse types shared by the command lines (`hare optimize`, `hare tune`, `hare bench`)."""

from __future__ import annotations

import argparse


def comma_ints(text: str) -> list[int]:
    """`--batch 1,8,32`: the integers, or a usage error (exit 2) that names what was given."""
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def comma_floats(text: str) -> list[float]:
    """`--rate 50,100.5`: the numbers, or a usage error (exit 2) that names what was given."""
    try:
        return [float(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def positive_int(text: str) -> int:
    """`--max-chars 2000`: a whole number of at least 1, or a usage error (exit 2) that names what was given."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value
