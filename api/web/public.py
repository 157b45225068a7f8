"""Exposure controls: the API key on inference routes, the admin token on /metrics and /info, and the
public demo profile's per-client rate limit (HARE_PUBLIC=1; its body, input and character caps are plain
settings, checked in api/web/schemas.py)."""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Callable

from starlette.requests import Request

from api.config import Settings
from api.web.errors import NotFound, RateLimited, Unauthorized


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


class RateLimiter:
    """A token bucket per client address: `per_minute` requests a minute, bursts of up to `burst`.

    Each worker keeps its own buckets (a client on a keep-alive connection stays on one worker); idle
    clients are forgotten once their bucket is full again, so memory stays bounded by active clients.
    """

    def __init__(self, per_minute: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.clock = clock
        self.buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, time)
        self._swept = clock()

    def check(self, request: Request) -> None:
        client = request.client.host if request.client else "unknown"
        now = self.clock()
        tokens, then = self.buckets.get(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens < 1.0:
            wait = math.ceil((1.0 - tokens) / self.rate)
            raise RateLimited(
                f"too many requests from this client; this demo allows {self.rate * 60:g} a minute", retry_after=wait
            )
        self.buckets[client] = (tokens - 1.0, now)
        if now - self._swept > 60.0:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        refill = self.burst / self.rate
        self.buckets = {c: (t, at) for c, (t, at) in self.buckets.items() if now - at < refill}
        self._swept = now
