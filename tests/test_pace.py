"""The refusal pace's schedule (api/process/pace.py) against the event loops' timers, on a simulated clock:
a refusing worker takes one connection per interval on average, sleeping at most about once per accept,
whether its timers fire early (uvloop) or late (asyncio's own loop)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from api.process.pace import TIMER_TICK_S, Pace

ACCEPT_S = 5e-6  # what taking one connection from the backlog costs, on the simulated clock
Timer = Callable[[float], float]  # seconds asked -> seconds slept


def uvloop_timer(rng: random.Random) -> Timer:
    """uvloop: whole milliseconds, rounded, from a cached clock up to a millisecond behind (under half a
    millisecond: a call_soon)."""

    def slept(seconds: float) -> float:
        ms = round(seconds * 1000)
        return 4e-6 if ms == 0 else max(4e-6, ms / 1000 - rng.uniform(0, 0.001))

    return slept


def asyncio_timer(rng: random.Random) -> Timer:
    """asyncio's own loop: the deadline exact, the poll's timeout rounded up to a millisecond."""
    return lambda seconds: seconds + rng.uniform(0, 0.001)


def refuse_for(seconds: float, interval: float, timer: Timer) -> tuple[int, list[float]]:
    """A backlog that always holds a connection, refused at `interval`: the accepts, and the sleeps asked."""
    pace, now, accepts, asked = Pace(), 0.0, 0, []
    while now < seconds:
        if wait := pace.wait(interval, now):
            asked.append(wait)
            now += timer(wait)
            continue
        pace.took(interval, now)
        accepts += 1
        now += ACCEPT_S
    return accepts, asked


@pytest.mark.parametrize("make_timer", [uvloop_timer, asyncio_timer], ids=["uvloop", "asyncio"])
@pytest.mark.parametrize("interval", [0.0005, 0.0012, 0.0033, 0.02])
def test_a_refusing_worker_accepts_one_connection_per_interval_sleeping_once_an_accept(
    interval: float, make_timer: Callable[[random.Random], Timer]
) -> None:
    seconds = 2.0
    accepts, asked = refuse_for(seconds, interval, make_timer(random.Random(7)))
    target = seconds / interval
    # Never faster than the pace (a millisecond's worth of slots at once at most); timers that fire late
    # lose at most their lateness once an accept.
    assert accepts <= target + TIMER_TICK_S / interval + 1
    assert accepts >= (0.95 if make_timer is uvloop_timer else 0.6) * target
    # No sleep the timer would end at once (a turn of the loop spent for nothing), and about one an accept.
    assert min(asked, default=1.0) > TIMER_TICK_S
    assert len(asked) <= 2 * accepts


def test_a_pace_of_zero_accepts_every_connection_at_once() -> None:
    accepts, asked = refuse_for(0.01, 0.0, uvloop_timer(random.Random(7)))
    assert asked == [] and accepts == pytest.approx(0.01 / ACCEPT_S, abs=2)


def test_a_connection_that_comes_late_gives_no_burst() -> None:
    """Refusing again after a quiet spell (or after a connection came late) starts the schedule from then:
    no slots saved up from the past."""
    pace, interval = Pace(), 0.005
    pace.took(interval, 10.0)
    assert pace.wait(interval, 10.5) == 0.0  # long after the last slot: take it now
    pace.took(interval, 10.5)
    assert pace.wait(interval, 10.5) == pytest.approx(interval)  # the next one a whole interval later
