"""The one settings object for `hare serve`: every knob, its HARE_* variable, its default and what it does.

`hare serve`'s flags only set these variables, so the CLI, the container and a plain `gunicorn` call read
the same configuration. Nothing is read at import time: `Settings.from_env()` reads when called.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container.bundle import MAX_BATCH_SIZE, MAX_BATCH_TOKENS, Manifest, resolve_max_batch_tokens
from container.defaults import DEFAULT_BUNDLE
from container.machine import physical_cores
from tasks.errors import InputError

PROFILES = ("throughput", "latency")
ENGINES = ("auto", "shared", "per-worker")
# Throughput profile: one worker process per physical core, so the Python side (HTTP, tokenizing, answering)
# has an event loop per core, each running one model stream: the worker's waiting requests go to the model
# as one call on its core. Two streams a worker (the default until 2026-11-29) ran them as two smaller calls
# taking turns on the cores: on an AMX Xeon, 2 cores, one stream answered 1.4-1.9x the requests at 8-64 users
# on short texts, and 0.93-1.25x at 2 users or 128 tokens (docs/serving.md, Process model). Two streams
# were kept while keep-alive could pin both clients of a 2-core machine to one worker (one stream then ran at
# half speed); the workers now balance their connections (api/process/worker.py), and a lone call takes
# every core (api/engine/cores.py).
# HARE_WORKERS at most, a CPU hare may use (`hare serve` refuses more: api/process/serve.py check_workers).
WORKERS_A_CPU = 4
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_UNSET = object()


# The largest integer a setting takes: the workers hand settings to orjson (/info) and numpy, which hold 64 bits;
# HARE_MAX_BODY_BYTES=100000000000000000000 ("unlimited") passed, then failed every worker's start.
INT64_MAX = 2**63 - 1


def _int(low: int, high: int = INT64_MAX) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError("expected an integer") from None
        if not low <= value <= high:
            bounds = f"from {low} to {high}" if high < INT64_MAX else f"of at least {low}, below 2**63"
            raise ValueError(f"expected an integer {bounds}")
        return value

    return parse


def _rate(text: str) -> float:
    """A rate limit a minute: 0 (none), or one whose Retry-After is a number of seconds a client can wait
    (HARE_RATE_LIMIT=1e-300 was taken, and a refusal said to come back in a 300-digit number of seconds)."""
    value = _float(0)(text)
    if 0 < value < 0.001:
        raise ValueError("expected 0 (no limit) or at least 0.001 a minute")
    return value


def _float(low: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError("expected a number") from None
        if not low <= value < math.inf:  # also refuses nan
            raise ValueError(f"expected a finite number of at least {low}")
        return value

    return parse


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return text.lower()

    return parse


def _optional_port(text: str) -> int | None:
    """A TCP port, or None for an empty value."""
    return _int(1, 65535)(text) if text else None


def _optional(text: str) -> str | None:
    return text or None


def _optional_choice(options: tuple[str, ...]) -> Callable[[str], str | None]:
    """One of `options`, or None for an empty value."""
    choose = _choice(options)
    return lambda text: choose(text) if text else None


def _folder(text: str) -> Path | None:
    """An existing folder, or None for an empty value."""
    if text and not Path(text).is_dir():
        raise ValueError("expected an existing folder")
    return Path(text) if text else None


def _socket(text: str) -> Path | None:
    """A Unix socket's path in an existing folder (the socket itself comes when its server listens), or None
    for an empty value."""
    if text and not Path(text).parent.is_dir():
        raise ValueError("expected a path in an existing folder")
    return Path(text) if text else None


def _origins(text: str) -> tuple[str, ...]:
    return tuple(o.strip() for o in text.split(",") if o.strip())


def _proxies(text: str) -> str:
    """Comma-separated IP addresses or networks, or `*`, as gunicorn takes them (host bits of a network zero):
    unchecked here, a typo reached gunicorn, which exited 1 with three lines naming its own setting,
    `Invalid value for forwarded_allow_ips: ...`, and not HARE_FORWARDED_ALLOW_IPS."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    for item in items:
        if item != "*":
            try:
                ipaddress.ip_network(item)
            except ValueError as exc:
                raise ValueError(f"expected `*` or comma-separated IP addresses or networks: {exc}") from None
    return ",".join(items)


def _setting(env: str, parse: Callable[[str], Any], help: str, default: Any, public: Any = _UNSET) -> Any:
    """A field read from `env` by `parse`; `public` is its default under HARE_PUBLIC=1 (when it differs)."""
    return field(default=default, metadata={"env": env, "parse": parse, "help": help, "public": public})


