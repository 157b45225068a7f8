"""The real images in a real Docker engine: build Dockerfile.cpu and Dockerfile.gpu, run them, curl them.

Slow (a cold run builds three images: minutes), so marked `container`: `scripts/check` leaves them out,
`scripts/check --all` and CI run them, and `pytest -m container` runs just these. The engine comes from
tests/docker_engine.py (a running Docker, or a private dockerd started here as root); without one, every
test here is skipped with the reason, except where the run asked for everything (`scripts/check --all`, CI:
HARE_REQUIRE_ALL=1), where each fails with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.web.metrics import FLUSH_SECONDS
from tests.conftest import ModelFactory, unavailable
from tests.docker_engine import (
    BASE_IMAGE,
    ROOT,
    Engine,
    EngineUnavailable,
    docker_args,
    ensure_base_image,
    free_port,
    start_engine,
    wait_for,
)

pytestmark = pytest.mark.container

SENTENCE = "I like you. I love you"
MAX_IMAGE_BYTES = 1_000_000_000
READY_BUDGET_S = 5.0
HARE_UID = "10001"
# A long input: many tokens per text, so that a request keeps a worker busy for a while.
LONG_TEXT = " ".join(
    ["The appliance drains the requests it has accepted before it stops, and refuses the ones that come later."] * 12
)


def _log(message: str) -> None:
    print(f"[containers] {message}", flush=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    try:
        found = start_engine()
    except EngineUnavailable as exc:
        unavailable(f"no Docker engine: {exc}")
    try:
        try:
            ensure_base_image(found)
        except EngineUnavailable as exc:
            unavailable(f"no base image {BASE_IMAGE}: {exc}")
        yield found
    finally:
        found.stop()


def torch_build_args() -> dict[str, str]:
    """The pinned CPU torch wheel from this machine's pip find-links, put in build/wheels/ for the build;
    none found: the Dockerfiles' default (PyTorch's CPU index)."""
    import tomllib

    optimize = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["optimize"]
    (pin,) = [r for r in optimize if r.startswith("torch==")]
    version = pin.removeprefix("torch==")
    dirs = [*os.environ.get("PIP_FIND_LINKS", "").split(), "/opt/wheels"]
    for folder in map(Path, dirs):
        for wheel in sorted(folder.glob(f"torch-{version}+cpu-*.whl")) if folder.is_dir() else []:
            target = ROOT / "build" / "wheels" / wheel.name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(wheel, target)
                except OSError:
                    shutil.copyfile(wheel, target)
            return {"TORCH_SPEC": f"build/wheels/{wheel.name}", "TORCH_INDEX_URL": ""}
    return {}


@pytest.fixture(scope="module")
def cpu_image(engine: Engine) -> str:
    took = engine.build("Dockerfile.cpu", "hare:cpu", build_args=torch_build_args())
    _log(f"hare:cpu built in {took:.0f} s")
    return "hare:cpu"


class Containers:
    """Containers started by a test, removed afterwards (with their logs shown when the test failed)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.names: list[str] = []

    def run(self, image: str, *args: str, env: dict[str, str] | None = None, command: tuple[str, ...] = ()) -> str:
        name = f"hare-test-{uuid.uuid4().hex[:8]}"
        self.names.append(name)
        self.engine.docker(
            "run", "-d", "--name", name, "--network=host", *docker_args(env or {}), *args, image, *command
        )
        return name

    def logs(self, name: str) -> str:
        result = self.engine.docker("logs", name, check=False)
        return result.stdout + result.stderr

    def cleanup(self) -> None:
        for name in self.names:
            self.engine.docker("rm", "-f", name, check=False)


@pytest.fixture
def containers(engine: Engine) -> Iterator[Containers]:
    started = Containers(engine)
    yield started
    started.cleanup()


