"""The root of hare's error tree and the input errors every layer raises.

Each layer keeps its own errors, under this root; api/web/errors.py draws the whole tree and maps it to HTTP
statuses in one table, and hare/cli.py maps it to exit codes.

HareError                 every error hare raises on purpose; the message tells the user what to fix
└── InputError            the request or command asked for something invalid (fix the input)
    ├── InvalidRequest    malformed JSON, a wrong type, an unknown parameter or value (names the field)
    └── InputTooLong      an input or the body exceeds a limit (model length with truncation off, size caps)

The serving errors are in api/engine/errors.py (ClientGone, Overloaded, NotReady) and api/web/errors.py
(NotFound, Unauthorized, RateLimited), the runtime's (InferenceFailed) in container/runtime.py, the optimizer's
(UnsupportedModel, ValidationFailed) in container/optimize/errors.py.
"""

from __future__ import annotations


class HareError(Exception):
    """Base of every error hare raises on purpose; the message tells the user what to fix."""

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InputError(HareError):
    """The request or command asked for something invalid: an empty string, a text in which the tokenizer finds no
    token (whitespace alone, where it adds no special tokens; where it adds them, such a text is answered as its
    special tokens alone are, as sentence-transformers answers it), an empty list, no documents."""


class InvalidRequest(InputError):
    """Malformed JSON or UTF-8, a wrong type, an unknown field, parameter or value (the message names it and
    lists what is accepted)."""


class InputTooLong(InputError):
    """A body over `HARE_MAX_BODY_BYTES` (as sent, or once decompressed), more than `HARE_MAX_INPUTS` texts, a text
    over `HARE_MAX_INPUT_CHARS` (a prompt, instruction or ranking query too), texts that a prompt, instruction or
    query joined to each make more characters than `HARE_MAX_BODY_BYTES`, an answer of token vectors over
    `HARE_MAX_ANSWER_VALUES` numbers, or over the model's maximum with `truncate: false` (the message names the
    limit)."""
