"""The worker's resources: made once in the app's lifespan (api/web/app.py), reached by handlers through
`resources(request)`, typed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import HTTPConnection
from tokenizers import Encoding

from api.config import Settings
from api.engine.backend import Backend
from api.engine.batching import Batcher
from api.engine.cores import CorePool
from api.engine.encoder import Encoder
from api.engine.errors import NotReady
from api.engine.pipeline import Pipeline
from api.engine.remote import RemoteBackend
from api.web.metrics import Metrics
from api.web.public import RateLimiter
from api.web.schemas import Limits
from container.bundle import Manifest
from tasks.base import ModelInfo, TaskSpec


def _never() -> bool:
    return False


@dataclass
class Resources:
    """Everything a request needs. compute_type: the x-compute-type header; info, openapi: prebuilt bodies."""

    settings: Settings
    manifest: Manifest
    task: TaskSpec
    model: ModelInfo
    backend: Backend | RemoteBackend
    pool: CorePool | None
    encoder: Encoder
    batcher: Batcher[Encoding]
    pipeline: Pipeline
    metrics: Metrics
    limits: Limits
    limiter: RateLimiter | None
    model_name: str
    compute_type: str
    info: bytes = b"{}"
    openapi: bytes = b"{}"
    ready: bool = False
    # Whether this worker should hand a connection to a less busy one (api/process/worker.py sets it; app.Rebalance).
    rebalance: Callable[[], bool] = _never

    @property
    def compute_type_header(self) -> bytes:
        return self.compute_type.encode()


def resources(connection: HTTPConnection) -> Resources:
    found = getattr(connection.app.state, "hare", None)
    if found is None:
        raise NotReady("the model is still loading; retry shortly")
    assert isinstance(found, Resources)
    return found