@dataclass(frozen=True)
class Settings:
    """How one `hare serve` runs. Each field's metadata names its variable and documents it."""

    bundle: Path = _setting(  # noqa: RUF009 (_setting returns a dataclasses.field)
        "HARE_BUNDLE", Path, "bundle folder to serve (from `hare optimize`)", DEFAULT_BUNDLE
    )
    host: str = _setting("HARE_HOST", str, "address to listen on", "0.0.0.0")
    port: int = _setting("HARE_PORT", _int(1, 65535), "port to listen on", 8080)
    probe_port: int | None = _setting(
        "HARE_PROBE_PORT",
        _optional_port,
        "a second port, on the same address, that answers GET /health, /ready, /metrics and KServe's /v2/health "
        "probes only and accepts its connections at once: point liveness and readiness probes at it (on "
        "HARE_PORT, while the server refuses, new connections are accepted at a pace and a probe waits its turn "
        "behind the others; empty: none)",
        None,
    )
    profile: str = _setting(
        "HARE_PROFILE",
        _choice(PROFILES),
        "throughput: one worker per physical core, each with one model stream of one ORT thread (on a GPU, "
        "all feeding one shared engine); latency: one worker, one stream using every core (on a GPU, two)",
        "throughput",
    )
    workers: int = _setting(
        "HARE_WORKERS",
        _int(0),
        f"worker processes, at most {WORKERS_A_CPU} a CPU (0: from the profile)",
        0,
    )
    streams: int = _setting(
        "HARE_STREAMS",
        _int(0),
        f"model calls one worker runs at once under load, each on its own thread, at most {WORKERS_A_CPU} a CPU (0: "
        "from the profile); alone on a "
        "quiet machine, a worker runs a request's calls on every core (docs/serving.md, The machine's cores)",
        0,
    )
    threads: int = _setting(
        "HARE_THREADS", _int(0), "ONNX Runtime intra-op threads per model stream (0: from the profile)", 0
    )
    cores: int = _setting(
        "HARE_CORES",
        _int(0),
        "cores all workers share, at most the CPUs this process may use: at no moment do their model calls run "
        "more ONNX Runtime threads (0: the physical cores within the cgroup's CPU quota)",
        0,
    )
    lone_threads: int = _setting(
        "HARE_LONE_THREADS",
        _int(0),
        "model threads of a lone request on a quiet machine (0: every core; 1: off, which saves a copy of the "
        "model per worker: an ONNX Runtime session's repacked weights, an OpenVINO compiled copy)",
        0,
    )
    idle_priority: bool = _setting(
        "HARE_IDLE_PRIORITY",
        parse_bool,
        "model threads run at the kernel's idle priority (SCHED_IDLE, Linux): the event loops (HTTP, "
        "tokenizing, answering, refusing) take a core from a model call the moment they wake rather than "
        "after its time slice. Measured: p99/p50 1.17 against 1.3 at 128 tokens and users = cores, but 2-5% "
        "less goodput under overload (the event loops' parsing and refusing always come first), and anything "
        "else of normal priority in the container comes first too",
        False,
    )
    inline_ms: float = _setting(
        "HARE_INLINE_MS",
        _float(0),
        "a worker serving a single connection runs a model call expected to take at most this long (at the "
        "measured token rate) on its event loop instead of a model thread: no thread hand-offs, each a wake-up "
        "that can wait for a busy core. Its one client waits for that answer anyway, and new connections go "
        "to the other workers meanwhile. With several connections, only a call expected under 1 ms runs there "
        "(a quick model's, with the requests read in the same turn of the loop). 0: always a model thread",
        50.0,
    )
    core_pool: Path | None = _setting(  # noqa: RUF009 (_setting returns a dataclasses.field)
        "HARE_CORE_POOL",
        _folder,
        "folder the workers share: the machine-wide core pool, and the rate limit's buckets (set by the "
        "gunicorn config; empty: this process alone)",
        None,
    )
    cpu_arena: bool = _setting(
        "HARE_CPU_ARENA",
        parse_bool,
        "keep ONNX Runtime's CPU memory arena (faster allocations; a burst's peak stays allocated)",
        True,
    )
    target: str | None = _setting(
        "HARE_TARGET",
        _optional_choice(("cpu", "gpu")),
        "cpu or gpu execution provider (empty: the bundle's target)",
        None,
    )
    engine: str = _setting(
        "HARE_ENGINE",
        _choice(ENGINES),
        "shared: one engine process holds the model and runs every worker's calls together (the workers parse, "
        "tokenize and answer); per-worker: each worker runs its own sessions; auto: shared for a GPU bundle "
        "served by several workers (separate sessions time-slice the GPU), per-worker otherwise",
        "auto",
    )
    engine_socket: Path | None = _setting(  # noqa: RUF009 (_setting returns a dataclasses.field)
        "HARE_ENGINE_SOCKET",
        _socket,
        "the shared engine's Unix socket (set by the gunicorn config when it starts one; empty: none)",
        None,
    )
    cuda_graphs: bool = _setting(
        "HARE_CUDA_GRAPHS",
        parse_bool,
        "on a GPU, replay a captured CUDA graph for each padded batch shape up to 4,096 tokens (the kernels of "
        "a call launched at once, not one by one); a bundle ORT cannot capture runs plainly, said in the log",
        True,
    )
    max_batch_size: int = _setting("HARE_MAX_BATCH_SIZE", _int(1), "sequences per model call at most", MAX_BATCH_SIZE)
    max_batch_tokens: int = _setting(
        "HARE_MAX_BATCH_TOKENS",
        _int(0),
        "padded tokens per model call at most (longest sequence x sequences); one sequence always fits (0: what "
        "`hare optimize` or `hare tune` measured for the bundle on its target, the smallest batch within 5% of "
        "the best token rate with every core busy, and for `hare run` the best itself; "
        f"{MAX_BATCH_TOKENS} for a bundle without one)",
        0,
    )
    max_wait_ms: float = _setting(
        "HARE_MAX_WAIT_MS",
        _float(0),
        "longest a batch waits for requests still being read or tokenized (0: never waits)",
        0.3,
    )
    queue_size: int = _setting(
        "HARE_QUEUE_SIZE", _int(1), "requests one worker holds at once; beyond it answers 429 at once", 256
    )
    max_queue_ms: float = _setting(
        "HARE_MAX_QUEUE_MS",
        _float(0),
        "longest expected wait (the machine's queued padded tokens over the measured token rate) at which a "
        "request is still admitted; beyond it 429 with Retry-After (0: no time bound). 1000 keeps an "
        "accepted answer's server time near 1 s plus one batch under any overload",
        1000.0,
    )
    refuse_in_accept: bool = _setting(
        "HARE_REFUSE_IN_ACCEPT",
        parse_bool,
        "while admission refuses, a new connection's POST is answered from the accept loop with a prebuilt 429 "
        "(Retry-After, Connection: close), without parsing HTTP or running the app (api/process/refuser.py): a few "
        "system calls, so refusals keep up with arrivals far past capacity and no client waits unseen in the "
        "listen backlog (0: every connection goes through uvicorn and the app's own early 429)",
        True,
    )
    refusals_per_answer: float = _setting(
        "HARE_REFUSALS_PER_ANSWER",
        _float(0),
        "while admission refuses, the workers together accept up to this many new connections a second (each "
        "gets its 429) for each answer a second the machine is measured to give; the others wait in the "
        "kernel's listen backlog, so a flood of greedy clients, which come back as soon as they are refused, "
        "cannot spend the cores on refusals, while open-loop arrivals up to (this + 1) x capacity are all "
        "refused at once (0: the interval alone paces; docs/history/measurements-2026-11.md measured the choice)",
        3.0,
    )
    refusal_interval_ms: float = _setting(
        "HARE_REFUSAL_INTERVAL_MS",
        _float(0),
        "while admission refuses, one worker accepts at most one new connection per this interval, on average "
        "(the event loop's timers count milliseconds: below one, a few at once; with HARE_REFUSALS_PER_ANSWER 0, "
        "the pace itself; 0 and 0: accept every connection at once)",
        0.5,
    )
    truncate: bool = _setting(
        "HARE_TRUNCATE", parse_bool, "default of the truncate parameter (false: too-long inputs get 413)", True
    )
    max_body_bytes: int = _setting(
        "HARE_MAX_BODY_BYTES", _int(1), "largest request body (413 beyond)", 4 * 2**20, public=64 * 2**10
    )
    max_inputs: int = _setting("HARE_MAX_INPUTS", _int(1), "texts (or documents) per request", 10_000, public=16)
    max_input_chars: int = _setting(
        "HARE_MAX_INPUT_CHARS", _int(1), "characters per text (413 beyond)", 1_000_000, public=4_000
    )
    max_answer_values: int = _setting(
        "HARE_MAX_ANSWER_VALUES",
        _int(1),
        "numbers in an answer of token vectors (output_value token_embeddings, /embed_all, bge-m3's colbert_vecs; "
        "413 beyond): the default holds 32 texts of 512 tokens at 1,024 dimensions, about 190 MB of JSON",
        2**24,
        public=2**20,
    )
    admin_token: str | None = _setting(
        "HARE_ADMIN_TOKEN",
        _optional,
        "when set, /metrics and /info need `Authorization: Bearer <token>`",
        None,
    )
    api_key: str | None = _setting(
        "HARE_API_KEY",
        _optional,
        "when set, the inference and model routes (POST /, /predict, /similarity, /embed, /embed_all, "
        "/embed_sparse, /rerank, /tokenize, /decode, /v1/*, /v2/embed, /v2/rerank, /v2/models/*) need "
        "`Authorization: Bearer <key>` (health, /v2, /docs and /openapi.json stay open); unset, an Authorization "
        "header is ignored",
        None,
    )
    public: bool = _setting(
        "HARE_PUBLIC",
        parse_bool,
        "public demo profile: rate limit, small caps, /metrics and /info off unless HARE_ADMIN_TOKEN is set",
        False,
    )
    cors_origins: tuple[str, ...] = _setting(
        "HARE_CORS_ORIGINS", _origins, "comma-separated origins allowed by CORS (empty: no CORS headers)", ()
    )
    rate_limit: float = _setting(
        "HARE_RATE_LIMIT",
        _rate,
        "requests per minute per client address on the inference routes, those HARE_API_KEY guards, counted "
        "by all workers together (0: no limit; else at least 0.001)",
        0.0,
        public=60.0,
    )
    rate_burst: int = _setting("HARE_RATE_BURST", _int(1), "requests a client may send at once", 10)
    forwarded_allow_ips: str = _setting(
        "HARE_FORWARDED_ALLOW_IPS",
        _proxies,
        "proxies trusted for X-Forwarded-For (the client address rate limits use)",
        "127.0.0.1,::1",
    )
    model_name: str | None = _setting(
        "HARE_MODEL_NAME",
        _optional,
        "the model name clients see (OpenAI's model, KServe's); empty: the bundle's own (its folder's name when built)",
        None,
    )
    log_level: str = _setting("HARE_LOG_LEVEL", _choice(LOG_LEVELS), "log level", "info")
    access_log: bool = _setting("HARE_ACCESS_LOG", parse_bool, "log every request line (never bodies)", False)
    graceful_timeout: int = _setting(
        "HARE_GRACEFUL_TIMEOUT", _int(1), "seconds in-flight requests get to finish after SIGTERM", 30
    )
    read_timeout: float = _setting(
        "HARE_READ_TIMEOUT",
        _float(0),
        "seconds a connection gets to send a request's head (from its start or its last answer), and then its "
        "body (one begun and not ended is answered 408), and its client to take more of an answer, before it is "
        "closed (0: no limit); a connection that "
        "never finishes a request is otherwise held for good, with its admission place once its head came, and "
        "an answer never read, with its memory",
        30.0,
        public=10.0,  # its bodies are 64 KB at most
    )

    @classmethod
    def from_env(cls, mapping: Mapping[str, str] | None = None) -> Settings:
        """Read every HARE_* variable of `mapping` (default os.environ); a bad value raises InputError naming it."""
        env = os.environ if mapping is None else mapping
        public = _read(env, _fields()["public"], False)
        values = {f.name: _read(env, f, public) for f in dataclasses.fields(cls)}
        settings = cls(**values)
        if settings.probe_port == settings.port:
            port = settings.probe_port
            raise InputError(f"HARE_PROBE_PORT={port} is HARE_PORT's too; give the probes a port of their own")
        gpu = settings.target == "gpu"
        workers, streams, threads = layout(settings.profile, physical_cores(), settings.workers, gpu)
        return dataclasses.replace(
            settings,
            bundle=settings.bundle.expanduser(),
            workers=workers,
            streams=settings.streams or streams,
            threads=settings.threads or threads,
            cores=settings.cores or physical_cores(),
        )

    @staticmethod
    def misspelled(env: Mapping[str, str]) -> list[str]:
        """A sentence for each HARE_* variable of `env` that is no setting but reads like one (HARE_MAX_BATCH,
        HARE_WORKER): ignored as any unknown variable is, it left the server on a default its user thought
        changed. Other components' variables (HARE_CONSOLE_*, HARE_BENCH_DB, ...) resemble none."""
        names = [f.metadata["env"] for f in dataclasses.fields(Settings)]
        said = []
        for key in sorted(k for k in env if k.startswith("HARE_") and k not in names):
            if close := difflib.get_close_matches(key, names, 1, 0.8):
                said.append(f"{key} is no setting (did you mean {close[0]}?); it is ignored")
        return said

    def shared_engine(self, manifest: Manifest) -> bool:
        """Whether one engine process should run the model for all workers (HARE_ENGINE)."""
        if self.engine == "auto":
            return (self.target or manifest.target) == "gpu" and self.workers > 1
        return self.engine == "shared"

    def on_bundle_target(self, manifest: Manifest) -> bool:
        """Whether the bundle is served on the target it was built and measured for (HARE_TARGET may differ)."""
        return (self.target or manifest.target) == manifest.target

    def for_bundle(self, manifest: Manifest, throughput: bool = False) -> Settings:
        """These settings with what was left to the bundle filled from its manifest: max_batch_tokens
        (container/bundle.py resolve_max_batch_tokens; `throughput`: a bulk job's)."""
        resolved = resolve_max_batch_tokens(manifest, self.max_batch_tokens, self.target, throughput)
        return dataclasses.replace(self, max_batch_tokens=resolved.max_batch_tokens)

    def to_env(self) -> dict[str, str]:
        """The HARE_* variables that reproduce these settings (what `hare serve` hands to gunicorn)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                text = ",".join(value)
            elif isinstance(value, bool):
                text = "1" if value else "0"
            elif value is None:
                text = ""
            else:
                text = str(value)
            out[f.metadata["env"]] = text
        return out

    @property
    def batching(self) -> dict[str, float | int]:
        return {
            "max_batch_size": self.max_batch_size,
            "max_batch_tokens": self.max_batch_tokens,
            "max_wait_ms": self.max_wait_ms,
            "queue_size": self.queue_size,
            "max_queue_ms": self.max_queue_ms,
        }

    @property
    def spread(self) -> int:
        """Model calls one worker runs at once while the machine is quiet: a narrow call on each core (a request
        of several calls alone on the machine; MiniLM, one client sending 32 texts of 128 tokens a request, 2 cores
        of an AVX2 EPYC: 27.8 sentences/s on one core with the worker's one stream), never fewer than `streams`."""
        return max(self.streams, self.cores // min(self.threads, self.cores))

    @property
    def widths(self) -> tuple[int, ...]:
        """The ORT thread counts a model call may run with: `threads` under load, more for a lone request."""
        narrow = min(self.threads, self.cores)
        if self.target == "gpu":
            return (narrow,)
        return tuple(sorted({narrow, min(self.lone_threads or self.cores, self.cores)}))


def layout(profile: str, cores: int, workers: int = 0, gpu: bool = False) -> tuple[int, int, int]:
    """(workers, streams per worker, ORT threads per stream) for a profile on `cores` physical cores; `workers`
    given (non-zero) is kept, each with enough streams to use its share of the cores.

    On a GPU the device does the work: for throughput, a worker per core to parse, tokenize and answer, feeding
    one shared engine that holds the one copy of the model (api/process/engine.py; measured on an H200 at 256
    users: 6,875 req/s with 16 workers against 853 with one, docs/deployment.md); for latency one worker,
    which saves a lone request the hop to the engine (0.2-0.3 ms). Two streams each, so one batch's
    host-side work overlaps the other's kernels."""
    if gpu:
        return workers or (1 if profile == "latency" else cores), 2, 1
    if profile == "latency":
        return workers or 1, 1, cores
    workers = workers or cores
    return workers, -(-cores // workers), 1


def _fields() -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(Settings)}


def _read(env: Mapping[str, str], f: dataclasses.Field[Any], public: bool) -> Any:
    key = f.metadata["env"]
    if key in env:
        try:
            return f.metadata["parse"](env[key].strip())
        except ValueError as exc:
            raise InputError(f"{key}={env[key]!r} is invalid: {exc}") from None
    if public and f.metadata["public"] is not _UNSET:
        return f.metadata["public"]
    return f.default


def describe() -> list[tuple[str, str, str]]:
    """(variable, default, help) for every setting: docs/configuration.md's table comes from here (hare/docs.py)."""

    def shown(value: Any) -> str:
        if value is None or value == ():
            return "(empty)"
        if isinstance(value, bool):
            return "`1`" if value else "`0`"
        if isinstance(value, tuple):
            return f"`{','.join(value)}`"
        if isinstance(value, float) and value.is_integer():
            return f"`{int(value)}`"
        return f"`{value}`"

    rows = []
    for f in dataclasses.fields(Settings):
        default = shown(f.default)
        if f.metadata["public"] is not _UNSET:
            default += f" (public: {shown(f.metadata['public'])})"
        rows.append((f.metadata["env"], default, f.metadata["help"]))
    return rows
