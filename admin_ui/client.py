"""The console's one way to reach an appliance: a handful of HTTP calls with httpx.

Every failure becomes an `ApplianceError` whose message a page can show as is:

ApplianceError
├── Unreachable   nothing answered at the URL (refused, unknown host, timeout)
└── BadResponse   something answered, but with an error status or a body that is not the appliance contract
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from tasks.registry import TASKS


class ApplianceError(Exception):
    """A call to an appliance failed; `str(exc)` is a sentence for the operator."""


class Unreachable(ApplianceError):
    pass


class BadResponse(ApplianceError):
    def __init__(self, message: str, status: int | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind  # the server's error "type" when it sent one


def normalize_url(url: str) -> str:
    """`localhost:8080/` -> `http://localhost:8080`; raises ValueError naming what is wrong."""
    url = url.strip()
    if not url:
        raise ValueError("the appliance URL is empty")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{url!r}: an appliance URL starts with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"{url!r} has no host name")
    try:  # what connecting asks of it: else every page that reached it failed on a UnicodeError
        parts.hostname.encode("idna")
    except UnicodeError:
        raise ValueError(f"{url!r} has an invalid host name (a part of it empty or over 63 characters)") from None
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        raise ValueError(f"{url!r} has an invalid port") from None
    return url.rstrip("/")


def parse_server_timing(header: str | None) -> dict[str, float]:
    """`tokenize;dur=0.4, inference;dur=3.1` -> {"tokenize": 0.4, "inference": 3.1} (milliseconds)."""
    phases: dict[str, float] = {}
    for entry in (header or "").split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if name and key.strip() == "dur":
                with contextlib.suppress(ValueError):
                    phases[name] = float(value.strip().strip('"'))
    return phases


@dataclass(frozen=True)
class Prediction:
    """One /predict answer: the JSON body and the timings the server and the console saw."""

    output: Any
    compute_time_s: float | None  # x-compute-time
    phases_ms: dict[str, float] = field(default_factory=dict)  # server-timing
    round_trip_s: float = 0.0
    tokens: int | None = None  # x-compute-tokens: tokens fed to the model (special tokens included)
    truncated: bool = False  # x-truncated: an input was cut to the model's maximum length


class ApplianceClient:
    """Calls one appliance. Use as a context manager, or call `close()`.

    token: the appliance's admin token (its HARE_ADMIN_TOKEN), sent as `Authorization: Bearer` on every call but
        POST /predict when `api_key` is given.
    api_key: the appliance's API key (its HARE_API_KEY), sent as `Authorization: Bearer` on POST /predict.
    transport: an httpx transport for tests; the default is the network.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        api_key: str | None = None,
    ) -> None:
        self.url = normalize_url(url)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._predict_headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> ApplianceClient:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise Unreachable(f"{self.url} did not answer {method} {path} in time") from None
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise Unreachable(f"cannot reach {self.url} ({reason}); is `hare serve` running there?") from None

    def _json(self, response: httpx.Response, what: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise BadResponse(
                f"{what} at {self.url} answered {response.status_code} with a body that is not JSON; "
                "is this a hare appliance?",
                response.status_code,
            ) from None

    def _checked(self, response: httpx.Response, what: str) -> Any:
        """The JSON body of a 2xx answer; otherwise BadResponse with the server's own message and a hint."""
        status = response.status_code
        if response.is_success:
            return self._json(response, what)
        hint = ""
        if status in (401, 403) and what.startswith("POST"):
            hint = "; give the console the appliance's API key (HARE_CONSOLE_APPLIANCE_API_KEY or HARE_API_KEY)"
        elif status in (401, 403):
            hint = "; give the console the appliance's admin token (HARE_CONSOLE_APPLIANCE_TOKEN or HARE_ADMIN_TOKEN)"
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "error" in body:
            kind = str(body.get("type") or "")
            raise BadResponse(f"{what} failed ({status} {kind}): {body['error']}{hint}", status, kind)
        if hint:
            raise BadResponse(f"{what} was refused ({status}){hint}", status)
        if status == 404 and what.startswith("GET"):
            hint = " (a public appliance turns /info and /metrics off unless it has an admin token)"
        raise BadResponse(f"{what} at {self.url} answered {status}; is this a hare appliance?{hint}", status)

    def health(self) -> bool:
        """GET /health: the process is up."""
        response = self._request("GET", "/health")
        return response.is_success

    def ready(self) -> bool:
        """GET /ready: the model is loaded and the server takes requests (503 while loading or draining)."""
        response = self._request("GET", "/ready")
        return response.status_code == 200

    def info(self) -> dict[str, Any]:
        """GET /info, checked to be a hare appliance of a task this console knows."""
        body = self._checked(self._request("GET", "/info"), "GET /info")
        if not isinstance(body, dict) or "task" not in body:
            raise BadResponse(f"{self.url}/info is not a hare appliance's description (no task)")
        if body["task"] not in TASKS:
            raise BadResponse(f"{self.url} serves task {body['task']!r}, which this console does not know")
        return body

    def metrics_text(self) -> str:
        """GET /metrics in the Prometheus text format."""
        response = self._request("GET", "/metrics")
        if not response.is_success:
            self._checked(response, "GET /metrics")
        return response.text

    def predict(self, inputs: Any, parameters: dict[str, Any] | None = None) -> Prediction:
        """POST /predict; raises BadResponse with the server's own message on a 4xx/5xx."""
        payload: dict[str, Any] = {"inputs": inputs}
        if parameters:
            payload["parameters"] = parameters
        start = time.perf_counter()
        response = self._request("POST", "/predict", json=payload, headers=self._predict_headers)
        elapsed = time.perf_counter() - start
        body = self._checked(response, "POST /predict")
        headers = response.headers
        return Prediction(
            body,
            _number(headers.get("x-compute-time"), float),
            parse_server_timing(headers.get("server-timing")),
            elapsed,
            tokens=_number(headers.get("x-compute-tokens"), int),
            truncated=headers.get("x-truncated", "").lower() == "true",
        )


N = TypeVar("N", int, float)


def _number(header: str | None, kind: Callable[[str], N]) -> N | None:
    """A numeric header, None when it is absent or not a number (an older or foreign server)."""
    try:
        return kind(header) if header is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Probe:
    """What the Overview page knows about one appliance; `error` is set when it could not be described."""

    url: str
    healthy: bool = False
    ready: bool = False
    info: dict[str, Any] | None = None
    error: str | None = None


def probe(
    url: str, token: str | None = None, timeout: float = 3.0, transport: httpx.BaseTransport | None = None
) -> Probe:
    """Health, readiness and /info of one appliance, never raising."""
    try:
        client = ApplianceClient(url, token, timeout, transport)
    except ValueError as exc:
        return Probe(url, error=str(exc))
    # The three calls at once (httpx's client pools connections across threads): an appliance on a busy machine
    # answers each late, and the Overview waits for the slowest, not for the sum. Errors in /health, /ready,
    # /info order, as if they had been made one after the other.
    with client, ThreadPoolExecutor(max_workers=3, thread_name_prefix="hare-probe") as pool:
        health, readiness, described = pool.submit(client.health), pool.submit(client.ready), pool.submit(client.info)
        try:
            healthy, ready, info = health.result(), readiness.result(), described.result()
        except ApplianceError as exc:
            return Probe(client.url, error=str(exc))
    return Probe(client.url, healthy, ready, info)
