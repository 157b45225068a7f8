"""hare's one error tree. The server maps each class to an HTTP status in `api/errors.py`; the CLI to an exit code.

HareError
├── InputError            the request or command asked for something invalid (fix the input)
│   ├── InvalidRequest    malformed JSON, a wrong type, an unknown parameter or value (names the field)
│   ├── InputTooLong      an input or the body exceeds a limit (model length with truncation off, size caps)
│   ├── NotFound          no such route, or a route this server does not offer (task, public mode)
│   ├── ClientGone        the client closed the connection before its answer was ready
│   └── UnsupportedModel  the model folder cannot be turned into a bundle (format, task head, architecture)
├── Unauthorized          an admin or inference route without the right bearer token
├── Overloaded            the server's queue is full: retry later
│   └── RateLimited       this client sent more than its share (public mode)
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


class InvalidRequest(InputError):
    pass


class InputTooLong(InputError):
    pass


class NotFound(InputError):
    pass


class ClientGone(InputError):
    pass


class UnsupportedModel(InputError):
    pass


class Unauthorized(HareError):
    pass


class Overloaded(HareError):
    """details: retry_after, the seconds a client should wait (sent as Retry-After)."""


class RateLimited(Overloaded):
    pass


class NotReady(HareError):
    pass


class ValidationFailed(HareError):
    pass


class InferenceFailed(HareError):
    pass
