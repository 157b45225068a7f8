"""A deterministic stand-in for thread CPU time, for tests that assert what a race decides (autotune's pick,
the variant that ships): two runs of one graph came out 65-77% apart by their thread CPU time beside other
work on a two-vCPU VM, so a test that needs a winner counts the work instead of timing it."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from container.optimize import autotune
from container.runtime import OnnxModel


def clocked(monkeypatch: pytest.MonkeyPatch, cost: Callable[[OnnxModel, Path, int], int]) -> None:
    """Calls timed by a clock of each thread's own (as thread CPU time is) that a call advances by `cost(the
    model, the graph file it loaded, the tokens it runs)` microseconds, not by this machine: the sessions still
    run every call, and the rounds decide on figures that load cannot move. It stands in for the clock
    autotune.clock picks, which must be thread CPU time, and keeps that clock's name (the statistic a bundle
    records)."""
    spent = threading.local()
    paths: weakref.WeakKeyDictionary[OnnxModel, Path] = weakref.WeakKeyDictionary()
    init, run, real = OnnxModel.__init__, OnnxModel.run, autotune.clock

    def loaded(self: OnnxModel, path: Path, *args: Any, **kwargs: Any) -> None:
        init(self, path, *args, **kwargs)
        paths[self] = Path(path)

    def counted(self: OnnxModel, feeds: Any, shrink: bool = False) -> Any:
        result = run(self, feeds, shrink)
        us = cost(self, paths[self], int(feeds["input_ids"].size))
        spent.ns = getattr(spent, "ns", 0) + 1000 * us
        return result

    def clock(threads: int, target: str = "cpu") -> tuple[str, Callable[[], int]]:
        statistic, now = real(threads, target)
        assert now is time.thread_time_ns, statistic  # what the counted clock stands in for
        return statistic, lambda: getattr(spent, "ns", 0)

    monkeypatch.setattr(OnnxModel, "__init__", loaded)
    monkeypatch.setattr(OnnxModel, "run", counted)
    monkeypatch.setattr(autotune, "clock", clock)
