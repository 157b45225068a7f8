"""The load generator against a trivial loopback server: counts add up, bounds hold, errors are counted."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from bench.loadgen import BEHIND, MAX_RATE, MAX_WAITING, LoadSpec, Samples, _Window, latency_summary, run_load
from bench.servers import ServerProcess, free_port, trivial_server
from bench.trivial import RESPONSE, TrivialProtocol

# Decided by this machine's clock (a race, a pace, a deadline): scripts/check runs these alone, after the rest.
pytestmark = pytest.mark.serial

BODY = [b'{"inputs": "I like you. I love you"}']


@pytest.fixture(scope="module")
def trivial() -> Iterator[ServerProcess]:
    with trivial_server().start() as server:
        server.wait_ready(timeout=20)
        yield server


def test_closed_loop_counts_add_up(trivial: ServerProcess) -> None:
    start = time.perf_counter()
    # A quiet machine answers over 100,000 trivial requests a second: lift the count bound so time closes it.
    spec = LoadSpec("127.0.0.1", trivial.port, "/predict", BODY, concurrency=3, warmup_s=0.2, duration_s=1.0,
                    max_requests=10**8)  # fmt: skip
    s = run_load(spec)
    assert time.perf_counter() - start < 30  # it stops (the rate itself depends on what else the CPU runs)
    assert s.ok == s.requests == len(s.latencies) == len(s.compute) == len(s.read_latencies)
    # Closed loop: every user has a request in flight all the time (nothing awaits between an answer and the
    # next send), so the users' request times cover the window, however slowly a loaded machine answers:
    # all but the requests in flight when it closed, and the microseconds between them. A user that idles,
    # or never starts, leaves its share uncovered.
    covered = sum(s.read_latencies) / (spec.concurrency * s.window_s)
    assert covered > 0.9, covered
    assert s.errors() == {}
    assert s.window_s == pytest.approx(1.0)  # the window is the duration asked, not when the last user stopped
    lat = latency_summary(s)
    assert 0 < lat.min <= lat.p50 <= lat.p99 <= lat.max
    assert s.server_figures()["compute_p50"] == pytest.approx(0.01)
    # Every answer says inference took 5 ms; the average of thousands of them may differ in the last bit.
    assert s.server_figures()["inference_avg"] == pytest.approx(0.005)
    assert s.server_figures()["inference_p99"] == pytest.approx(0.005)
    assert 0 < s.cpu_s / s.window_s < 1.5


def test_the_servers_account_says_which_phase_holds_the_tail() -> None:
    # 99 quick answers and two whose time went waiting for the model: the averages hide them, the p99s do not.
    quick = [b"tokenize;dur=0.1, queue;dur=0.2, inference;dur=1.0"] * 99
    slow = [b"tokenize;dur=0.1, queue;dur=80.0, inference;dur=1.0"] * 2
    figures = Samples(timing=quick + slow, compute=[b"0.0013"] * 99 + [b"0.0811"] * 2).server_figures()
    assert figures["queue_p99"] == pytest.approx(80.0) and figures["queue_avg"] < 2
    assert figures["inference_p99"] == pytest.approx(1.0) and figures["compute_p99"] == pytest.approx(81.1)


def test_max_requests_bounds_the_window(trivial: ServerProcess) -> None:
    spec = LoadSpec("127.0.0.1", trivial.port, "/predict", BODY, concurrency=4, warmup_s=0.1, duration_s=30.0,
                    max_requests=500)  # fmt: skip
    start = time.perf_counter()
    s = run_load(spec)
    assert s.requests == 500 and time.perf_counter() - start < 10


def test_open_loop_sends_every_arrival_its_schedule_puts_in_the_window(trivial: ServerProcess) -> None:
    """The arrivals are the seed's Poisson schedule, whatever the machine's load: a client that falls behind
    sends late (and counts from the intended time), it never skips an arrival."""
    spec = LoadSpec("127.0.0.1", trivial.port, "/predict", BODY, load="open", rate=300, warmup_s=0.2, duration_s=1.0)
    s = run_load(spec)
    rng, t, expected = random.Random(spec.seed), 0.0, 0
    while t < spec.warmup_s + spec.duration_s:
        t += rng.expovariate(spec.rate)
        expected += spec.warmup_s <= t < spec.warmup_s + spec.duration_s
    # The schedule starts a few microseconds after the window is set: an arrival at an edge may move across.
    assert abs(s.requests - expected) <= 2, (s.requests, expected)
    assert s.ok == s.requests and s.errors() == {}
    assert latency_summary(s).min > 0


def test_open_loop_counts_from_the_intended_send_when_the_client_falls_behind(trivial: ServerProcess) -> None:
    """A client that stalls (its event loop blocked for 0.3 s mid-window) still sends the arrivals it missed,
    and their latencies include the stall: the queueing a slow client would hide is counted."""
    spec = LoadSpec("127.0.0.1", trivial.port, "/predict", BODY, load="open", rate=200, warmup_s=0.1, duration_s=1.0)

    def stall(_snapshot: dict[str, float]) -> None:
        time.sleep(0.3)  # called on the event loop about once a second: blocks every send and read

    s = run_load(spec, on_tick=stall)
    assert s.ok == s.requests and s.requests > 100
    assert max(s.latencies) >= 0.2


@contextmanager
def lagging_server(lag: float) -> Iterator[int]:
    """A loopback HTTP server that answers each request `lag` seconds after it came, as a server whose queue
    is that deep; its port."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    class Lagging(TrivialProtocol):
        def on_message_complete(self) -> None:  # the trivial server's answer, `lag` seconds late
            if self.transport is not None:
                asyncio.get_running_loop().call_later(lag, self.transport.write, RESPONSE)

    async def serve() -> None:
        loop = state["loop"] = asyncio.get_running_loop()
        server = await loop.create_server(Lagging, "127.0.0.1", 0)
        state["port"], state["stop"] = server.sockets[0].getsockname()[1], loop.create_future()
        ready.set()
        async with server:
            await state["stop"]

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield state["port"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set_result, None)
        thread.join(10)


