"""When a refusing worker may take its next connection from the listen backlog (docs/overload.md, 2).

The pace is an interval between accepts. uvloop's timers count whole milliseconds from the loop's cached
clock: a sleep under half a millisecond is a call_soon, and a longer one ends up to about a millisecond early
(3.3 ms asked, 2.2-3.7 slept; 4.5 ms, 3.2-4.5; AMD EPYC). Slept to the exact deadline, the accept loop woke early and
turned again until the deadline had passed: three sleeps a refusal under overload (MiniLM, the EPYC). So a
wait is slept only when it is longer than the timer's resolution, and the accepts follow a schedule of slots:
one taken up to a millisecond early moves the next slot by the interval from its own, not from now, so the
rate holds on average (a burst of at most a millisecond's worth of slots) with one sleep an accept.
"""

from __future__ import annotations

TIMER_TICK_S = 0.001  # uvloop's timer resolution: a shorter wait is not slept but taken now


class Pace:
    """The schedule of one accept loop's accepts while refusing (intervals in seconds, times monotonic)."""

    def __init__(self) -> None:
        self._slot = 0.0  # the slot of the last connection accepted while refusing

    def wait(self, interval: float, now: float) -> float:
        """Seconds to sleep before the next accept at `interval` (0: take it now)."""
        wait = self._slot + interval - now
        return wait if wait > TIMER_TICK_S else 0.0

    def took(self, interval: float, now: float) -> None:
        """A connection was accepted at `now`: the next slot is one interval after this one's (or after now,
        when this one came late)."""
        self._slot = max(self._slot + interval, now)