def world_readable_copy(folder: Path, into: Path) -> Path:
    """A copy the image's non-root user can read (pytest's temporary folders are private to their owner)."""
    copy = into / folder.name
    shutil.copytree(folder, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


# ---- hare:cpu -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_server(engine: Engine, cpu_image: str) -> Iterator[tuple[str, str, float]]:
    """hare:cpu as `docker run` starts it, with a read-only root as in container/k8s: (url, name, seconds to ready).
    Its port is given as `hare serve`'s flag, so the image's HEALTHCHECK must find it in the server's settings."""
    started = Containers(engine)
    port = free_port()
    start = time.perf_counter()
    name = started.run(cpu_image, "--read-only", "--tmpfs", "/tmp", command=("--port", str(port)))
    try:
        ready = wait_for(f"http://127.0.0.1:{port}/ready", 120, name, engine)
        took = time.perf_counter() - start
        _log(f"hare:cpu: docker run to /ready in {took:.2f} s (ready polled {ready:.2f} s)")
        yield f"http://127.0.0.1:{port}", name, took
    except BaseException:
        _log(started.logs(name))
        raise
    finally:
        started.cleanup()


def test_cpu_image_answers_predict(cpu_server: tuple[str, str, float]) -> None:
    url, _, _ = cpu_server
    response = httpx.post(f"{url}/predict", json={"inputs": SENTENCE}, timeout=30)
    assert response.status_code == 200, response.text
    compute = float(response.headers["x-compute-time"])
    assert 0 < compute < 5
    embedding = response.json()
    assert len(embedding) == 384 and all(isinstance(x, float) for x in embedding)
    assert abs(sum(x * x for x in embedding) - 1) < 1e-3  # all-MiniLM-L6-v2 embeddings are normalized
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    # The worker that answered writes its samples to the shared values within FLUSH_SECONDS; the one that
    # answers /metrics may be the other.
    time.sleep(2 * FLUSH_SECONDS)
    metrics = httpx.get(f"{url}/metrics", timeout=5).text
    assert 'hare_requests_total{route="/predict",status="200"}' in metrics


def test_cpu_image_becomes_ready_and_its_start_time_is_recorded(
    engine: Engine, cpu_server: tuple[str, str, float]
) -> None:
    """Every worker gunicorn booted loads the embedded model and says so (its ready line, with its pid), and
    /info describes that model. `docker run` to /ready: the 5 s goal is a figure this test records (a busy CI
    machine took 8.2 s once, a quiet one under 5), not one it holds, since no test asserts a speed."""
    url, name, took = cpu_server
    deadline = time.monotonic() + 120  # /ready answered for the first worker up: the others may still load
    while True:
        log = Containers(engine).logs(name)
        booted = re.findall(r"Booting worker with pid: (\d+)", log)
        ready = re.findall(r"ready: feature-extraction .* pid (\d+),", log)
        if booted and sorted(booted) == sorted(ready):
            break
        assert time.monotonic() < deadline, log
        time.sleep(0.5)
    info = httpx.get(f"{url}/info", timeout=5).json()
    embedded = ("all-MiniLM-L6-v2", "feature-extraction", "bert", "mean", True)  # by its name, not /bundle's
    assert (info["model"], info["task"], info["model_type"], info["pooling"], info["normalize"]) == embedded, info
    _log(f"hare:cpu: docker run to /ready in {took:.2f} s (goal {READY_BUDGET_S:g} s)")


def test_cpu_image_runs_gunicorn_as_pid_1_not_as_root(engine: Engine, cpu_server: tuple[str, str, float]) -> None:
    _, name, _ = cpu_server
    # PID 1 is gunicorn itself: the entrypoint exec'd into it, so docker stop's SIGTERM reaches it.
    cmdline = engine.docker("exec", name, "cat", "/proc/1/cmdline").stdout.split("\0")
    assert "gunicorn" in cmdline, cmdline
    status = engine.docker("exec", name, "cat", "/proc/1/status").stdout
    uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)", status, re.M)
    assert uids is not None and uids.groups() == (HARE_UID, HARE_UID)
    # The image's HEALTHCHECK command passes.
    assert engine.docker("exec", name, "python3", "-m", "api.process.healthcheck", check=False).returncode == 0


