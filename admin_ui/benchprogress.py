"""The Run tab's logic: the `hare bench run --progress jsonl` events of a running bench folded into what the
progress bar says, and its finished points.

Nothing here starts a process or touches Streamlit (admin_ui/benchjob.py runs the bench).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from admin_ui.benchpoints import cut_short, unanswered
from admin_ui.percentiles import latency_text
from admin_ui.tables import figure
from bench.store import Point


@dataclass
class Progress:
    """Everything a running (or finished) `hare bench run --progress jsonl` has said so far."""

    run_id: int | None = None
    planned: int = 0
    done_points: int = 0
    current: dict[str, Any] = field(default_factory=dict)  # the point being measured: target and settings
    tick: dict[str, Any] = field(default_factory=dict)  # its latest tick
    points: list[dict[str, Any]] = field(default_factory=list)  # finished points, as stored
    servers: dict[str, str] = field(default_factory=dict)  # target -> starting/ready/stopped
    log: list[str] = field(default_factory=list)
    status: str | None = None  # done/failed/cancelled once the final line came
    message: str = ""
    asked_s: float | None = None  # seconds per point the bench was asked for

    def cut(self) -> Point | None:
        """The finished point a cancel stopped before its seconds were up (kept by the bench, partial)."""
        return cut_short(live_point_rows(self), self.asked_s, self.status == "cancelled")

    @property
    def measured(self) -> int:
        """Points measured in full: a point a cancel cut short, or that got no answer at all, does not count."""
        dead = sum(unanswered(p) for p in live_point_rows(self))
        return max(self.done_points - (self.cut() is not None) - dead, 0)

    @property
    def fraction(self) -> float:
        """Share of the planned points measured, counting the current one's elapsed time."""
        if self.planned <= 0:
            return 0.0
        partial = 0.0
        if self.tick and self.status is None:
            duration = float(self.tick.get("duration_s") or 0)
            if duration > 0:
                partial = min(float(self.tick.get("elapsed_s") or 0) / duration, 1.0)
        return min((self.done_points + partial) / self.planned, 1.0)

    def describe(self, plan: Plan | None = None) -> str:
        """One line for the progress bar: which point of how many, what it measures, its running figures."""
        if self.status is not None:
            return self.outcome()
        if not self.current:
            starting = [t for t, s in self.servers.items() if s == "starting"]
            return f"Starting {', '.join(starting)}…" if starting else "Starting the bench…"
        target = str(self.current.get("target", ""))
        what = point_setting(target, self.current.get("settings") or {}, plan)
        line = f"Point {self.current.get('k', '?')} of {self.planned}: {what}"
        if target == "model-only":
            return line + " · measuring"
        t = self.tick
        if not t:
            return line + " · warming up"
        errors = int(t.get("errors") or 0)
        answers = int(t.get("requests") or 0) - errors
        failed = f" · {errors:,} failed requests" if errors else ""  # a server that died says so as it happens
        if answers <= 0:
            return line + " · measuring, no answer yet" + failed
        p50 = latency_text(float(t.get("p50_ms") or 0), "p50", answers)
        p99 = latency_text(float(t.get("p99_ms") or 0), "p99", answers)
        figures = f"{float(t.get('req_s') or 0):,.1f} req/s · p50 {p50} ms · p99 {p99} ms"
        return line + f" · {answers:,} answers{failed} · {figures}"

    def outcome(self) -> str:
        """How the run ended, in a sentence: "Run #7 done: 8 of 8 points measured"."""
        head = f"Run #{self.run_id}" if self.run_id is not None else "The run"
        measured = f"{self.measured} of {self.planned} points measured" if self.planned else ""
        if self.status == "cancelled":
            why = f" ({self.message})" if self.message else ""
            cut = self.cut()
            stopped = ""
            if cut is not None:
                asked = f" of {figure(self.asked_s)}" if self.asked_s else ""
                stopped = f"point {cut.idx} stopped after {figure(cut.duration_s)}{asked} s, kept as partial"
            if not self.measured:
                in_full = f" in full: {stopped}" if stopped else ""
                return f"{head} cancelled{why} before any point was measured{in_full}"
            also = f"; {stopped}" if stopped else ""
            return f"{head} cancelled{why}: {measured}{also}, kept under Results"
        parts = [p for p in (measured, self.message) if p]
        return f"{head} {self.status}" + (": " + "; ".join(parts) if parts else "")

    def plan_note(self, plan: Plan | None) -> str:
        """What the planned points are, when the bench adds points of its own (the model alone, in process) or
        runs them in rounds."""
        if plan is None or plan.http_points <= 0:
            return ""
        rounds = max(plan.rounds, 1)
        extra = self.planned // rounds - plan.http_points
        if extra <= 0 and rounds == 1:
            return ""
        alone = (
            f", then {extra} of the model alone (in process, no HTTP): 1 stream, and as many side by side as the "
            "concurrency asks, at most one per core of this machine"
            if extra > 0
            else ""
        )
        if rounds == 1:
            return f"{self.planned} points: the {plan.http_points} asked for, over HTTP{alone}."
        return (
            f"{self.planned} points: {rounds} rounds of the {plan.http_points} asked for, over HTTP{alone}; every "
            "other round runs backwards, and each point is kept as its median round."
        )


