"""The operational routes (/health, /ready, /info, /metrics, /openapi.json, /docs), the admin token, and the
public demo profile (rate limit, caps, admin routes off, CORS allowlist)."""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from container.machine import describe
from tests.api_helpers import AppClient, serve
from tests.conftest import ModelFactory

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def ner(tiny_bundle: ModelFactory) -> AsyncIterator[AppClient]:
    async with serve(tiny_bundle("token-classification")) as client:
        yield client


async def test_health_and_readiness(ner: AppClient) -> None:
    assert (await ner.get("/health")).json() == {"status": "ok"}
    ready = await ner.get("/ready")
    assert ready.status_code == 200 and ready.json() == {"ready": True}


async def test_not_ready_while_draining(tiny_bundle: ModelFactory) -> None:
    async with serve(tiny_bundle("token-classification")) as client:
        client.resources.ready = False  # what the lifespan sets when shutdown starts
        response = await client.get("/ready")
        assert response.status_code == 503 and response.json() == {"ready": False}
        await client.resources.batcher.close()
        refused = await client.post("/predict", json={"inputs": "hi"})
        assert refused.status_code == 503 and refused.json()["type"] == "NotReady"


async def test_info_describes_the_bundle_and_the_process(ner: AppClient) -> None:
    info = (await ner.get("/info")).json()
    assert info["task"] == "token-classification"
    assert info["labels"][:3] == ["O", "B-PER", "I-PER"]
    assert info["max_length"] == 126 and info["target"] == "cpu"
    assert info["variant"] in {v["name"] for v in info["variants"]}
    assert {"metrics", "gates", "timings_ms"} <= set(info["variants"][0])
    assert (info["workers"], info["streams"], info["threads"]) == (1, 2, 1)
    assert info["batching"] == {
        "max_batch_size": 32,
        "max_batch_tokens": ner.resources.manifest.max_batch_tokens,  # the bundle's measured budget
        "max_wait_ms": 0.3,
        "queue_size": 256,
        "max_queue_ms": 1000,
    }
    assert {"onnxruntime", "tokenizers", "hare", "bundle"} <= set(info["versions"])
    assert "aggregation_strategy" in info["parameters"] and isinstance(info["pid"], int)


