"""The one settings object: defaults, profiles, public defaults, bad values named, the docs list all."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import socket
from pathlib import Path

import pytest

from api.config import Settings, describe, layout
from api.process import serve
from api.process.memory import WORKER_BASE_BYTES
from container.bundle import (
    MANIFEST_FILE,
    MAX_BATCH_TOKENS,
    MODEL_FILE,
    TOKENIZER_FILE,
    Manifest,
    checked_bundle,
    file_sizes,
    model_bytes,
    read_manifest,
    resolve_max_batch_tokens,
)
from container.defaults import DEFAULT_BUNDLE
from container.machine import physical_cores
from container.models import open_model
from container.runtime import available_targets
from tasks.errors import InputError
from tests.conftest import ModelFactory
from tests.live_server import free_port

CONFIGURATION_PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_defaults() -> None:
    s = Settings.from_env({})
    assert s.bundle == DEFAULT_BUNDLE and s.port == 8080 and s.host == "0.0.0.0"
    assert s.profile == "throughput" and s.threads == 1
    assert (s.workers, s.streams) == layout("throughput", physical_cores())[:2]
    assert 0 < s.max_wait_ms < 1 and s.truncate and not s.public and s.admin_token is None
    assert s.rate_limit == 0 and s.max_inputs == 10_000


def test_throughput_runs_a_worker_per_core_each_with_one_stream() -> None:
    assert layout("throughput", 1) == (1, 1, 1)
    assert layout("throughput", 2) == (2, 1, 1)  # a worker's waiting requests go to its core as one call
    assert layout("throughput", 16) == (16, 1, 1)
    assert layout("throughput", 2, workers=1) == (1, 2, 1)  # fewer workers: each gets streams for its share
    assert layout("throughput", 16, workers=4) == (4, 4, 1)
    assert layout("throughput", 2, workers=3) == (3, 1, 1)
    assert Settings.from_env({"HARE_STREAMS": "3"}).streams == 3
    # A GPU: a worker per core feeding the shared engine for throughput, one worker for latency; two streams.
    assert layout("throughput", 16, gpu=True) == (16, 2, 1) and layout("latency", 16, gpu=True) == (1, 2, 1)
    gpu = Settings.from_env({"HARE_TARGET": "gpu"})
    assert (gpu.workers, gpu.streams) == (physical_cores(), 2)
    # The public demo: the profile's workers (they count a client's requests in one page of buckets).
    public = Settings.from_env({"HARE_PUBLIC": "1"})
    assert (public.workers, public.streams) == layout("throughput", physical_cores())[:2]
    assert Settings.from_env({"HARE_PUBLIC": "1", "HARE_WORKERS": "3"}).workers == 3


def test_the_latency_profile_is_one_worker_with_every_core() -> None:
    s = Settings.from_env({"HARE_PROFILE": "latency"})
    assert (s.workers, s.streams, s.threads) == (1, 1, physical_cores())
    assert Settings.from_env({"HARE_PROFILE": "latency", "HARE_THREADS": "2"}).threads == 2


def test_values_are_parsed_and_bad_ones_named() -> None:
    s = Settings.from_env(
        {
            "HARE_PORT": "9000",
            "HARE_TRUNCATE": "false",
            "HARE_CORS_ORIGINS": "https://a, https://b",
            "HARE_MAX_WAIT_MS": "0",
        }
    )
    assert (
        s.port == 9000 and s.truncate is False and s.cors_origins == ("https://a", "https://b") and s.max_wait_ms == 0
    )
    for key, value in [
        ("HARE_PORT", "eighty"),
        ("HARE_PORT", "70000"),
        ("HARE_PROFILE", "fast"),
        ("HARE_TRUNCATE", "maybe"),
        ("HARE_MAX_WAIT_MS", "-1"),
        ("HARE_WORKERS", "-2"),
        ("HARE_TARGET", "tpu"),  # it was served as cpu, silently
        ("HARE_READ_TIMEOUT", "inf"),
        ("HARE_MAX_WAIT_MS", "1e999"),
        ("HARE_CORE_POOL", "/no/such/folder"),  # each worker failed with a traceback
        ("HARE_ENGINE_SOCKET", "/no/such/folder/engine.sock"),
        ("HARE_MAX_BODY_BYTES", str(10**20)),  # "unlimited": every worker's start failed (orjson, 64 bits)
        ("HARE_RATE_LIMIT", "1e-300"),  # a 429 said to retry in a 300-digit number of seconds
    ]:
        with pytest.raises(InputError, match=key):
            Settings.from_env({key: value})
    assert Settings.from_env({"HARE_TARGET": "GPU"}).target == "gpu" and Settings.from_env({}).target is None


def test_bounds_are_refused_just_past_them_and_taken_at_them() -> None:
    """Each bound where a value starts to be refused, not only far past it: a rate limit under 0.001 a minute
    (its 429's Retry-After would run to days), a probe port past 65535 (no TCP port); and a switch takes
    every spelling its error message offers (1/0, true/false, yes/no, on/off), in any case."""
    for key, value in [("HARE_RATE_LIMIT", "0.0005"), ("HARE_PROBE_PORT", "65536"), ("HARE_PORT", "0")]:
        with pytest.raises(InputError, match=key):
            Settings.from_env({key: value})
    taken = Settings.from_env({"HARE_RATE_LIMIT": "0.001", "HARE_PROBE_PORT": "65535"})
    assert taken.rate_limit == 0.001 and taken.probe_port == 65535
    for off in ("0", "false", "no", "off", "OFF", ""):
        assert Settings.from_env({"HARE_CPU_ARENA": off}).cpu_arena is False, off
    for on in ("1", "true", "yes", "on", "On"):
        assert Settings.from_env({"HARE_CPU_ARENA": on}).cpu_arena is True, on


def test_trusted_proxies_are_checked_as_addresses_or_networks() -> None:
    """A typo in HARE_FORWARDED_ALLOW_IPS is refused naming the variable: unchecked, gunicorn exited at start
    naming its own forwarded_allow_ips. Addresses, networks and `*` are taken, spaces dropped."""
    for value in ("10.0.0.1, proxy.local", "10.0.0.300", "10.0.0.1/8"):
        with pytest.raises(InputError, match="HARE_FORWARDED_ALLOW_IPS"):
            Settings.from_env({"HARE_FORWARDED_ALLOW_IPS": value})
    taken = Settings.from_env({"HARE_FORWARDED_ALLOW_IPS": " 10.0.0.1, 10.0.0.0/8 ,::1"}).forwarded_allow_ips
    assert taken == "10.0.0.1,10.0.0.0/8,::1"
    assert Settings.from_env({"HARE_FORWARDED_ALLOW_IPS": "*"}).forwarded_allow_ips == "*"


def test_a_probe_port_that_is_the_serving_port_is_refused() -> None:
    """HARE_PROBE_PORT equal to HARE_PORT (or to the default 8080, HARE_PORT unset) is refused with a sentence
    naming both settings, before any listener tries to bind the one port twice."""
    with pytest.raises(InputError, match="HARE_PROBE_PORT=9000 is HARE_PORT's too"):
        Settings.from_env({"HARE_PORT": "9000", "HARE_PROBE_PORT": "9000"})
    with pytest.raises(InputError, match="HARE_PROBE_PORT=8080"):  # against the default port
        Settings.from_env({"HARE_PROBE_PORT": "8080"})
    assert Settings.from_env({"HARE_PORT": "9000", "HARE_PROBE_PORT": "9001"}).probe_port == 9001


def test_public_mode_changes_the_defaults_but_not_explicit_values() -> None:
    s = Settings.from_env({"HARE_PUBLIC": "1"})
    assert s.public and s.rate_limit == 60 and s.max_inputs == 16 and s.max_body_bytes == 64 * 2**10
    assert Settings.from_env({"HARE_PUBLIC": "1", "HARE_MAX_INPUTS": "100"}).max_inputs == 100


def test_to_env_round_trips() -> None:
    s = Settings.from_env({"HARE_PUBLIC": "1", "HARE_ADMIN_TOKEN": "t", "HARE_CORS_ORIGINS": "https://a"})
    assert Settings.from_env(s.to_env()) == s


def test_serve_flags_become_variables() -> None:
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    args = parser.parse_args(["/b", "--port", "9001", "--workers", "3", "--public", "--max-wait-ms", "0"])
    env = serve.environment(args, {"HARE_PORT": "1", "OTHER": "x"})
    assert env["HARE_BUNDLE"] == "/b" and env["HARE_PORT"] == "9001" and env["HARE_WORKERS"] == "3"
    assert env["HARE_PUBLIC"] == "1" and env["HARE_MAX_WAIT_MS"] == "0" and env["OTHER"] == "x"
    assert "HARE_PROFILE" not in env  # unset flags leave the environment alone


def test_every_setting_but_the_secrets_has_a_flag_that_its_own_parser_checks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The flags are generated from the settings: a new setting gets its flag, and a value the setting would
    refuse is refused by argparse, naming the flag, before anything starts."""
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    variables = {variable for _, variable in serve.flags().values()}
    assert variables == {v for v, _, _ in describe()} - {"HARE_ADMIN_TOKEN", "HARE_API_KEY"}
    args = parser.parse_args(
        ["--log-level", "critical", "--refuse-in-accept", "0", "--access-log", "--cpu-arena", "no"]
    )
    env = serve.environment(args, {})
    assert env == {"HARE_LOG_LEVEL": "critical", "HARE_REFUSE_IN_ACCEPT": "0", "HARE_ACCESS_LOG": "1",
                   "HARE_CPU_ARENA": "no"}  # fmt: skip
    assert Settings.from_env(env).log_level == "critical" and not Settings.from_env(env).refuse_in_accept
    for bad in (["--port", "0"], ["--log-level", "loud"], ["--public", "maybe"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
        assert f"argument {bad[0]}" in capsys.readouterr().err
    assert "--admin-token" not in parser.format_help()  # a flag's value would show in `ps`


def test_the_configuration_page_documents_every_variable() -> None:
    page = CONFIGURATION_PAGE.read_text()
    for variable, _, _ in describe():
        assert f"`{variable}`" in page, variable


def test_serve_builds_the_default_bundle_when_missing_then_execs_gunicorn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_bundle: ModelFactory
) -> None:
    monkeypatch.chdir(tmp_path)  # no bundles/ here
    for key in [k for k in os.environ if k.startswith("HARE_")]:
        monkeypatch.delenv(key)
    built: list[Path] = []
    execs: list[list[str]] = []

    def build(out: Path) -> None:  # stands in for the optimizer: copies a ready bundle
        built.append(out)
        shutil.copytree(tiny_bundle("feature-extraction"), out)

    monkeypatch.setattr(serve, "build_default_bundle", build)
    monkeypatch.setattr(
        os, "execvpe", lambda file, argv, env: execs.append([*argv, env["HARE_BUNDLE"], env["HARE_TARGET"]])
    )
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    assert serve.main(parser.parse_args(["--port", "9002"])) == 0
    assert built == [DEFAULT_BUNDLE]
    (argv,) = execs
    bundle = str((tmp_path / DEFAULT_BUNDLE).resolve())
    # The bundle's target is passed on, so gunicorn and the workers size themselves for it.
    assert argv[1:] == ["-m", "gunicorn", "-c", serve.CONFIG, serve.APP, bundle, "cpu"]
    # An explicit bundle that does not exist is an error, never a build.
    built.clear()
    with pytest.raises(InputError, match="does not exist"):
        serve.main(parser.parse_args([str(tmp_path / "elsewhere")]))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(InputError, match="is a file; give the bundle's folder"):
        serve.main(parser.parse_args([str(tmp_path / "a-file")]))
    assert built == []
    # A port in use is said before the build's minutes, not after them.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        shutil.rmtree(tmp_path / DEFAULT_BUNDLE)
        with pytest.raises(InputError, match=r"cannot listen on 127\.0\.0\.1:"):
            serve.main(parser.parse_args(["--host", "127.0.0.1", "--port", str(taken.getsockname()[1])]))
    assert built == []
    # A model folder where its bundle belongs: the error says how to build the bundle.
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(InputError, match=rf"it holds a model: build its bundle with `hare optimize {model} --task"):
        serve.main(parser.parse_args([str(model)]))
    assert built == []


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ({TOKENIZER_FILE: "garbage"}, "tokenizer.json is unreadable"),
        ({MANIFEST_FILE: '{"task": "summarize"}'}, "serves task 'summarize', which this hare does not know"),
        # A copy cut short: the graph's parser failed in every worker, each with its traceback.
        ({MODEL_FILE: "half"}, r"model.onnx is [\d,]+ bytes where `hare optimize` wrote [\d,]+: .* copy it again"),
        # A byte changed in place, at the same size: it loaded, and answered other numbers.
        ({MODEL_FILE: "flip"}, r"model.onnx is not the file `hare optimize` wrote: its SHA-256 differs"),
    ],
)
def test_a_damaged_bundle_is_refused_before_any_worker_starts(
    tiny_bundle: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: dict[str, str], said: str
) -> None:
    # Each worker printed a traceback and gunicorn gave up ("Worker failed to boot").
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle("feature-extraction"), bundle)
    for name, content in damage.items():
        if name == MANIFEST_FILE:
            content = json.dumps(json.loads((bundle / name).read_text()) | json.loads(content))
        if content == "half":
            whole = (bundle / name).read_bytes()
            (bundle / name).write_bytes(whole[: len(whole) // 2])
        elif content == "flip":
            changed = bytearray((bundle / name).read_bytes())
            changed[-len(changed) // 3] ^= 0x40  # inside the weights
            (bundle / name).write_bytes(bytes(changed))
        else:
            (bundle / name).write_text(content)
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execvpe", lambda file, argv, env: execs.append(argv))
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    with pytest.raises(InputError, match=said):
        serve.main(parser.parse_args([str(bundle)]))
    assert execs == []


def test_check_makes_the_starts_checks_says_what_it_would_serve_and_starts_nothing(
    tiny_bundle: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hare serve --check`, for a deploy pipeline or an init container: 0 and the plan where hare serve would
    start, its refusal where it would not; gunicorn never runs."""
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execvpe", lambda file, argv, env: execs.append(argv))
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    bundle = tiny_bundle("feature-extraction")
    assert serve.main(parser.parse_args([str(bundle), "--check", "--workers", "2", "--streams", "1"])) == 0
    said = capsys.readouterr().out
    variant = read_manifest(bundle).variant  # its name says its precision: said once
    assert said.startswith(
        f"hare serve --check: it would serve {bundle.resolve()} (feature-extraction, {variant}, cpu)"
    ), said
    assert "2 worker(s) x 1 model stream(s) x 1 thread(s)" in said and "GB free" in said, said
    damaged = tmp_path / "damaged"
    shutil.copytree(bundle, damaged)
    (damaged / TOKENIZER_FILE).write_text("garbage")
    with pytest.raises(InputError, match=r"tokenizer\.json is unreadable"):
        serve.main(parser.parse_args([str(damaged), "--check"]))
    assert execs == []


def test_workers_that_may_not_fit_in_the_memory_left_are_warned_of_before_the_start(
    tiny_bundle: ModelFactory, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each worker holds its own copies of the model: past the memory, the kernel killed workers as they loaded,
    gunicorn started them again, and the server never got ready, with gunicorn's "Perhaps out of memory?" alone
    to say why. hare serve says it before the start (and starts: the figure is an estimate)."""
    bundle = tiny_bundle("feature-extraction")
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execvpe", lambda file, argv, env: execs.append(argv))
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    graph = model_bytes(bundle)
    for room, warned in ((2 * (WORKER_BASE_BYTES + 2 * graph), False), (WORKER_BASE_BYTES, True)):
        monkeypatch.setattr(serve, "memory_room", lambda room=room: room)
        serve.main(parser.parse_args([str(bundle), "--workers", "2", "--streams", "1", "--lone-threads", "2"]))
        err = capsys.readouterr().err
        assert ("may need about" in err) is warned, err
    assert len(execs) == 2
    assert "2 worker(s) may need about 0.2 GB (2 copies of the" in err and "0.1 GB is free here" in err
    assert "set fewer HARE_WORKERS (--workers), or HARE_STREAMS, or HARE_LONE_THREADS=1" in err


@pytest.mark.skipif("gpu" in available_targets(), reason="this onnxruntime runs GPU bundles")
def test_a_gpu_bundle_where_onnxruntime_has_no_cuda_is_refused_before_gunicorn(
    tiny_bundle: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The shared engine's process failed to load it: a traceback, a fatal error at its shutdown, an abort.
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle("feature-extraction"), bundle)
    manifest = json.loads((bundle / MANIFEST_FILE).read_text()) | {"target": "gpu"}
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest))
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execvpe", lambda file, argv, env: execs.append(argv))
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    with pytest.raises(InputError, match="target 'gpu' needs CUDAExecutionProvider, but this onnxruntime offers"):
        serve.main(parser.parse_args([str(bundle)]))
    assert execs == []


def test_a_bundle_of_links_openvino_cannot_read_is_refused_saying_to_copy_its_files(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    # Each worker failed inside OpenVINO ("resolves to ... outside the base directory") and said to rebuild.
    import onnx

    real = tmp_path / "real"
    shutil.copytree(tiny_bundle("feature-extraction"), real)
    graph = onnx.load(real / MODEL_FILE)
    onnx.save(graph, real / MODEL_FILE, save_as_external_data=True, location=MODEL_FILE + ".data", size_threshold=0)
    manifest = json.loads((real / MANIFEST_FILE).read_text()) | {"variant": "bf16", "files": file_sizes(real)}
    (real / MANIFEST_FILE).write_text(json.dumps(manifest))
    links = tmp_path / "links"
    links.mkdir()
    for file in real.iterdir():
        (links / file.name).symlink_to(file)
    with pytest.raises(InputError, match=r"model.onnx.data is a link to .+ copy the bundle with its files \(cp -rL\)"):
        checked_bundle(links)
    (tmp_path / "folder-link").symlink_to(real)
    for served in (real, tmp_path / "folder-link"):  # the files themselves, or a link to their folder
        checked_bundle(served)
    manifest["variant"] = "fp32"  # ONNX Runtime follows the links
    (real / MANIFEST_FILE).write_text(json.dumps(manifest))
    checked_bundle(links)


def test_the_bundles_max_batch_tokens_applies_only_on_the_target_it_was_measured_on(tiny_bundle: ModelFactory) -> None:
    manifest = dataclasses.replace(read_manifest(tiny_bundle("feature-extraction")), max_batch_tokens=256)
    assert Settings.from_env({}).for_bundle(manifest).max_batch_tokens == 256
    assert Settings.from_env({"HARE_MAX_BATCH_TOKENS": "1024"}).for_bundle(manifest).max_batch_tokens == 1024
    # A CPU bundle served on a GPU: 256-token batches would starve the device.
    assert Settings.from_env({"HARE_TARGET": "gpu"}).for_bundle(manifest).max_batch_tokens == 8192
    # The one resolver the server, its start log and the peers bench share, and where each value came from.
    assert resolve_max_batch_tokens(manifest) == (256, "bundle")
    assert resolve_max_batch_tokens(manifest, 1024, "gpu") == (1024, "setting")
    assert resolve_max_batch_tokens(manifest, 0, "gpu") == (MAX_BATCH_TOKENS, "default")
    unmeasured = dataclasses.replace(manifest, max_batch_tokens=None)
    assert resolve_max_batch_tokens(unmeasured, 0, "cpu") == (MAX_BATCH_TOKENS, "default")


def test_auto_shares_one_engine_only_for_a_gpu_served_by_several_workers(tiny_bundle: ModelFactory) -> None:
    """HARE_ENGINE=auto: a GPU bundle with several workers gets one engine process (separate sessions would
    time-slice the device); a lone GPU worker runs its own sessions, sparing every request the hop to an engine
    process; a CPU bundle never shares unless told to."""
    cpu = read_manifest(tiny_bundle("feature-extraction"))
    gpu = dataclasses.replace(cpu, target="gpu")

    def shared(manifest: Manifest, **env: str) -> bool:
        return Settings.from_env(env).shared_engine(manifest)

    assert shared(gpu, HARE_WORKERS="2") and shared(cpu, HARE_WORKERS="2", HARE_TARGET="gpu")
    assert not shared(gpu, HARE_WORKERS="1") and not shared(gpu, HARE_PROFILE="latency")
    assert not shared(cpu, HARE_WORKERS="4") and not shared(gpu, HARE_WORKERS="4", HARE_TARGET="cpu")
    assert shared(cpu, HARE_WORKERS="1", HARE_ENGINE="shared") and not shared(gpu, HARE_ENGINE="per-worker")


def test_a_bulk_job_batches_at_the_budget_of_the_best_rate_and_the_server_at_the_smallest_near_it(
    tiny_bundle: ModelFactory,
) -> None:
    rates = {"128": 21_885.0, "256": 22_839.0, "512": 22_957.0, "1024": 22_512.0}  # int8-grouped MiniLM's, measured
    manifest = dataclasses.replace(
        read_manifest(tiny_bundle("feature-extraction")), max_batch_tokens=128, token_rates=rates
    )
    assert resolve_max_batch_tokens(manifest) == (128, "bundle")
    assert resolve_max_batch_tokens(manifest, throughput=True) == (512, "bundle")
    assert Settings.from_env({}).for_bundle(manifest, throughput=True).max_batch_tokens == 512
    # A setting wins for both; a CPU bundle on a GPU gets the default for both.
    assert resolve_max_batch_tokens(manifest, 1024, throughput=True) == (1024, "setting")
    assert resolve_max_batch_tokens(manifest, 0, "gpu", throughput=True) == (MAX_BATCH_TOKENS, "default")


@pytest.mark.parametrize("variant", ["fp32", "bf16"])  # ONNX Runtime's, and OpenVINO's where installed
def test_a_damaged_graph_is_one_sentence_naming_its_file(tmp_path: Path, variant: str) -> None:
    # Each runtime's own traceback came out of `hare run` and `hare tune` (OpenVINO's first lines name its sources).
    if variant == "bf16":
        pytest.importorskip("openvino")
    graph = tmp_path / "model.onnx"
    graph.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InputError, match=rf"{graph} is not a graph the runtime can load \(.+\); rebuild the bundle"):
        open_model(graph, variant)


def test_an_address_it_cannot_listen_on_is_refused_naming_the_setting(
    tiny_bundle: ModelFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gunicorn retried for five seconds, then exited naming neither HARE_PORT nor HARE_HOST.
    monkeypatch.setattr(os, "execvpe", lambda file, argv, env: pytest.fail("gunicorn started"))
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    bundle = str(tiny_bundle("feature-extraction"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        with pytest.raises(InputError, match=rf"cannot listen on 127.0.0.1:{port} .*set HARE_PORT"):
            serve.main(parser.parse_args([bundle, "--host", "127.0.0.1", "--port", port]))
    with pytest.raises(InputError, match=r"HARE_HOST='not a host' .* is not an address"):
        serve.main(parser.parse_args([bundle, "--host", "not a host"]))


@pytest.mark.parametrize(
    ("manifest", "said"),
    [("[]", "it holds a list, not an object"), ("null", "it holds null"), ('{"task": "x"}', "it lacks architecture")],
)
def test_a_manifest_that_is_not_one_says_what_it_lacks(
    tiny_bundle: ModelFactory, tmp_path: Path, manifest: str, said: str
) -> None:
    # It said "Manifest.__init__() missing 12 required positional arguments" or "'NoneType' object is not iterable".
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle("feature-extraction"), bundle)
    (bundle / MANIFEST_FILE).write_text(manifest)
    with pytest.raises(InputError, match=f"hare.json is unreadable: {said}"):
        read_manifest(bundle)


@pytest.mark.parametrize("task", ["text-classification", "token-classification", "text-ranking", "sparse-embedding"])
def test_a_bundle_whose_task_was_edited_is_refused_before_any_worker(
    tiny_bundle: ModelFactory, tmp_path: Path, task: str
) -> None:
    # Each failed in every worker with a traceback from post-processing an embedding model's states.
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle("feature-extraction"), bundle)
    (bundle / MANIFEST_FILE).write_text(json.dumps(json.loads((bundle / MANIFEST_FILE).read_text()) | {"task": task}))
    with pytest.raises(InputError, match=f"its graph answers 'last_hidden_state'.*hare optimize --task {task}"):
        checked_bundle(bundle)


@pytest.mark.parametrize(
    ("built", "edited", "said"),
    [
        ("text-classification", "token-classification", "reads one row a token, but its graph answers one row a text"),
        ("token-classification", "text-classification", "reads one row a text, but its graph answers one row a token"),
        ("token-classification", "text-ranking", "reads one row a text, but its graph answers one row a token"),
    ],
)
def test_a_bundle_whose_task_was_edited_among_those_reading_logits_is_refused(
    tiny_bundle: ModelFactory, tmp_path: Path, built: str, edited: str, said: str
) -> None:
    # Their graphs all answer "logits": each failed in every worker with a traceback (IndexError, ValueError).
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle(built), bundle)
    (bundle / MANIFEST_FILE).write_text(json.dumps(json.loads((bundle / MANIFEST_FILE).read_text()) | {"task": edited}))
    with pytest.raises(InputError, match=f"{said} .*hare optimize --task {edited}"):
        checked_bundle(bundle)


@pytest.mark.parametrize("task", ["feature-extraction", "text-classification"])
def test_a_graph_that_is_no_onnx_model_is_refused_before_any_worker(
    tiny_bundle: ModelFactory, tmp_path: Path, task: str
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle(task), bundle)
    (bundle / MODEL_FILE).write_bytes(b"\xff" * (bundle / MODEL_FILE).stat().st_size)  # its size, as hare.json says
    with pytest.raises(InputError, match=r"model\.onnx is not an ONNX graph .*rebuild the bundle"):
        checked_bundle(bundle)


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        # Each failed in every worker with a traceback, or as a request's error, or (labels) in `hare serve`.
        ({"max_length": "256"}, "its max_length is a string, where the build writes an integer"),
        ({"labels": ["a", "b"]}, "its labels is a list, where the build writes an object"),
        ({"normalize": "no"}, "its normalize is a string, where the build writes a boolean"),
        ({"pad_id": "x"}, "its pad_id is a string, where the build writes an integer"),
        ({"format_version": "1"}, "its format_version is a string"),  # "has bundle format 1, this hare reads 1"
        ({"max_length": -1}, "one of its max_length -1, target 'cpu', pooling 'mean' is no build's"),
        ({"max_length": 0}, "one of its max_length 0, target 'cpu'"),  # every text cut to no tokens
        ({"max_length": True}, "its max_length is a boolean, where the build writes an integer"),  # JSON's true
        ({"pooling": "weird"}, "pooling 'weird' is no build's"),
        ({"target": "tpu"}, "target 'tpu'"),  # named HARE_TARGET, which the user never set
        ({"max_active_dims": 0}, "its max_active_dims 0 is no build's"),  # every sparse vector emptied
        ({"max_active_dims": "5"}, "its max_active_dims is a string, where the build writes an integer or null"),
    ],
)
def test_a_hand_edited_manifest_names_the_field_of_the_wrong_kind(
    tiny_bundle: ModelFactory, tmp_path: Path, edit: dict[str, object], said: str
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle("feature-extraction"), bundle)
    (bundle / MANIFEST_FILE).write_text(json.dumps(json.loads((bundle / MANIFEST_FILE).read_text()) | edit))
    with pytest.raises(InputError, match="hare.json is unreadable: .*" + re.escape(said)):
        read_manifest(bundle)


def test_a_bundle_of_another_format_is_refused_saying_to_rebuild_it(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """A bundle written by a hare of another bundle format is refused before any worker loads it, with the two
    formats and what to do, rather than served by a reader that does not know its files."""
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle("feature-extraction"), bundle)
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest | {"format_version": 2}))
    with pytest.raises(InputError, match=r"has bundle format 2, this hare reads 1; rebuild it with `hare optimize`"):
        checked_bundle(bundle)


def test_labels_edited_to_another_count_than_the_graphs_scores_are_refused(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    # Renaming labels is an edit people make; one added answered scores under the wrong names (rc 0). Checked where
    # the graph states its scores a row: a token classifier's (a sequence classifier's export leaves it named).
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle("token-classification"), bundle)
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    count = len(manifest["labels"])
    renamed = {k: f"class {k}" for k in manifest["labels"]}
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest | {"labels": renamed}))
    assert checked_bundle(bundle)[0].labels[0] == "class 0"  # renamed, the same count: served
    for labels in ({**renamed, str(count): "one more"}, dict(list(renamed.items())[:-1])):
        (bundle / MANIFEST_FILE).write_text(json.dumps(manifest | {"labels": labels}))
        with pytest.raises(InputError, match=f"names {len(labels)} labels, but its graph answers {count} scores a row"):
            checked_bundle(bundle)


def test_a_misspelled_setting_is_named_with_the_one_it_resembles(
    tiny_bundle: ModelFactory, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # HARE_MAX_BATCH=-1 was ignored without a word: the server ran on the default its user meant to change.
    for name, value in {
        "HARE_MAX_BATCH": "-1",
        "HARE_WORKER": "2",
        "HARE_CONSOLE_TOKEN": "t",
        "HARE_BENCH_DB": "x",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "execvpe", lambda file, argv, env: None)
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    bundle = tiny_bundle("feature-extraction")
    capsys.readouterr()  # what building it printed
    serve.main(parser.parse_args([str(bundle), "--port", str(free_port())]))
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "hare serve: HARE_MAX_BATCH is no setting (did you mean HARE_MAX_BATCH_SIZE?); it is ignored",
        "hare serve: HARE_WORKER is no setting (did you mean HARE_WORKERS?); it is ignored",
    ]  # the console's and the bench's variables are theirs, not misspellings
