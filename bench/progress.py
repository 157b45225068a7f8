"""How a run shows its progress: a rich progress bar for people, JSON lines for the console (the format is
documented at the top of `bench/store.py`), or nothing."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.store import Point
from container.machine import physical_cores


def model_only_streams_cap() -> int:
    """The most model-only streams a run puts side by side: one per physical core of this machine (the console
    shows it beside a capped point's progress)."""
    return physical_cores()


class Reporter(Protocol):
    def start(self, run_id: int, n: int, db: str) -> None: ...
    def server(self, target: str, state: str, url: str) -> None: ...
    def point_start(self, k: int, n: int, target: str, settings: dict[str, Any]) -> None: ...
    def tick(self, k: int, n: int, figures: dict[str, float]) -> None: ...
    def point(self, k: int, n: int, point: Point) -> None: ...
    def log(self, message: str) -> None: ...
    def done(self, run_id: int | None, status: str, message: str = "") -> None: ...


class JsonLines:
    """One JSON object per line on stdout, flushed at once (for the console, which reads the pipe)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.gone = False  # the reader went away (the console that started the run stopped or restarted)

    def _emit(self, event: str, **fields: Any) -> None:
        if self.gone:
            return
        try:
            self.out.write(json.dumps({"event": event, **fields}, default=str) + "\n")
            self.out.flush()
        except (BrokenPipeError, ValueError):  # ValueError: the stream was closed after an earlier break
            # The run goes on and is stored as it goes: it died of "BrokenPipeError: [Errno 32] Broken pipe"
            # when the console that followed it restarted.
            self.gone = True
            with contextlib.suppress(OSError):  # else Python's exit flush says the same broken pipe again
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.out.fileno())

    def start(self, run_id: int, n: int, db: str) -> None:
        self._emit("start", run_id=run_id, n=n, db=db)

    def server(self, target: str, state: str, url: str) -> None:
        self._emit("server", target=target, state=state, url=url)

    def point_start(self, k: int, n: int, target: str, settings: dict[str, Any]) -> None:
        self._emit("point_start", k=k, n=n, target=target, settings=settings)

    def tick(self, k: int, n: int, figures: dict[str, float]) -> None:
        self._emit("tick", k=k, n=n, **figures)

    def point(self, k: int, n: int, point: Point) -> None:
        self._emit("point", k=k, n=n, point=_finite(point.to_dict()))

    def log(self, message: str) -> None:
        self._emit("log", message=message)

    def done(self, run_id: int | None, status: str, message: str = "") -> None:
        self._emit("done", run_id=run_id, status=status, message=message)


def _finite(value: Any) -> Any:
    """NaN is not JSON: empty figures become null."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class RichBar:
    """A progress bar with point k of n and the running figures, and one line per finished point."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TextColumn("{task.fields[figures]}"),
            TimeElapsedColumn(),
            console=self.console,
            refresh_per_second=2,  # the bar shares the cores with the load it measures
        )
        self.task = self.progress.add_task("starting", total=1, figures="")

    def start(self, run_id: int, n: int, db: str) -> None:
        self.progress.start()
        self.progress.update(self.task, total=n, description=f"run {run_id}")

    def server(self, target: str, state: str, url: str) -> None:
        self.progress.update(self.task, description=f"{target}: {state}")

    def point_start(self, k: int, n: int, target: str, settings: dict[str, Any]) -> None:
        label = " ".join(f"{key}={settings[key]}" for key in ("seq_len", "batch", "concurrency") if key in settings)
        self.progress.update(self.task, description=f"{target} {label}", figures="warming up")

    def tick(self, k: int, n: int, figures: dict[str, float]) -> None:
        self.progress.update(
            self.task,
            figures=f"{figures['req_s']:.1f} req/s p50 {figures['p50_ms']:.2f} ms errors {figures['errors']:.0f}",
        )

    def point(self, k: int, n: int, point: Point) -> None:
        self.progress.update(self.task, completed=k, figures="")
        errors = sum(point.errors.values())
        self.console.print(
            f"  {point.target:<10} seq {point.seq_len:>4} batch {point.batch:>2} conc {point.concurrency:>3}"
            f" {point.req_s:8.1f} req/s  p50 {point.lat_p50:8.2f} ms  p99 {point.lat_p99:8.2f} ms"
            + (f"  errors {errors}" if errors else "")
            + (f"  client cpu {point.client_cpu:.2f}" if point.load != "in-process" else "")
        )

    def log(self, message: str) -> None:
        self.console.print(f"  {message}")

    def done(self, run_id: int | None, status: str, message: str = "") -> None:
        self.progress.stop()
        self.console.print(f"run {run_id}: {status}" + (f" ({message})" if message else ""))


class Quiet:
    def start(self, run_id: int, n: int, db: str) -> None:
        pass

    def server(self, target: str, state: str, url: str) -> None:
        pass

    def point_start(self, k: int, n: int, target: str, settings: dict[str, Any]) -> None:
        pass

    def tick(self, k: int, n: int, figures: dict[str, float]) -> None:
        pass

    def point(self, k: int, n: int, point: Point) -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def done(self, run_id: int | None, status: str, message: str = "") -> None:
        pass


def reporter(kind: str) -> Reporter:
    """`rich`, `jsonl` or `none`."""
    return {"rich": RichBar, "jsonl": JsonLines, "none": Quiet}[kind]()
