"""The `hare-http` candidate: `hare serve` of the bundle on loopback, one POST /predict per call, end to end
(the request, tokenizing, batching, the model, pooling, the answer, the client decoding it)."""

from __future__ import annotations

import base64
import os

import httpx
import numpy as np

from bench.peers.candidates.base import Encoder, Skip, Vectors
from bench.peers.candidates.workspace import Workspace
from bench.servers import ServerProcess, bench_api_key, hare_server
from container.bundle import read_manifest


class HttpEncoder:
    """`hare serve` on `threads` of this process's CPUs (it sizes its workers, streams and threads to them, as
    on a machine of that many cores), with its defaults otherwise; vectors asked as base64 float32, as the
    OpenAI client asks (a JSON list of 384 floats a text would time the client's parser as much as hare)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        key = bench_api_key()  # the server inherits HARE_API_KEY: every call was a 401
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(base_url=server.url, timeout=120.0, headers=headers)

    def __call__(self, texts: list[str]) -> Vectors:
        answer = self.client.post("/predict", json={"inputs": texts, "parameters": {"encoding_format": "base64"}})
        if answer.status_code != 200:
            raise RuntimeError(f"hare serve answered {answer.status_code}: {answer.text[:300]}")
        return np.stack([np.frombuffer(base64.b64decode(vector), "<f4") for vector in answer.json()])

    def close(self) -> None:
        self.client.close()
        self.server.close()


def load_hare_http(space: Workspace, threads: int) -> Encoder:
    bundle = space.options.bundle
    if read_manifest(bundle).task != "feature-extraction":
        raise Skip(f"{bundle} is not a feature-extraction bundle; the peers compare embedding models")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < threads:
        raise Skip(f"{threads} threads asked, {len(cpus)} CPUs here")
    server = hare_server(bundle, cpus=set(cpus[:threads])).start()
    try:
        server.wait_ready()
    except BaseException:
        server.close()
        raise
    encoder = HttpEncoder(server)
    return Encoder(encoder, close=encoder.close)
