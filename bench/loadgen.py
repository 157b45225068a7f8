"""The load generator: closed loop (N users, each sends as soon as it has its answer) and open loop (Poisson
arrivals at a fixed rate, latency counted from the intended send time so a slow server cannot hide queueing
behind coordinated omission). Both are bounded in time and in count and stop by themselves.

Timeline of one measurement: `warmup_s` of load that is not recorded, then a window of `duration_s` (cut
short after `max_requests` answers or when `stop` is set) whose answers are recorded. The process CPU time
of the window divided by its wall time is the load generator's own CPU use, in cores.

The rate is the 200 answers read while the window was open over its length, in both loops. Open loop, the
latencies are those of the requests sent in the window, answered whenever: an overloaded server's queue holds
requests of the warm-up when the window opens and requests of the window when it closes, and counting the
window's own requests over the time until the last of them was answered charged the server for that lag
(with a queue of 1 s and a window of 10 s, 9% of its rate).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import uvloop

from bench.client import Answer, Connection, RequestTimeout, build_request
from bench.stats import Summary, mean, percentile, summarize

Load = Literal["closed", "open"]
# A connection or answer failure, counted under a name rather than a status code.
CONNECT, TIMEOUT = "connect", "timeout"
BEHIND = "client-behind"  # an open-loop arrival not sent: MAX_WAITING were already waiting for a connection
MAX_OPEN_CONNECTIONS = 256
# Open-loop arrivals waiting for a connection, at most: past it the client cannot keep the rate, and each one
# more is counted as BEHIND rather than queued (a --rate of 1e12 grew the bench to 23 GB until the kernel
# killed it, deaf to SIGTERM).
MAX_WAITING = 16 * MAX_OPEN_CONNECTIONS
MAX_RATE = 100_000.0  # requests a second an open loop may ask for: far past what this Python client sends
BACKOFF_S = 0.01  # after an error in closed loop, so a refusing server is not hammered in a hot loop
RAMP_S = 0.005  # between closed-loop users joining, after the previous one's first request is on the wire


@dataclass(frozen=True)
class LoadSpec:
    """What to send and how. `bodies` are JSON request bodies, used round-robin so inputs vary."""

    host: str
    port: int
    path: str
    bodies: Sequence[bytes]
    load: Load = "closed"
    concurrency: int = 1
    rate: float = 0.0  # open loop: mean arrivals per second
    warmup_s: float = 1.0
    duration_s: float = 5.0
    max_requests: int = 100_000
    timeout_s: float = 30.0
    seed: int = 0
    token: str | None = field(default=None, repr=False)  # sent as a bearer token (a server's HARE_API_KEY)


@dataclass
class Samples:
    """Everything recorded in the window, one entry per answer in answer order."""

    # Seconds from the send (open loop: the intended send) to the answer's arrival at the client's socket, of
    # 200 answers (errors are only counted); read_latencies: to when the load generator read it (bench/client.py).
    # A connection's set-up counts in both.
    latencies: list[float] = field(default_factory=list)
    read_latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)  # "200", "429", "connect", "timeout"
    compute: list[bytes] = field(default_factory=list)  # x-compute-time of 200 answers
    timing: list[bytes] = field(default_factory=list)  # server-timing of 200 answers
    window_s: float = 0.0
    cpu_s: float = 0.0
    probe_delta: dict[int, float] | None = None  # the probe's values at close minus at open (server CPU seconds)
    probe_s: float = 0.0  # the wall time between the two probes: what probe_delta is spread over
    own_s: float | None = None  # the own probe's value at close minus at open (the server's own CPU seconds)
    ok: int = 0  # 200 answers among the recorded requests (one latency each)
    answered: int = 0  # 200 answers read while the window was open, whenever sent: the rate's count
    drain_s: float = 0.0  # open loop: seconds after the window until the last of its requests was answered
    retry_after: int = 0  # 429 answers that said when to come back (Retry-After)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    def errors(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.statuses.items()) if k != "200"}

    def server_cores(self) -> dict[int, float] | None:
        """The server's CPU over the span between the probes, in cores by process (None without a probe)."""
        if self.probe_delta is None:
            return None
        return {pid: seconds / max(self.probe_s, 1e-9) for pid, seconds in self.probe_delta.items()}

    def server_figures(self) -> dict[str, float]:
        """The server's own account, in ms: x-compute-time p50/avg/p99 and each server-timing phase's average and
        p99 (which phase a tail is in: waiting for the model, or the call itself)."""
        out: dict[str, float] = {}
        compute = sorted(float(c) * 1000.0 for c in self.compute if c)
        if compute:
            out["compute_p50"] = percentile(compute, 50)
            out["compute_avg"] = mean(compute)
            out["compute_p99"] = percentile(compute, 99)
        phases: dict[str, list[float]] = {}
        for header in self.timing:
            for name, dur in parse_server_timing(header):
                phases.setdefault(name, []).append(dur)
        for name, durs in phases.items():
            out[f"{name}_avg"] = mean(durs)
            out[f"{name}_p99"] = percentile(sorted(durs), 99)
        return out


