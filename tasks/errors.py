"""hare's one error tree. The server maps each class to an HTTP status in `api/errors.py`; the CLI to an exit code.

HareError
├── InputError            the request or command asked for something invalid (fix the input)
│   ├── InputTooLong      an input exceeds the model's maximum length and truncation is off
│   └── UnsupportedModel  the model folder cannot be turned into a bundle (format, task head, architecture)
├── Overloaded            the server's queue is full: retry later
├── NotReady              the model is still loading or the server is draining
├── ValidationFailed      no optimized variant met the parity gates
└── InferenceFailed       the runtime failed on a well-formed input (a bug or a broken bundle)
"""

from __future__ import annotations


class HareError(Exception):
    """Base of every error hare raises on purpose; the message tells the user what to fix."""

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InputError(HareError):
    pass


class InputTooLong(InputError):
    pass


class UnsupportedModel(InputError):
    pass


class Overloaded(HareError):
    pass


class NotReady(HareError):
    pass


class ValidationFailed(HareError):
    pass


class InferenceFailed(HareError):
    pass
