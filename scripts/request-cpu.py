"""Where one short request's server CPU goes, in process and without HTTP, layer by layer: the model call alone,
then the batcher around it, the pipeline (tokenize, post-process), and the whole app (middleware, routing,
parsing, the answer); the whole app again with the model's answer replayed instead of run (the server's
own CPU on caches the model's call did not leave cold); `GET /health` through the same app for scale. CPU
microseconds per request (process CPU time, so any thread counts), the least of 5 rounds of 200 after 20
warm-ups, twice over; and the same less the model calls' own CPU time (thread CPU time inside each call), the
server's own share at any model size.

    python scripts/request-cpu.py BUNDLE ["text"]

One worker, one stream, one core, as a worker alone on its connection runs (its calls inline on the event
loop). Over HTTP add uvicorn's parsing and the socket: `hare bench run BUNDLE --seq 8 --concurrency 2,64`
prints the server's CPU per answer (docs/serving.md, A request's CPU).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.types import Message

from api.config import Settings
from api.web import schemas
from api.web.app import create_app

Step = Callable[[], Awaitable[None]]
ROUND = 200


async def main(bundle: str, text: str) -> None:
    env = {"HARE_BUNDLE": bundle, "HARE_WORKERS": "1", "HARE_STREAMS": "1", "HARE_THREADS": "1"}
    app = create_app(Settings.from_env({**env, "HARE_LONE_THREADS": "1", "HARE_CORES": "1"}))
    async with app.router.lifespan_context(app):
        res = app.state.hare
        res.batcher.solo = lambda: True  # as the worker sets it when it serves one connection
        # The model calls' own CPU time, counted wherever the batcher makes them, so that the server's own share
        # can be told apart from a model that takes milliseconds (a private hook: this is a measuring script).
        model_cpu = [0.0]
        run = res.batcher._model._run
        replayed: dict[tuple[int, int, str | None], Any] = {}  # the model's answers, for the row that does not run it
        replay = [False]

        def counted(batch: Any, width: int, pooling: str | None = None) -> Any:
            if replay[0]:
                return replayed[len(batch), width, pooling]
            started = time.thread_time()
            try:
                replayed[len(batch), width, pooling] = answer = run(batch, width, pooling)
                return answer
            finally:
                model_cpu[0] += time.thread_time() - started

        res.batcher._model._run = counted
        body = orjson.dumps({"inputs": text})
        parsed, _ = schemas.parse_hf(body, res.task, res.model, res.limits)
        encoded = res.encoder.encode(parsed.inputs, parsed.long_input)
        statuses: list[int] = []

        async def model() -> None:
            counted(list(encoded.sequences), 1)

        async def batcher() -> None:
            with res.batcher.admit() as ticket:
                await ticket.run(encoded.sequences)

        async def pipeline() -> None:
            with res.batcher.admit() as ticket:
                await res.pipeline.run(ticket, parsed)

        def through_app(path: str, method: str, content: bytes) -> Step:
            scope = {
                "type": "http", "http_version": "1.1", "method": method, "scheme": "http", "path": path,
                "raw_path": path.encode(), "root_path": "", "query_string": b"", "app": app,
                "headers": [(b"host", b"hare"), (b"content-length", str(len(content)).encode())],
                "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
            }  # fmt: skip

            async def receive() -> Message:
                return {"type": "http.request", "body": content, "more_body": False}

            async def send(message: Message) -> None:
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])

            async def step() -> None:
                await app({**scope, "state": {}}, receive, send)

            return step

        predict = through_app("/predict", "POST", body)

        async def replaying() -> None:
            replay[0] = True
            try:
                await predict()
            finally:
                replay[0] = False

        steps: list[tuple[str, Step]] = [
            ("model call", model),
            ("+ batcher", batcher),
            ("+ pipeline", pipeline),
            ("+ app: POST /predict", predict),
            ("the same, model replayed", replaying),
            ("app: GET /health", through_app("/health", "GET", b"")),
        ]
        best: dict[str, float] = {}
        own: dict[str, float] = {}
        for _ in range(2):
            for name, step in steps:
                for _ in range(20):
                    await step()
                for _ in range(5):
                    model_cpu[0] = 0.0
                    started = time.process_time()
                    for _ in range(ROUND):
                        await step()
                    total = (time.process_time() - started) * 1e6 / ROUND
                    best[name] = min(best.get(name, 1e9), total)
                    own[name] = min(own.get(name, 1e9), total - model_cpu[0] * 1e6 / ROUND)
        if set(statuses) != {200}:
            raise SystemExit(f"the app answered {sorted(set(statuses))}, not only 200")
        print(f"{'':24s} {'CPU us':>8s} {'less the model calls':>21s}")
        for name in best:
            print(f"{name:24s} {best[name]:8.0f} {own[name]:21.0f}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "I like you"))
