"""The baselines hare is measured against, served the way the Comet article did it: a transformers `pipeline`
behind a small Starlette app under gunicorn with uvicorn workers.

- vanilla: default settings everywhere: one gunicorn worker, torch's default threads, the pipeline called in
  Starlette's thread pool (what a plain `def` endpoint does in FastAPI).
- embeddings and sparse embeddings are measured as their users run them: sentence-transformers'
  SentenceTransformer and SparseEncoder `encode` (a task's spec names its reference).
- comet: the article's tuned server: torch threads 1, gradients off, `torch.quantization.quantize_dynamic`
  int8 on the Linear layers, one worker per core (set by the bench), the pipeline called on the event loop.

Started by `bench/servers.py` as `gunicorn 'bench.baseline_app:create_app()'` with the settings in the
environment: HARE_BASELINE_MODEL (a Hugging Face folder), HARE_BASELINE_TASK (a hare task name),
HARE_BASELINE_MODE (vanilla or comet) and HARE_BASELINE_DEVICE (cpu, the default, or a torch device such as
cuda: the baseline a GPU bundle is measured against; comet is CPU only). It answers the same `/predict` bodies
as `hare serve`, `/ready` once the model is loaded, and `x-compute-time` (seconds) around the pipeline call.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tasks.registry import TASKS

MODES = ("vanilla", "comet")
# References that are sentence-transformers classes rather than transformers pipelines (TaskSpec.baseline).
SENTENCE_TRANSFORMERS = ("SentenceTransformer", "SparseEncoder")


@dataclass(frozen=True)
class BaselineConfig:
    """Read from the environment when the app is created (never at import)."""

    model: str
    task: str
    mode: str
    device: str = "cpu"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BaselineConfig:
        env = os.environ if env is None else env
        try:
            config = cls(
                env["HARE_BASELINE_MODEL"],
                env["HARE_BASELINE_TASK"],
                env.get("HARE_BASELINE_MODE", "vanilla"),
                env.get("HARE_BASELINE_DEVICE", "cpu"),
            )
        except KeyError as exc:
            raise RuntimeError(f"the baseline needs {exc.args[0]} in the environment") from None
        if config.mode not in MODES:
            raise RuntimeError(f"HARE_BASELINE_MODE={config.mode!r}; choose one of {', '.join(MODES)}")
        if config.task not in TASKS:
            raise RuntimeError(f"HARE_BASELINE_TASK={config.task!r}; choose one of {', '.join(TASKS)}")
        if config.mode == "comet" and config.device != "cpu":
            # torch's dynamic int8 Linear runs on the CPU only.
            raise RuntimeError(f"HARE_BASELINE_MODE=comet runs on the CPU; HARE_BASELINE_DEVICE={config.device!r}")
        return config


def load_predictor(config: BaselineConfig) -> Callable[[Any], Any]:
    """The task's reference (`TaskSpec.baseline`: a transformers pipeline, or a sentence-transformers class for
    the tasks whose users run that library), wrapped to take a /predict `inputs` value and return JSON-ready
    output as the spec says."""
    import torch

    if config.mode == "comet":
        torch.set_num_threads(1)
        torch.set_grad_enabled(False)
    baseline = TASKS[config.task].baseline
    model = _load(baseline.pipeline, config.model, baseline.options, config.device)
    if config.mode == "comet":
        # torch.quantization.quantize_dynamic, as the article calls it (the same function lives in torch.ao).
        if baseline.pipeline in SENTENCE_TRANSFORMERS:
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        else:
            model.model = torch.ao.quantization.quantize_dynamic(model.model, {torch.nn.Linear}, dtype=torch.qint8)

    def predict(inputs: Any) -> Any:
        return _plain(baseline.predict(model, inputs))

    return predict


def _load(name: str, folder: str, options: Mapping[str, Any], device: str) -> Any:
    """sentence-transformers' `name` class on `folder`, or the transformers pipeline `name`, on `device`."""
    if name in SENTENCE_TRANSFORMERS:
        import sentence_transformers

        return getattr(sentence_transformers, name)(folder, device=device)
    from transformers import pipeline

    make: Any = pipeline  # the task name is a variable, so none of pipeline's typed overloads applies
    return make(name, model=folder, tokenizer=folder, device=device, **options)


def _plain(value: Any) -> Any:
    """numpy scalars (token-classification scores) become Python numbers."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return value.item()
    return value


def create_app(env: Mapping[str, str] | None = None) -> Starlette:
    config = BaselineConfig.from_env(env)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.predict = await run_in_threadpool(load_predictor, config)
        yield

    async def ready(request: Request) -> Response:
        loaded = getattr(request.app.state, "predict", None) is not None
        return JSONResponse({"ready": loaded}, status_code=200 if loaded else 503)

    async def info(request: Request) -> Response:
        import torch

        return JSONResponse(
            {
                "task": config.task,
                "variant": f"baseline-{config.mode}",
                "threads": torch.get_num_threads(),
                "device": config.device,
            }
        )

    async def predict(request: Request) -> Response:
        try:
            body = await request.json()
            inputs = body["inputs"]
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": "expected a JSON body with `inputs`", "type": "InputError"}, 400)
        start = time.perf_counter()
        fn: Callable[[Any], Any] = request.app.state.predict
        result = fn(inputs) if config.mode == "comet" else await run_in_threadpool(fn, inputs)
        elapsed = time.perf_counter() - start
        return JSONResponse(result, headers={"x-compute-time": f"{elapsed:.6f}"})

    return Starlette(
        routes=[
            Route("/ready", ready),
            Route("/health", ready),
            Route("/info", info),
            Route("/predict", predict, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