@dataclass(frozen=True)
class Plan:
    """What the page asked the bench for: how many points go over HTTP in one round, the most concurrent
    clients, the physical cores the bench's machine has (the model-only points run at most one stream per core)
    and the rounds (`hare bench run --rounds`)."""

    http_points: int  # in one round
    max_concurrency: int
    cores: int
    rounds: int = 1


def point_setting(target: str, settings: Mapping[str, Any], plan: Plan | None = None) -> str:
    """A point's target and settings in words: "hare over HTTP, 16 tokens, batch 1, 4 concurrent clients"."""
    seq = settings.get("seq_len")
    words = [f"{seq} tokens" if isinstance(seq, int) else f"{seq} sentences" if seq else ""]
    if settings.get("batch") is not None:
        words.append(f"batch {settings['batch']}")
    n = int(settings.get("concurrency") or 0)
    if target == "model-only":
        streams = f"{n} stream{'s' if n != 1 else ''}" if n else ""
        # Only the point held to the core count says so: the 1-stream point is one stream by design.
        if n and plan is not None and n < plan.max_concurrency and n == min(plan.max_concurrency, plan.cores):
            streams += f" (at most one per core; {plan.max_concurrency} clients asked)"
        return ", ".join(w for w in ["the model alone, in process (no HTTP)", *words, streams] if w)
    if settings.get("load") == "open":
        load = f"{float(settings.get('rate') or 0):g} requests/s arriving"
    else:
        load = f"{n} concurrent client{'s' if n != 1 else ''}" if n else ""
    return ", ".join(w for w in [f"{target} over HTTP", *words, load] if w)


def apply_event(progress: Progress, event: Mapping[str, Any]) -> Progress:
    """Fold one progress line into the state (unknown events are kept in the log)."""
    kind = event.get("event")
    if kind == "start":
        progress.run_id = event.get("run_id")
        progress.planned = int(event.get("n") or 0)
    elif kind == "server":
        progress.servers[str(event.get("target"))] = str(event.get("state"))
    elif kind == "point_start":
        progress.current = {k: event.get(k) for k in ("k", "target", "settings")}
        settings = event.get("settings")
        asked = settings.get("duration_s") if isinstance(settings, Mapping) else None
        if isinstance(asked, int | float) and asked > 0:
            progress.asked_s = float(asked)
        progress.planned = int(event.get("n") or progress.planned)
        progress.tick = {}
    elif kind == "tick":
        progress.tick = dict(event)
    elif kind == "point":
        point = event.get("point")
        if isinstance(point, Mapping):
            progress.points.append(dict(point))
        progress.done_points = int(event.get("k") or progress.done_points + 1)
        progress.tick = {}
    elif kind == "done":
        progress.run_id = event.get("run_id", progress.run_id)
        progress.status = str(event.get("status") or "done")
        progress.message = str(event.get("message") or "")
        progress.current, progress.tick = {}, {}
    elif kind == "log":
        progress.log.append(str(event.get("message", "")))
    else:
        progress.log.append(json.dumps(event))
    return progress


def progress_from_lines(lines: Iterable[str]) -> Progress:
    """Fold JSON lines into a Progress; a line that is not JSON is kept as a log message."""
    progress = Progress()
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            progress.log.append(line)
            continue
        if isinstance(event, Mapping):
            apply_event(progress, event)
        else:
            progress.log.append(line)
    return progress


def live_point_rows(progress: Progress) -> list[Point]:
    """The finished points of a running bench as store Points (fields the store does not know are dropped)."""
    known = set(Point.__dataclass_fields__)
    out = []
    for p in progress.points:
        try:
            out.append(Point(**{k: v for k, v in p.items() if k in known}))
        except TypeError:
            continue  # a point from a newer bench with fields missing here: shown after the run from the store
    return out