def parse_server_timing(header: bytes | str) -> list[tuple[str, float]]:
    """`tokenize;dur=0.105, inference;dur=1.234` -> [("tokenize", 0.105), ("inference", 1.234)] (ms)."""
    text = header.decode("latin-1") if isinstance(header, bytes) else header
    out = []
    for metric in text.split(","):
        name, _, params = metric.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur" and name:
                with contextlib.suppress(ValueError):  # a malformed figure is skipped, not fatal
                    out.append((name, float(value)))
    return out


TickFn = Callable[[dict[str, float]], None]
# Called when the window opens and when it closes, e.g. to read the server's CPU clocks (seconds by process).
ProbeFn = Callable[[], dict[int, float] | None]
OwnProbeFn = Callable[[], float | None]


class _Window:
    """The recording window shared by the users: when it opens and closes, and what it holds."""

    def __init__(
        self,
        spec: LoadSpec,
        stop: threading.Event | None,
        on_tick: TickFn | None,
        probe: ProbeFn | None,
        own_probe: OwnProbeFn | None = None,
    ) -> None:
        self.spec = spec
        self.stop = stop
        self.on_tick = on_tick
        self.probe = probe
        self.probe0: dict[int, float] | None = None
        self.own_probe = own_probe
        self.own0: float | None = None
        self.samples = Samples()
        now = time.perf_counter()
        self.start = now + spec.warmup_s
        self.end = self.start + spec.duration_s
        self.closed_at: float | None = None
        self.last_answer = 0.0
        self.cpu0 = 0.0
        self.opened = False
        self.probed_at = 0.0

    def open(self, now: float) -> None:
        """Open the window once `now` reaches its start: the CPU clock and the probes' first values. Called by
        the ticker and at every answer read: on a loaded machine the open loop's senders starved the ticker,
        which opened the window at its end, and both probes together said 0 server cores."""
        if self.opened or now < self.start:
            return
        self.cpu0, self.opened = time.process_time(), True
        self.probe0 = self.probe() if self.probe is not None else None
        self.own0 = self.own_probe() if self.own_probe is not None else None
        self.probed_at = time.perf_counter()

    def recording(self, t: float) -> bool:
        return self.start <= t < self.end and self.closed_at is None

    def over(self, t: float) -> bool:
        return t >= self.end or self.closed_at is not None

    def read(self, answer: Answer | None, t: float) -> None:
        """An answer read at `t`, whenever its request was sent: a 200 read in the window counts in the rate."""
        self.open(t)
        if answer is not None and answer.status == 200 and self.recording(t):
            self.samples.answered += 1

    def record(self, start: float, sent: float, answer: Answer | None, error: str | None, t: float) -> None:
        """One request that began at `start` (open loop: its intended send time), was written at `sent` and
        read at `t`, all on time.perf_counter()."""
        s = self.samples
        self.last_answer = t
        if answer is not None:
            status = str(answer.status)
            if answer.status == 200:
                s.ok += 1
                s.latencies.append(sent - start + answer.wire)
                s.read_latencies.append(t - start)
                s.compute.append(answer.headers.get(b"x-compute-time", b""))
                timing = answer.headers.get(b"server-timing")
                if timing:
                    s.timing.append(timing)
            elif answer.status == 429 and b"retry-after" in answer.headers:
                s.retry_after += 1
        else:
            status = error or CONNECT
        s.statuses[status] += 1
        if s.requests >= self.spec.max_requests:
            self.close(t)

    def close(self, t: float) -> None:
        if self.closed_at is None:
            self.closed_at = min(t, self.end)

    async def ticker(self) -> None:
        """Opens the window (CPU clock), reports running figures about once a second, honours `stop`."""
        last_tick = 0.0
        while True:
            now = time.perf_counter()
            self.open(now)
            if self.stop is not None and self.stop.is_set():
                self.close(now)
            if self.over(now):
                break
            if self.on_tick is not None and self.opened and now - last_tick >= 1.0:
                last_tick = now
                self.on_tick(self.snapshot(now))
            await asyncio.sleep(0.1 if self.opened else min(0.1, max(0.0, self.start - now)))
        end = self.closed_at if self.closed_at is not None else self.end
        self.samples.window_s = max(end - self.start, 1e-9) if self.opened else 0.0
        self.samples.cpu_s = time.process_time() - self.cpu0 if self.opened else 0.0
        if self.probe is not None and self.probe0 is not None:
            probe1 = self.probe()
            if probe1 is not None:
                self.samples.probe_delta = {k: v - self.probe0.get(k, 0.0) for k, v in probe1.items()}
                # The span the probes saw, not the window's nominal length: a busy event loop can open the
                # window late (the first probe with it) or close it late.
                self.samples.probe_s = time.perf_counter() - self.probed_at
                if self.samples.probe_s < self.samples.window_s / 2:  # probes of another span: no figure
                    self.samples.probe_delta = None
        if self.own_probe is not None and self.own0 is not None and (own1 := self.own_probe()) is not None:
            self.samples.own_s = own1 - self.own0

    def snapshot(self, now: float) -> dict[str, float]:
        s = self.samples
        elapsed = max(now - self.start, 1e-9)
        recent = sorted(s.latencies[-2000:])
        return {
            "elapsed_s": round(elapsed, 2),
            "duration_s": self.spec.duration_s,
            "requests": s.requests,
            "errors": s.requests - s.ok,
            "req_s": round(s.answered / elapsed, 2),
            "p50_ms": round(percentile(recent, 50) * 1000, 3) if recent else 0.0,
            "p99_ms": round(percentile(recent, 99) * 1000, 3) if recent else 0.0,
        }


