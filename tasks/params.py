"""Reading request values: each helper checks one field and, when it is wrong, says which and how to fix it.

Wrong types and unknown values raise InvalidRequest (HTTP 422); empty inputs raise InputError (HTTP 400).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from tasks.base import Inputs
from tasks.errors import InputError, InvalidRequest

T = TypeVar("T")
_MISSING = object()


def kind(value: object) -> str:
    """The JSON name of a value's type, for error messages (never the value itself: it may be private text)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def texts(value: object, name: str = "inputs") -> Inputs:
    """A string (single-input answer) or a non-empty list of non-empty strings (one answer per string)."""
    if isinstance(value, str):
        if not value:
            raise InputError(f"{name} is an empty string; send some text")
        return Inputs([value], single=True)
    if isinstance(value, list):
        return Inputs(text_list(value, name), single=False)
    raise InvalidRequest(f"{name} must be a string or a list of strings, got {kind(value)}")


def text_list(value: object, name: str) -> list[str]:
    """A non-empty list of non-empty strings."""
    if not isinstance(value, list):
        raise InvalidRequest(f"{name} must be a list of strings, got {kind(value)}")
    if not value:
        raise InputError(f"{name} is an empty list; send at least one text")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidRequest(f"{name}[{i}] must be a string, got {kind(item)}")
        if not item:
            raise InputError(f"{name}[{i}] is an empty string; send some text")
    return value


def text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string, got {kind(value)}")
    if not value:
        raise InputError(f"{name} is an empty string; send some text")
    return value


def boolean(raw: Mapping[str, object], name: str, default: bool) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"parameters.{name} must be true or false, got {kind(value)}")
    return value


def choice(raw: Mapping[str, object], name: str, options: Sequence[str], default: str) -> str:
    value = raw.get(name, default)
    if not isinstance(value, str) or value.lower() not in options:
        shown = repr(value) if isinstance(value, str) and len(value) <= 40 else kind(value)
        raise InvalidRequest(f"parameters.{name} must be one of {', '.join(options)}; got {shown}")
    return value.lower()


def integer(
    raw: Mapping[str, object],
    name: str,
    default: int | None,
    minimum: int = 0,
    maximum: int | None = None,
    nullable: bool = False,
) -> int | None:
    """An integer in [minimum, maximum]; null only when `nullable` (it then means "no limit")."""
    value = raw.get(name, default)
    if value is None and (nullable or name not in raw):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        also = " or null" if nullable else ""
        raise InvalidRequest(f"parameters.{name} must be an integer{also}, got {kind(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise InvalidRequest(f"parameters.{name} must be {bound}, got {value}")
    return value


def string_list(raw: Mapping[str, object], name: str, default: Sequence[str]) -> tuple[str, ...]:
    value = raw.get(name, _MISSING)
    if value is _MISSING or value is None:
        return tuple(default)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest(f"parameters.{name} must be a list of strings, got {kind(value)}")
    return tuple(value)