def test_open_loop_rate_is_the_answers_read_in_the_window_not_charged_for_the_queue() -> None:
    """A server that answers every request 0.3 s late (a queue that deep) and keeps up with the arrivals
    answers at their rate: the rate counts the 200s read while the window was open, whenever sent (the
    warm-up's at its start), over the window. Counting the window's own requests over the time until the
    last of them was answered gave about 1 / 1.3 of it. Their latencies still include the lag."""
    with lagging_server(0.3) as port:
        spec = LoadSpec("127.0.0.1", port, "/predict", BODY, load="open", rate=200, warmup_s=0.5, duration_s=1.0)
        s = run_load(spec)
    rng, t, sent_in_window, answered_in_window = random.Random(spec.seed), 0.0, 0, 0
    while t < spec.warmup_s + spec.duration_s:
        t += rng.expovariate(spec.rate)
        sent_in_window += spec.warmup_s <= t < spec.warmup_s + spec.duration_s
        answered_in_window += spec.warmup_s <= t + 0.3 < spec.warmup_s + spec.duration_s
    assert s.ok == s.requests and abs(s.requests - sent_in_window) <= 2, (s.requests, sent_in_window)
    # The lag's own jitter (timers, a busy machine) moves an answer at either edge across it now and then.
    assert abs(s.answered - answered_in_window) <= 0.05 * answered_in_window, (s.answered, answered_in_window)
    assert s.window_s == pytest.approx(1.0, abs=0.05) and s.drain_s == pytest.approx(0.3, abs=0.15)
    assert min(s.latencies) >= 0.3


def one_busy_core() -> dict[int, float]:
    """A probe of a server process busy on one core: its CPU seconds, in /proc's 10 ms steps."""
    return {1: round(time.perf_counter(), 2)}


@pytest.mark.parametrize("answers_read", [True, False], ids=["answers-read", "no-answer"])
def test_a_starved_ticker_leaves_the_server_cpu_measured_or_unsaid_never_wrong(answers_read: bool) -> None:
    """Under an open loop on a loaded machine the senders starved the ticker, which opened the window (its
    first CPU probe) at the window's end: both probes together, 0 server cores stored for a busy server. An
    answer read in the window opens it now; with nothing to open it, the figure is left unsaid."""
    spec = LoadSpec("127.0.0.1", 1, "/predict", BODY, load="open", rate=1, warmup_s=0.05, duration_s=0.4)
    window = _Window(spec, None, None, one_busy_core)

    async def starved() -> None:
        await asyncio.sleep(0.06)
        if answers_read:
            window.read(None, time.perf_counter())  # an answer read just after the window's start
        time.sleep(0.45)  # the loop busy past the window's end: the ticker runs only then
        await window.ticker()

    asyncio.run(starved())
    cores = window.samples.server_cores()
    if answers_read:
        assert cores is not None and cores[1] == pytest.approx(1.0, abs=0.1), cores
    else:
        assert cores is None, cores


def test_refused_connections_are_errors_and_the_loop_stops() -> None:
    spec = LoadSpec("127.0.0.1", free_port(), "/predict", BODY, concurrency=2, warmup_s=0.0, duration_s=0.5)
    start = time.perf_counter()
    s = run_load(spec)
    assert time.perf_counter() - start < 3
    assert s.ok == 0 and s.requests > 0 and set(s.errors()) == {"connect"}


def test_stop_event_cuts_a_point_short(trivial: ServerProcess) -> None:
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    spec = LoadSpec("127.0.0.1", trivial.port, "/predict", BODY, concurrency=1, warmup_s=0.0, duration_s=30.0)
    start = time.perf_counter()
    s = run_load(spec, stop=stop)
    assert time.perf_counter() - start < 3 and s.ok > 0


def test_an_open_loop_past_what_the_client_sends_stays_bounded_and_stops() -> None:
    """At a rate the client cannot keep (arrivals due faster than it makes them, a server slower still), the
    arrivals past MAX_WAITING are counted as the client's, not queued, and a stop is still heard: `--rate 1e12`
    grew the bench to 23 GB, deaf to SIGTERM, until the kernel killed it."""
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    with lagging_server(0.5) as port:
        spec = LoadSpec(
            "127.0.0.1", port, "/predict", BODY, load="open", rate=MAX_RATE, warmup_s=0.0, duration_s=30.0,
            timeout_s=2.0,
        )  # fmt: skip
        start = time.perf_counter()
        s = run_load(spec, stop=stop)
    assert time.perf_counter() - start < 8
    assert s.errors().get(BEHIND, 0) > 0 and s.requests <= MAX_WAITING + s.errors()[BEHIND]


def test_an_open_loop_rate_past_the_client_is_refused() -> None:
    spec = LoadSpec("127.0.0.1", free_port(), "/predict", BODY, load="open", rate=1e12, duration_s=1.0)
    with pytest.raises(ValueError, match="at most 100,000 requests a second"):
        run_load(spec)