def test_cpu_image_is_slim(engine: Engine, cpu_image: str) -> None:
    image = engine.inspect(cpu_image)
    size = image["Size"]
    assert isinstance(size, int)
    _log(f"hare:cpu is {size / 1e6:.0f} MB")
    assert size <= MAX_IMAGE_BYTES, f"hare:cpu is {size / 1e6:.0f} MB (target {MAX_IMAGE_BYTES / 1e6:.0f} MB)"
    config = image["Config"]
    assert isinstance(config, dict)
    assert config["User"] == "hare"
    assert "8080/tcp" in config["ExposedPorts"]
    assert config["Healthcheck"]["Test"][0] == "CMD"
    assert config["Entrypoint"] == ["python3", "-m", "container.docker.entrypoint"]
    modules = ("torch", "transformers", "onnxruntime", "openvino")
    probe = f"import importlib.util as u; print(*[m for m in {modules} if u.find_spec(m)])"
    found = engine.docker("run", "--rm", "--entrypoint", "python3", cpu_image, "-c", probe).stdout.split()
    assert found == ["onnxruntime", "openvino"], f"the serving image holds {found}"
    # OpenVINO pruned to its CPU plugin and ONNX reader (container/docker/install.sh) still opens an ONNX graph.
    probe = "import openvino as ov; c = ov.Core(); c.read_model('/bundle/model.onnx'); print(*c.available_devices)"
    devices = engine.docker("run", "--rm", "--entrypoint", "python3", cpu_image, "-c", probe).stdout.split()
    assert devices == ["CPU"], devices


def test_cpu_image_tunes_its_bundle_for_the_machine_it_runs_on(engine: Engine, cpu_image: str) -> None:
    # The image's /bundle is read-only to its user: --dry-run prints the setting to deploy instead. Budgets up to
    # 512 tokens: every budget costs two calls a round at least, and on a flat curve the default climb to 8,192
    # tokens and its ten rounds took over the 120 s this allows under CI's load (twice).
    args = ("run", "--rm", cpu_image, "tune", "/bundle", "--dry-run", "--seconds", "0.05", "--budgets", "128,256,512")
    result = engine.docker(*args)
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("HARE_MAX_BATCH_TOKENS=") and int(line.split("=")[1]) >= 128, result.stdout


def test_docker_stop_drains_in_flight_requests(engine: Engine, cpu_image: str, containers: Containers) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # This test is about the drain: a queue bound above the burst's work, so that admission (which would answer
    # 429 to a burst over the default 1 s of queued work on a slow machine) lets all six in.
    name = containers.run(cpu_image, env={"HARE_PORT": str(port), "HARE_MAX_QUEUE_MS": "60000"})
    wait_for(f"{url}/ready", 120, name, engine)
    body = {"inputs": [LONG_TEXT] * 8}
    Outcome = tuple[float, int | str, int]  # (finished at, status or error name, embeddings)

    def send(payload: object, record: list[Outcome]) -> None:
        try:
            response = httpx.post(f"{url}/predict", json=payload, timeout=60)
            record.append((time.perf_counter(), response.status_code, len(response.json())))
        except httpx.HTTPError as exc:
            record.append((time.perf_counter(), type(exc).__name__, 0))

    in_flight: list[Outcome] = []
    connected = threading.Barrier(7)

    def send_in_flight() -> None:
        # Connected (and warm) first, so that the POSTs leave together and are read before the stop: a
        # request still in the kernel when the server stops is a latecomer, not one in flight.
        with httpx.Client(base_url=url, timeout=60) as client:
            client.get("/health")
            connected.wait()
            try:
                response = client.post("/predict", json=body)
                in_flight.append((time.perf_counter(), response.status_code, len(response.json())))
            except httpx.HTTPError as exc:
                in_flight.append((time.perf_counter(), type(exc).__name__, 0))

    senders = [threading.Thread(target=send_in_flight) for _ in range(6)]
    for thread in senders:
        thread.start()
    connected.wait(timeout=30)
    time.sleep(0.15)  # sent, read, and being computed (the six take about 0.6 s on 2 cores)
    late: list[Outcome] = []
    stopping = threading.Event()

    def keep_sending() -> None:
        while not stopping.is_set():
            send({"inputs": SENTENCE}, late)
            time.sleep(0.02)

    latecomer = threading.Thread(target=keep_sending)
    latecomer.start()
    stop_at = time.perf_counter()
    engine.docker("stop", "-t", "60", name, timeout=90)
    stopped_at = time.perf_counter()
    stopping.set()
    latecomer.join()
    for thread in senders:
        thread.join()
    outcomes = [r[1] for r in late]
    drained = max(r[0] for r in in_flight) - stop_at
    counts = {o: outcomes.count(o) for o in outcomes}
    _log(
        f"docker stop took {stopped_at - stop_at:.2f} s; in-flight requests ended {drained:.2f} s after it; "
        f"sent during it: {counts}"
    )
    assert [r[1:] for r in in_flight] == [(200, 8)] * len(senders), containers.logs(name)
    assert max(r[0] for r in in_flight) > stop_at, "every request finished before the stop: nothing was in flight"
    # Requests sent during the shutdown were answered, or refused before the server read them (connection
    # refused, or reset while still in the kernel's accept queue); never a 5xx, never a timeout.
    assert set(outcomes) <= {200, "ConnectError", "RemoteProtocolError", "ReadError"}, late
    state = engine.inspect(name)["State"]
    assert isinstance(state, dict)
    assert state["ExitCode"] == 0, f"exit {state['ExitCode']} (137: killed before draining)"
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{url}/predict", json={"inputs": SENTENCE}, timeout=5)