async def _closed(spec: LoadSpec, window: _Window) -> None:
    raws = [build_request(spec.host, spec.port, "POST", spec.path, b, spec.token) for b in spec.bodies]
    n = len(raws)

    joined = [asyncio.Event() for _ in range(spec.concurrency)]

    async def user(index: int) -> None:
        i = index * max(1, n // max(1, spec.concurrency))  # users start at different inputs
        conn: Connection | None = None
        if index > 0:
            # Users join one after another (during the warm-up): connections opened all at once are all
            # accepted by whichever server worker wakes first, and keep-alive would pin them there.
            await joined[index - 1].wait()
            await asyncio.sleep(RAMP_S)
        while not window.over(time.perf_counter()):
            t0 = time.perf_counter()
            answer: Answer | None = None
            error: str | None = None
            sent = t0
            try:
                if conn is None or conn.closed:
                    conn = await Connection.open(spec.host, spec.port)
                sent = time.perf_counter()
                pending = conn.send(raws[i % n], spec.timeout_s)
                joined[index].set()
                answer = await pending
            except RequestTimeout:
                error, conn = TIMEOUT, None
            except OSError:
                error, conn = CONNECT, None
            joined[index].set()
            i += 1
            t1 = time.perf_counter()
            window.read(answer, t1)
            if window.recording(t1):
                window.record(t0, sent, answer, error, t1)
            if error is not None or (answer is not None and answer.status in (429, 503)):
                await asyncio.sleep(BACKOFF_S)
        joined[index].set()
        if conn is not None:
            conn.close()

    await asyncio.gather(window.ticker(), *(user(k) for k in range(spec.concurrency)))


async def _open(spec: LoadSpec, window: _Window) -> None:
    raws = [build_request(spec.host, spec.port, "POST", spec.path, b, spec.token) for b in spec.bodies]
    rng = random.Random(spec.seed)
    idle: list[Connection] = []
    opened = 0
    freed = asyncio.Condition()
    inflight: set[asyncio.Task[None]] = set()

    async def one(raw: bytes, intended: float) -> None:
        nonlocal opened
        answer: Answer | None = None
        error: str | None = None
        conn: Connection | None = None
        sent = intended
        try:
            while conn is None:
                if idle:
                    conn = idle.pop()
                    if conn.closed:
                        opened -= 1
                        conn = None
                elif opened < MAX_OPEN_CONNECTIONS:
                    opened += 1
                    try:
                        conn = await Connection.open(spec.host, spec.port)
                    except OSError:
                        opened -= 1
                        raise
                else:
                    async with freed:
                        await freed.wait()
            sent = time.perf_counter()
            answer = await conn.send(raw, spec.timeout_s)
        except RequestTimeout:
            error = TIMEOUT
        except OSError:
            error = CONNECT
        except asyncio.CancelledError:  # unanswered when the point ended: its connection goes with it
            if conn is not None:
                conn.close()
            raise
        t1 = time.perf_counter()
        window.read(answer, t1)
        # Latency from the intended send time: waiting for a connection is part of what a client would see.
        if window.start <= intended < window.end and window.closed_at is None:
            window.record(intended, sent, answer, error, t1)
        if conn is not None:
            if conn.closed:
                opened -= 1
            else:
                idle.append(conn)
            async with freed:
                freed.notify()

    async def dispatcher() -> None:
        t = time.perf_counter()
        i = 0
        while not window.over(t):
            t += rng.expovariate(spec.rate)
            delay = t - time.perf_counter()
            # Behind the schedule, still a turn of the loop: the ticker (and so a stop) and the answers run.
            await asyncio.sleep(max(0.0, delay))
            now = time.perf_counter()
            window.open(now)
            # Over by the schedule, not by the clock: an arrival the client is late for is still sent (and
            # counted from its intended time), so a client that falls behind cannot drop the window's last ones.
            if window.over(t):
                break
            if len(inflight) >= MAX_WAITING:
                if window.recording(t):
                    window.record(t, t, None, BEHIND, now)
                continue
            # A timer may fire a little early: count from the actual send then, never before it.
            task = asyncio.create_task(one(raws[i % len(raws)], min(t, now)))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            i += 1
        # Answers to requests sent in the window still count, up to the request timeout.
        if inflight:
            await asyncio.wait(list(inflight), timeout=spec.timeout_s)
        for task in list(inflight):
            task.cancel()

    ticker = asyncio.create_task(window.ticker())
    await dispatcher()
    await ticker
    # An overloaded server answers the window's requests after it closed (its queue): how long after.
    if window.samples.latencies:
        window.samples.drain_s = max(0.0, window.last_answer - window.end)
    for conn in idle:
        conn.close()


def run_load(
    spec: LoadSpec,
    stop: threading.Event | None = None,
    on_tick: TickFn | None = None,
    probe: ProbeFn | None = None,
    own_probe: OwnProbeFn | None = None,
) -> Samples:
    """Run one measurement on a fresh uvloop event loop and return what the window recorded. `probe` (the
    server's CPU seconds by process) and `own_probe` (its own CPU seconds, model calls left out) are read as
    the window opens and closes."""
    if spec.load == "open" and not 0 < spec.rate <= MAX_RATE:
        raise ValueError(f"open loop needs a rate above 0 and at most {MAX_RATE:,.0f} requests a second")
    if spec.concurrency < 1 and spec.load == "closed":
        raise ValueError("closed loop needs at least one user")
    if not spec.bodies:
        raise ValueError("no request bodies")

    async def main() -> Samples:
        window = _Window(spec, stop, on_tick, probe, own_probe)
        await (_closed(spec, window) if spec.load == "closed" else _open(spec, window))
        return window.samples

    return uvloop.run(main())


def latency_summary(samples: Samples, read: bool = False) -> Summary:
    """Client latency in milliseconds: min/avg/p50/p90/p95/p99/max over every recorded answer, to its arrival
    at the client's socket (`read`: to when the load generator read it)."""
    return summarize([x * 1000.0 for x in (samples.read_latencies if read else samples.latencies)])
