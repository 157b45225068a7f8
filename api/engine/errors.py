"""The engine's errors: what admission, the batcher and the pipeline raise, with no HTTP in them (the HTTP
face, api/web/errors.py, gives every error of hare's tree its status in one table).

HareError (tasks/errors.py)
├── InputError (tasks/errors.py)
│   └── ClientGone      the client went away before its answer was ready
├── Overloaded          admission refuses, or a request waited past the bound; details["retry_after"]
└── NotReady            the model is loading, or the worker is draining or broken

The model call's own error, InferenceFailed, is the runtime's (container/runtime.py).
"""

from __future__ import annotations

from tasks.errors import HareError, InputError


class ClientGone(InputError):
    """The client closed the connection before its answer was ready (nobody reads the status; metrics count it)."""


class Overloaded(HareError):
    """The machine's expected wait is past `HARE_MAX_QUEUE_MS`, or a worker holds `HARE_QUEUE_SIZE` requests;
    answered with `Retry-After` (details["retry_after"], the seconds until the excess drains)."""


class NotReady(HareError):
    """The model is still loading, or the server is draining."""
