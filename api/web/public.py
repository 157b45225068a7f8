"""Exposure controls: the API key on inference routes, the admin token on /metrics and /info, and the
public demo profile's per-client rate limit (HARE_PUBLIC=1; its body, input and character caps are plain
settings, checked in api/web/schemas.py)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from starlette.requests import Request

from api.config import Settings
from api.web.errors import NotFound, RateLimited, Unauthorized
from container.locking import flocked

log = logging.getLogger("hare")


def check_api_key(request: Request, settings: Settings) -> None:
    """Inference routes need `Authorization: Bearer <HARE_API_KEY>` when a key is set (as TEI's, infinity's and
    vLLM's --api-key); with none set the header is ignored: the Hugging Face client sends the user's own token."""
    if settings.api_key and not _bearer(request, settings.api_key):
        raise Unauthorized(f"{request.url.path} needs the header Authorization: Bearer <HARE_API_KEY>")


def _bearer(request: Request, secret: str) -> bool:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), secret.encode())


def check_admin(request: Request, settings: Settings) -> None:
    """Admin routes need the bearer token when one is set; in public mode without one they do not exist."""
    if settings.admin_token:
        if not _bearer(request, settings.admin_token):
            raise Unauthorized(f"{request.url.path} needs the header Authorization: Bearer <HARE_ADMIN_TOKEN>")
    elif settings.public:
        raise NotFound(f"{request.url.path} is off in public mode; set HARE_ADMIN_TOKEN to reach it with a token")


# One client's token bucket in the shared page: its address's hash (0: a free slot), its tokens, and when they
# were counted (CLOCK_MONOTONIC, the same clock in every process).
_BUCKET = np.dtype([("client", "=u8"), ("tokens", "=f8"), ("at", "=f8")])
BUCKETS = 4096  # clients tracked at once (a 96 KiB page); past that, the longest idle one's bucket is reused
PROBES = 16  # the slots from a client's hash where its bucket may sit
_SIZE = (BUCKETS + PROBES) * _BUCKET.itemsize


class RateLimiter:
    """A token bucket per client address: `per_minute` requests a minute, bursts of up to `burst`.

    The buckets sit in a page of `folder` (HARE_CORE_POOL, the folder the gunicorn master makes for its
    workers), so that every worker counts against the same ones: counted by each worker alone, a client
    whose connections the accept loop spread over N workers got N times the limit. Without a folder (a
    process serving alone) the page is private. The page holds BUCKETS clients; a new client takes the
    longest idle of the slots its hash points to, whose client, if still active, starts again from a full
    bucket: a flood of addresses costs the limit its memory of the quietest clients, not the server's memory.
    """

    def __init__(
        self, per_minute: float, burst: int, folder: Path | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.clock = clock
        self._fd: int | None = None
        self._proxy_said = False  # whether an untrusted proxy was logged (_untrusted_proxy)
        if folder is None:
            self._page = mmap.mmap(-1, _SIZE)
        else:  # opened in the worker (the app's lifespan): a descriptor of its own, for flock
            self._fd = os.open(folder / "rates", os.O_RDWR | os.O_CREAT, 0o600)
            with flocked(self._fd):
                if os.fstat(self._fd).st_size < _SIZE:
                    os.ftruncate(self._fd, _SIZE)
            self._page = mmap.mmap(self._fd, _SIZE)
        buckets = np.frombuffer(self._page, dtype=_BUCKET)
        self._clients, self._tokens, self._at = buckets["client"], buckets["tokens"], buckets["at"]

    def check(self, request: Request) -> None:
        client = request.client.host if request.client else "unknown"
        forwarded = None if self._proxy_said else request.headers.get("x-forwarded-for")
        if forwarded and client not in {address.strip() for address in forwarded.split(",")}:  # uvicorn took none
            self._untrusted_proxy(client)
        # A hash every worker computes alike (str's hash() differs between processes); never 0, a free slot.
        key = int.from_bytes(hashlib.blake2b(client.encode(), digest_size=8).digest(), "little") or 1
        home = key % BUCKETS
        now = self.clock()
        with flocked(self._fd):
            found = np.flatnonzero(self._clients[home : home + PROBES] == key)
            if found.size:
                slot = home + int(found[0])
                tokens = min(self.burst, self._tokens[slot] + (now - self._at[slot]) * self.rate)
            else:  # a free slot (never used: counted at 0) or the longest idle
                slot = home + int(np.argmin(self._at[home : home + PROBES]))
                self._clients[slot], tokens = key, self.burst
            if tokens >= 1.0:
                self._tokens[slot], self._at[slot] = tokens - 1.0, now
                return
        wait = math.ceil((1.0 - tokens) / self.rate)
        raise RateLimited(
            f"too many requests from this client; this server allows {self.rate * 60:g} a minute "
            f"(bursts of {self.burst:g})",
            retry_after=wait,
        )

    def _untrusted_proxy(self, proxy: str) -> None:
        """Say once that a proxy's X-Forwarded-For is not trusted (uvicorn took the proxy for the client): every
        client behind it shares one bucket, and a busy demo refuses them all together."""
        self._proxy_said = True
        log.warning(
            "the rate limit counts %s's requests as one client's: it sends X-Forwarded-For, which this server does "
            "not trust from it, so every client behind it shares one limit; if it is your proxy, add it to "
            "HARE_FORWARDED_ALLOW_IPS",
            proxy,
        )

    def close(self) -> None:
        del self._clients, self._tokens, self._at  # the page cannot close while they point in
        self._page.close()
        if self._fd is not None:
            os.close(self._fd)
