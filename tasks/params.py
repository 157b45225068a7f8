"""Reading request values: each helper checks one field and, when it is wrong, says which and how to fix it.

Wrong types and unknown values raise InvalidRequest (HTTP 422); empty inputs raise InputError (HTTP 400).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tasks.base import Inputs, ModelInfo
from tasks.errors import InputError, InvalidRequest

T = TypeVar("T")
INT64 = 2**63 - 1
_MISSING = object()


class Parameters(dict[str, object]):
    """A request's parameters, and which of them its body holds at its root, beside its texts (OpenAI's
    `dimensions`, TEI's `truncate`, the ones /predict takes at its root): an error names a parameter as it was
    sent, the others under "parameters" as /predict's body holds them."""

    def __init__(self, values: Mapping[str, object], at_root: Iterable[str] | None = None) -> None:
        super().__init__(values)
        self.at_root = frozenset(self if at_root is None else at_root)


def at_root(values: Mapping[str, object]) -> Parameters:
    """Parameters a body holds at its root, all of them."""
    return Parameters(values)


def named(raw: Mapping[str, object], name: str) -> str:
    """`name` as the request spells its place, for error messages."""
    return name if isinstance(raw, Parameters) and name in raw.at_root else f"parameters.{name}"


def only(raw: Mapping[str, object], names: Container[str]) -> Mapping[str, object]:
    """The parameters of `raw` that `names` holds, each where `raw` had it."""
    kept = {k: v for k, v in raw.items() if k in names}
    return Parameters(kept, raw.at_root) if isinstance(raw, Parameters) else kept


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
        raise InvalidRequest(f"{named(raw, name)} must be true or false, got {kind(value)}")
    return value


def choice(raw: Mapping[str, object], name: str, options: Sequence[str], default: str) -> str:
    """One of `options`, exactly as listed (the API documents them as an enum)."""
    value = raw.get(name, default)
    if not isinstance(value, str) or value not in options:
        shown = repr(value) if isinstance(value, str) and len(value) <= 40 else kind(value)
        raise InvalidRequest(f"{named(raw, name)} must be one of {', '.join(options)}; got {shown}")
    return value


def integer(
    raw: Mapping[str, object],
    name: str,
    default: int | None,
    minimum: int = 0,
    maximum: int | None = None,
    nullable: bool = False,
) -> int | None:
    """An integer in [minimum, maximum]; null only when `nullable` (it then means "no limit")."""
    sent = value = raw.get(name, default)
    if value is None and (nullable or name not in raw):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON's 3.0 is the integer 3; a refusal still shows what was sent (1e+30)
    if isinstance(value, bool) or not isinstance(value, int):
        also = " or null" if nullable else ""
        raise InvalidRequest(f"{named(raw, name)} must be an integer{also}, got {kind(value)}")
    top = INT64 if maximum is None else maximum
    if value < minimum or value > top:
        # Without a maximum of its own, the 64 bits the documentation states are said only to a value past them.
        bound = f"between {minimum} and {top}" if maximum is not None or value > top else f"at least {minimum}"
        raise InvalidRequest(f"{named(raw, name)} must be {bound}, got {sent}")
    return value