def test_serving_image_refuses_a_raw_model(
    engine: Engine, cpu_image: str, tiny_model: ModelFactory, tmp_path: Path
) -> None:
    model = world_readable_copy(tiny_model("text-classification"), tmp_path)
    result = engine.docker(
        "run", "--rm", "--network=host", "-v", f"{model}:/bundle:ro", "-e", "HARE_TASK=text-classification",
        cpu_image, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "hare:cpu-optimizer" in result.stderr


def test_the_consoles_docker_calls_start_list_and_stop_a_real_container(
    engine: Engine, cpu_image: str, tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """admin_ui/docker_ops.py (the console's Containers page) against this engine, where
    tests/test_console_containers.py has a stand-in: the run arguments a ContainerSpec gives (the bundle
    mounted read-only, its task, the console's labels) start a hare:cpu that serves that bundle, the page's
    list finds it with its task and source, and stop removes it. This engine has no bridge network
    (tests/docker_engine.py), so the container listens on a free port of the host's network instead of the
    published one."""
    from admin_ui import docker_ops

    bundle = world_readable_copy(tiny_bundle("text-classification"), tmp_path)
    port = free_port()
    spec = docker_ops.ContainerSpec(cpu_image, bundle, "text-classification", port, f"hare-console-{port}")
    spec.check()
    kwargs = spec.run_kwargs()
    del kwargs["ports"]
    kwargs["environment"]["HARE_PORT"] = str(port)
    client = docker_ops.connect({"DOCKER_HOST": engine.host} if engine.host else {})
    try:
        container = client.containers.run(**kwargs, network_mode="host")
        try:
            wait_for(f"http://127.0.0.1:{port}/ready", 120, spec.name, engine)
            answer = httpx.post(f"http://127.0.0.1:{port}/predict", json={"inputs": SENTENCE}, timeout=30)
            assert answer.status_code == 200 and answer.json(), answer.text  # the mounted bundle's classifier
            (found,) = [c for c in docker_ops.list_hare(client) if c.name == spec.name]
            row = docker_ops.container_row(found)
            assert (row["task"], row["source"], row["image"]) == ("text-classification", str(bundle), cpu_image)
            docker_ops.stop(client, container.id)
            assert spec.name not in [c.name for c in client.containers.list(all=True)]  # the console's: removed
        finally:
            engine.docker("rm", "-f", spec.name, check=False)
    finally:
        client.close()


# ---- hare:cpu-optimizer ---------------------------------------------------------------------------------


def test_optimizer_image_optimizes_a_mounted_model_once(
    engine: Engine, cpu_image: str, tiny_model: ModelFactory, tmp_path: Path, containers: Containers
) -> None:
    took = engine.build("Dockerfile.cpu", "hare:cpu-optimizer", target="cpu-optimizer", build_args=torch_build_args())
    _log(f"hare:cpu-optimizer built in {took:.0f} s (layers shared with hare:cpu)")
    model = world_readable_copy(tiny_model("text-classification"), tmp_path)
    volume = f"hare-test-cache-{uuid.uuid4().hex[:8]}"
    env = {
        "HARE_TASK": "text-classification",
        "HARE_OPTIMIZE_ARGS": "--variants fp32,int8 --tune-lengths 8 --tune-batches 1",
        "HARE_WORKERS": "1",
    }
    try:
        # docker stop while it optimizes: the entrypoint passes SIGTERM on and exits (as PID 1 it ignored it,
        # and the SIGKILL 10 s later left a half-built folder in the cache, which the next build now removes).
        stopped = {**env, "HARE_PORT": str(free_port())}
        name = containers.run("hare:cpu-optimizer", "-v", f"{model}:/bundle:ro", "-v", f"{volume}:/cache", env=stopped)
        deadline = time.monotonic() + 120
        while "optimizing" not in containers.logs(name) and time.monotonic() < deadline:
            time.sleep(0.2)
        engine.docker("stop", name, timeout=90)
        state = engine.inspect(name)["State"]
        assert isinstance(state, dict) and state["ExitCode"] == 2, containers.logs(name)
        assert "stopped (SIGTERM) while optimizing" in containers.logs(name)
        for attempt in ("optimizes", "reuses"):
            port = free_port()
            name = containers.run(
                "hare:cpu-optimizer", "-v", f"{model}:/bundle:ro", "-v", f"{volume}:/cache",
                env={**env, "HARE_PORT": str(port)},
            )  # fmt: skip
            waited = wait_for(f"http://127.0.0.1:{port}/ready", 300, name, engine)
            _log(f"hare:cpu-optimizer {attempt}: ready in {waited:.1f} s")
            response = httpx.post(f"http://127.0.0.1:{port}/predict", json={"inputs": SENTENCE}, timeout=30)
            assert response.status_code == 200, response.text
            logs = containers.logs(name)
            expected = "optimizing" if attempt == "optimizes" else "serving the cached bundle"
            assert expected in logs, logs
            engine.docker("stop", name, timeout=90)
        cache = engine.docker("run", "--rm", "-v", f"{volume}:/cache", "--entrypoint", "ls", "hare:cpu-optimizer", "-a",
                              "/cache/bundles").stdout  # fmt: skip
        assert ".partial-" not in cache, cache
    finally:
        containers.cleanup()
        engine.docker("volume", "rm", "-f", volume, check=False)


# ---- hare:gpu -------------------------------------------------------------------------------------------


def test_gpu_image_has_the_cuda_provider(engine: Engine) -> None:
    # No GPU and no NVIDIA base image here: the local Python base stands in for the CUDA runtime image, and
    # TensorRT's libraries (fetched from NVIDIA's index) are left out; the wheel's providers are what is checked.
    took = engine.build(
        "Dockerfile.gpu",
        "hare:gpu",
        build_args={"BASE_IMAGE": BASE_IMAGE, "TENSORRT_SPEC": "", **torch_build_args()},
    )
    size = engine.inspect("hare:gpu")["Size"]
    assert isinstance(size, int)
    _log(f"hare:gpu built in {took:.0f} s, {size / 1e6:.0f} MB")
    probe = (
        "import importlib.util as u, json, onnxruntime as o; "
        "print(json.dumps({'providers': o.get_available_providers(), "
        "'torch': u.find_spec('torch') is not None, 'manifest': json.load(open('/bundle/hare.json'))}))"
    )
    result = engine.docker("run", "--rm", "--entrypoint", "python3", "hare:gpu", "-c", probe)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert "CUDAExecutionProvider" in found["providers"], found["providers"]
    assert "TensorrtExecutionProvider" in found["providers"], found["providers"]
    assert found["torch"] is False
    assert (found["manifest"]["target"], found["manifest"]["precision"]) == ("gpu", "fp16")