async def test_a_bundle_keeps_the_name_it_was_built_under_wherever_it_is_mounted(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """A container mounts its bundle at /bundle: clients still address the model by the name it was built
    under (OpenAI's model, KServe's URL), or by HARE_MODEL_NAME; a bundle from before names were recorded
    goes by its folder's name."""
    built = tiny_bundle("feature-extraction")
    bundle = shutil.copytree(built, tmp_path / "bundle")
    async with serve(bundle) as client:
        assert (await client.get("/info")).json()["model"] == built.name
        assert (await client.post("/v1/embeddings", json={"input": "hi"})).json()["model"] == built.name
        assert (await client.get(f"/v2/models/{built.name}")).status_code == 200
    async with serve(bundle, HARE_MODEL_NAME="mine") as client:
        assert (await client.get("/info")).json()["model"] == "mine"
    manifest = json.loads((bundle / "hare.json").read_text())
    (bundle / "hare.json").write_text(json.dumps({k: v for k, v in manifest.items() if k != "name"}))
    async with serve(bundle) as client:
        assert (await client.get("/info")).json()["model"] == "bundle"


async def test_the_batch_budget_is_the_bundles_unless_the_operator_sets_one(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    bundle = shutil.copytree(tiny_bundle("text-classification"), tmp_path / "bundle")
    manifest = json.loads((bundle / "hare.json").read_text())
    for measured, env, expected in ((512, {}, 512), (512, {"HARE_MAX_BATCH_TOKENS": "2048"}, 2048), (None, {}, 8192)):
        (bundle / "hare.json").write_text(json.dumps(manifest | {"max_batch_tokens": measured}))
        async with serve(bundle, **env) as client:
            assert (await client.get("/info")).json()["batching"]["max_batch_tokens"] == expected


async def test_the_start_log_says_when_the_budget_was_measured_on_another_machine(
    tiny_bundle: ModelFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bundle = shutil.copytree(tiny_bundle("text-classification"), tmp_path / "bundle")
    manifest = json.loads((bundle / "hare.json").read_text())
    for cpu, warned in (("Another CPU", True), (describe()["cpu"], False)):
        measured_on = describe() | {"cpu": cpu}
        (bundle / "hare.json").write_text(
            json.dumps(manifest | {"max_batch_tokens": 512, "budget_machine": measured_on})
        )
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hare"):
            async with serve(bundle) as client:
                # Still the bundle's budget: measured elsewhere is closer than the generic default.
                assert (await client.get("/info")).json()["batching"]["max_batch_tokens"] == 512
        warnings = [r.getMessage() for r in caplog.records if "measured on another machine" in r.getMessage()]
        assert bool(warnings) == warned, caplog.text
        here = describe()
        assert not warnings or f"Another CPU, {here['physical_cores']} cores; this one: {here['cpu']}" in warnings[0]
        assert not warnings or f"`hare tune {bundle}`" in warnings[0]


async def test_an_int8_bundle_checked_on_another_int8_path_says_so_at_start_and_in_info(
    tiny_bundle: ModelFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Built on an AMX Xeon and served on an AVX2-only EPYC (the same image moved), an int8 bundle's gates and
    timings no longer describe what runs: the operator is warned, and /info says which paths. Built with
    narrow weights (64 levels a side), its integer sums are exact on both paths: only its speed was another
    CPU's, which the operator is told without a warning."""
    bundle = shutil.copytree(tiny_bundle("text-classification"), tmp_path / "bundle")
    manifest = json.loads((bundle / "hare.json").read_text())
    here = describe()["int8_path"]
    other = "avx2" if here != "avx2" else "amx"  # one of the two adds int8 products in saturating 16-bit pairs
    for path, levels, told in ((other, 127, logging.WARNING), (other, 64, logging.INFO), (here, 127, None)):
        machine = manifest["machine"] | {"int8_path": path}
        changed = {"precision": "int8", "machine": machine, "int8_levels": levels}
        (bundle / "hare.json").write_text(json.dumps(manifest | changed))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hare"):
            async with serve(bundle) as client:
                info = (await client.get("/info")).json()
        saturating = {"avx2", "avx512"} & {path, here}
        assert info["int8_path"] == {
            "checked_on": path,
            "serving_on": here,
            "same": told is None,
            "levels": levels,
            "exact": levels == 64 or not saturating,
        }
        said = [r for r in caplog.records if "int8 path" in r.getMessage()]
        assert [r.levelno for r in said] == ([told] if told else []), caplog.text
        for record in said:
            text = record.getMessage()
            assert f"on the {other} int8 path" in text and f"takes the {here} path" in text
            assert ("answers are the ones checked" in text) == (levels == 64)


async def test_metrics_count_requests_batches_tokens_and_labels(ner: AppClient) -> None:
    await ner.post("/predict", json={"inputs": ["Angela Merkel lives in Berlin"], "parameters": {"ignore_labels": []}})
    text = (await ner.get("/metrics")).text
    for name in (
        'hare_requests_total{route="/predict",status="200"}',
        'hare_request_duration_seconds_bucket{le="0.0005",route="/predict"}',
        "hare_inference_duration_seconds_count",
        "hare_queue_depth",
        "hare_batch_size_count",
        "hare_tokens_per_request_count",
        'hare_phase_duration_seconds_count{phase="tokenize"}',
        "hare_truncated_total",
        "hare_unknown_tokens_total",
        "hare_predictions_total{label=",
    ):
        assert name in text, name

    def value(name: str) -> float:  # an unlabelled series
        return float(next(line.split()[1] for line in text.splitlines() if line.startswith(f"{name} ")))

    # The event loop's own CPU, model calls left out (the bench's own-CPU figure): some, less than the process's.
    assert 0 < value("hare_loop_cpu_seconds_total") < time.process_time()


async def test_openapi_and_docs(ner: AppClient) -> None:
    spec = (await ner.get("/openapi.json")).json()
    predict = spec["paths"]["/predict"]["post"]
    params = predict["requestBody"]["content"]["application/json"]["schema"]["properties"]["parameters"]["anyOf"][0]
    properties = params["properties"]
    assert {"aggregation_strategy", "ignore_labels", "truncate", "long_input", "stride"} <= set(properties)
    # Derived from the specs the server reads with, and from its limits and error table.
    assert properties["aggregation_strategy"]["enum"] == ["none", "simple", "first", "average", "max"]
    assert properties["stride"]["maximum"] == ner.resources.limits.window_tokens // 2
    assert params["additionalProperties"] is False
    assert set(predict["responses"]) == {"200", "400", "401", "408", "413", "415", "422", "429", "500", "503"}
    assert "retry-after" in predict["responses"]["429"]["headers"]
    assert "/v1/embeddings" not in spec["paths"] and "/v2/rerank" not in spec["paths"]  # not this bundle's task
    assert {"/tokenize", "/v2/models/{name}/infer", "/v1/models"} <= set(spec["paths"])
    page = await ner.get("/docs")
    assert page.status_code == 200 and "aggregation_strategy" in page.text and "<script" not in page.text


async def test_the_admin_token_guards_metrics_and_info(tiny_bundle: ModelFactory) -> None:
    async with serve(tiny_bundle("feature-extraction"), HARE_ADMIN_TOKEN="s3cret") as client:
        for path in ("/metrics", "/info"):
            refused = await client.get(path)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            assert (await client.get(path, headers={"authorization": "Bearer wrong"})).status_code == 401
            assert (await client.get(path, headers={"authorization": "Bearer s3cret"})).status_code == 200
        assert (await client.post("/predict", json={"inputs": "hi"})).status_code == 200


async def test_public_mode_limits_and_hides_admin_routes(tiny_bundle: ModelFactory) -> None:
    async with serve(
        tiny_bundle("feature-extraction"),
        HARE_PUBLIC="1",
        HARE_RATE_BURST="3",
        HARE_CORS_ORIGINS="https://demo.example",
    ) as client:
        for path in ("/metrics", "/info"):
            assert (await client.get(path)).status_code == 404
        assert (await client.post("/predict", json={"inputs": ["a"] * 17})).status_code == 413  # 16 inputs at most
        big = await client.post("/predict", json={"inputs": "a" * 5000})  # 4000 characters at most
        assert big.status_code == 413
        answers = [await client.post("/predict", json={"inputs": "hi"}) for _ in range(2)]
        assert [a.status_code for a in answers] == [200, 429]  # the two refusals above spent two of three
        assert answers[1].json()["type"] == "RateLimited" and int(answers[1].headers["retry-after"]) >= 1
        assert (await client.get("/health")).status_code == 200  # only inference routes are limited

        allowed = await client.options(
            "/predict",
            headers={"origin": "https://demo.example", "access-control-request-method": "POST"},
        )
        # An allowed preflight is a 200 (a browser refuses the request a 4xx preflight precedes).
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "https://demo.example"
        other = await client.get("/health", headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        # A refused preflight is an error like any other: JSON, saying what is allowed (it was plain text).
        refused = await client.options(
            "/predict", headers={"origin": "https://evil.example", "access-control-request-method": "PUT"}
        )
        assert refused.status_code == 400 and refused.json()["type"] == "InputError"
        assert refused.json()["error"] == (
            "Disallowed CORS origin, method: this server allows origins https://demo.example (HARE_CORS_ORIGINS), "
            "methods GET, POST, headers accept, accept-language, authorization, content-language, content-type"
        )