def string_list(raw: Mapping[str, object], name: str, default: Sequence[str]) -> tuple[str, ...]:
    value = raw.get(name, _MISSING)
    if value is _MISSING or value is None:
        return tuple(default)
    if not isinstance(value, list):
        raise InvalidRequest(f"{named(raw, name)} must be a list of strings, got {kind(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):  # "must be a list of strings, got a list" named nothing to fix
            raise InvalidRequest(f"{named(raw, name)}[{i}] must be a string, got {kind(item)}")
    return tuple(value)


# Parameter specs: what a task declares about each request parameter. The same object reads the value (with
# the helpers above) and describes it as JSON Schema for the API documentation, so the two cannot disagree.


@dataclass(frozen=True)
class Spec:
    """A request parameter: its one-line help; subclasses add the type and its bounds."""

    help: str

    def read(self, raw: Mapping[str, object], name: str, default: Any) -> Any:
        """The value of `name` in `raw` (or `default`), checked; raises InvalidRequest naming it."""
        raise NotImplementedError

    def schema(self, bounds: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """JSON Schema of the accepted values; `bounds` resolves model-dependent limits (see Integer) and sets
        (see ModelChoice). None: no value is accepted for this model, so the documentation leaves it out."""
        return {"description": self.help}


@dataclass(frozen=True)
class Boolean(Spec):
    def read(self, raw: Mapping[str, object], name: str, default: bool) -> bool:
        return boolean(raw, name, default)

    def schema(self, bounds: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        return {"type": "boolean", "description": self.help}


@dataclass(frozen=True)
class Choice(Spec):
    options: tuple[str, ...]

    def read(self, raw: Mapping[str, object], name: str, default: str) -> str:
        return choice(raw, name, self.options, default)

    def schema(self, bounds: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        return {"type": "string", "enum": list(self.options), "description": self.help}


@dataclass(frozen=True)
class Integer(Spec):
    """An integer of at least `minimum`; `bound` names a model-dependent maximum (e.g. "width", the vector
    size), which the server checks when it runs and the documentation states from `bounds`."""

    minimum: int = 0
    nullable: bool = False
    bound: str | None = None

    def read(self, raw: Mapping[str, object], name: str, default: int | None) -> int | None:
        return integer(raw, name, default, minimum=self.minimum, nullable=self.nullable)

    def schema(self, bounds: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        # Without a model bound, the largest integer JSON parsers (orjson) read: 64 bits.
        found: dict[str, Any] = {"type": "integer", "minimum": self.minimum, "maximum": INT64}
        if self.bound is not None and bounds and self.bound in bounds:
            found["maximum"] = bounds[self.bound]
        if self.nullable:
            found = {"anyOf": [found, {"type": "null"}]}
        return {**found, "description": self.help}


@dataclass(frozen=True)
class Strings(Spec):
    """A list of strings (null: the default)."""

    def read(self, raw: Mapping[str, object], name: str, default: Sequence[str]) -> tuple[str, ...]:
        return string_list(raw, name, default)

    def schema(self, bounds: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        return {"type": ["array", "null"], "items": {"type": "string"}, "description": self.help}


@dataclass(frozen=True)
class Text(Spec):
    """Any string, which the task joins to every text of the request (a prompt, an instruction: the server
    counts it as a text, api/web/schemas.py check_joined); with `only_if`, accepted only by models for which
    that key of `bounds` is true (the documentation leaves it out for the others, whose task refuses it)."""

    only_if: str = ""

    def read(self, raw: Mapping[str, object], name: str, default: str) -> str:
        value = raw.get(name, default)
        if not isinstance(value, str):
            raise InvalidRequest(f"{named(raw, name)} must be a string, got {kind(value)}")
        return value

    def schema(self, bounds: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        if self.only_if and not (bounds or {}).get(self.only_if):
            return None
        return {"type": "string", "description": self.help}


@dataclass(frozen=True)
class ModelChoice(Spec):
    """One of a set the model declares (`among` names it in `bounds`, e.g. "prompts"); the task checks the
    value against the model when it reads it."""

    among: str

    def read(self, raw: Mapping[str, object], name: str, default: str | None) -> str | None:
        value = raw.get(name, default)
        if value is not None and not isinstance(value, str):
            raise InvalidRequest(f"{named(raw, name)} must be a string, got {kind(value)}")
        return value

    def schema(self, bounds: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        options = list((bounds or {}).get(self.among, ()))
        return {"type": "string", "enum": options, "description": self.help} if options else None


def model_bounds(model: ModelInfo) -> dict[str, Any]:
    """What a parameter's schema needs to know of the served model (Spec.schema): the prompts it declares,
    whether it reads pairs through a template (an LM reranker), the bge-m3 heads it carries."""
    return {"prompts": list(model.prompts), "pair_template": bool(model.pair_template), "heads": list(model.heads)}


def taken(parameters: Mapping[str, Spec], model: ModelInfo) -> list[str]:
    """The names of `parameters` this model takes, by the API documentation's test (a schema for its bounds):
    a SPLADE bundle refuses bge-m3's output flags, so an error or /info that listed them sent a client from
    one refusal to the next."""
    bounds = model_bounds(model)
    return [name for name, spec in parameters.items() if spec.schema(bounds) is not None]
