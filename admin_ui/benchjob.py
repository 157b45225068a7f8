"""A `hare bench run` in a background process, as the Benchmarks page starts, watches and cancels it.

The bench prints one JSON object per line (`--progress jsonl`, see `bench.store`); two reader threads keep
stdout's lines and the tail of stderr, so the page can redraw from `job.progress()` whenever it likes. The
process gets its own session, so cancelling stops the bench and any server it started, and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from admin_ui.benchprogress import Plan, Progress, progress_from_lines
from bench.points import MIX_NAMES
from bench.progress import model_only_streams_cap

BASELINES = ("vanilla", "comet")


@dataclass(frozen=True)
class BenchConfig:
    """What the page asks for; `command()` turns it into `hare bench run` arguments.

    target: an appliance URL to load as is, or a bundle folder (the bench starts `hare serve` on it).
    task: the URL's task (the page reads it from /info). bundle: the bundle a URL serves (exact token counts,
    the model-only figure). model: the Hugging Face folder the baselines load (default: the bundle's source).
    seq_lens (or a mix of lengths by name: "comet", "mix"), batches, concurrency: the grid. duration_s/warmup_s: seconds
    recorded per point and of unrecorded load before it. baselines: vanilla/comet in the same run.
    model_only: also measure the bundle's model alone, in process (the bench adds those points after the
    HTTP ones: 1 stream and as many side by side as the concurrency asks, at most one per core).
    rounds: passes over every target's points, every other one backwards; each point keeps its median pass.
    """

    target: str
    task: str = ""
    bundle: str = ""
    model: str = ""
    seq_lens: tuple[int | str, ...] = (16, 64)
    batches: tuple[int, ...] = (1,)
    concurrency: tuple[int, ...] = (1, 4)
    duration_s: float = 3.0
    warmup_s: float = 1.0
    baselines: tuple[str, ...] = ()
    name: str = ""
    model_only: bool = True
    rounds: int = 1

    def plan(self) -> Plan:
        """How many points go over HTTP (hare and each baseline, every setting), the most clients, and the cores
        the bench will hold its model-only streams to (it runs on this machine)."""
        grid = len(self.seq_lens) * len(self.batches) * len(self.concurrency)
        return Plan(
            http_points=grid * (1 + len(self.baselines)),
            max_concurrency=max(self.concurrency, default=0),
            cores=model_only_streams_cap(),
            rounds=self.rounds,
        )

    def command(self, db: Path, python: str = sys.executable) -> list[str]:
        def join(xs: Sequence[int | str]) -> str:
            return ",".join(str(x) for x in xs)

        argv = [
            python, "-m", "hare.cli", "bench", "run", self.target,
            "--seq", join(self.seq_lens),
            "--batch", join(self.batches),
            "--concurrency", join(self.concurrency),
            "--duration", f"{self.duration_s:g}",
            "--warmup", f"{self.warmup_s:g}",
            "--progress", "jsonl",
            "--db", str(db),
        ]  # fmt: skip
        for flag, value in (("--task", self.task), ("--bundle", self.bundle), ("--model", self.model)):
            if value:
                argv += [flag, value]
        if self.baselines:
            argv += ["--baseline", ",".join(self.baselines)]
        if self.name:
            argv += ["--name", self.name]
        if self.rounds > 1:
            argv += ["--rounds", str(self.rounds)]
        if not self.model_only:
            argv.append("--no-model-only")
        return argv


def parse_seq_lens(text: str) -> tuple[int | str, ...]:
    """Token counts, or mixes of lengths by name (MIX_NAMES), as `hare bench run --seq` takes them."""
    words = [w for w in text.replace(" ", ",").split(",") if w]
    lengths: list[int | str] = []
    for w in words:
        lengths.append(w.lower() if w.lower() in MIX_NAMES else parse_ints(w, "sequence lengths", 1, 8192)[0])
    if not lengths:
        raise ValueError("sequence lengths: give at least one value")
    return tuple(dict.fromkeys(lengths))


def bundle_for(info: Mapping[str, Any], folders: Sequence[Path]) -> Path | None:
    """The bundle an appliance serves, when one of `folders` holds it: `hare serve` names its model after
    the bundle's folder, so look for `<folder>/<model>/hare.json` of the same task."""
    model = str(info.get("model") or "")
    if not model or "/" in model or model.startswith("."):
        return None
    for folder in folders:
        candidate = folder / model
        try:
            manifest = json.loads((candidate / "hare.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and manifest.get("task") == info.get("task"):
            return candidate
    return None


def parse_ints(text: str, what: str, low: int = 1, high: int = 100_000) -> tuple[int, ...]:
    """`"16, 128"` -> (16, 128); raises ValueError naming `what` when a value is not a whole number in range."""
    values = []
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise ValueError(f"{what}: {part!r} is not a whole number") from None
        if not low <= value <= high:
            raise ValueError(f"{what}: {value} is outside {low}..{high}")
        values.append(value)
    if not values:
        raise ValueError(f"{what}: give at least one value")
    return tuple(dict.fromkeys(values))


def in_range(value: float, what: str, low: float, high: float) -> float:
    """`value` when `low <= value <= high`; else a ValueError naming `what` and the range, as `parse_ints` says it."""
    if not low <= value <= high:
        raise ValueError(f"{what}: {value:g} is outside {low:g}..{high:g}")
    return value


def bench_env(env: Mapping[str, str], token: str | None, api_key: str | None = None) -> dict[str, str]:
    """The environment of the bench the console starts: its own, with the console's appliance token as the bench's
    (HARE_BENCH_TOKEN), so that an appliance with an admin token answers the bench's GET /info (it was a 401), and
    its appliance API key as the bench's HARE_API_KEY, which it sends on POST /predict."""
    secrets = {"HARE_BENCH_TOKEN": token, "HARE_API_KEY": api_key}
    return {**env, **{name: value for name, value in secrets.items() if value}}


class Busy(Exception):
    """A bench is already running: `job` is it (the caller says so rather than starting a second)."""

    def __init__(self, job: BenchJob) -> None:
        super().__init__("a benchmark is already running")
        self.job = job


def new_slot() -> dict[str, Any]:
    """The console's one bench: {"job": BenchJob | None} and the lock its check-and-start holds."""
    return {"job": None, "lock": threading.Lock()}


def start_alone(slot: MutableMapping[str, Any], argv: Sequence[str], env: dict[str, str] | None = None) -> BenchJob:
    """Start a bench in `slot` (see `new_slot`) unless its job is still running: raises Busy with that job.

    The check and the start hold the slot's lock, so two tabs whose Start buttons were both drawn while nothing
    ran get one bench and one Busy (checked only when the form was drawn, both benches ran and skewed each other).
    """
    with slot["lock"]:
        job: BenchJob | None = slot.get("job")
        if job is not None and job.running:
            raise Busy(job)
        slot["job"] = job = BenchJob(argv, env=env)
        return job


class BenchJob:
    """One background bench process and everything it printed."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.argv = list(argv)
        self.started_at = time.time()
        self.cancelled = False
        self._lines: list[str] = []
        self._stderr: deque[str] = deque(maxlen=40)
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._pump, args=(self._proc.stdout, self._lines), daemon=True),
            threading.Thread(target=self._pump, args=(self._proc.stderr, self._stderr), daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _pump(self, stream: IO[str], sink: list[str] | deque[str]) -> None:
        for line in stream:
            with self._lock:
                sink.append(line.rstrip("\n"))
        stream.close()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def stderr_tail(self) -> str:
        with self._lock:
            return "\n".join(self._stderr)

    def progress(self) -> Progress:
        """The run as printed so far; once the process is gone, a failure without a final line is one too."""
        progress = progress_from_lines(self.lines())
        code = self.returncode
        if code is not None and progress.status is None and not any(t.is_alive() for t in self._readers):
            progress.status = "cancelled" if self.cancelled else "failed"
            tail = self.stderr_tail().strip().splitlines()
            progress.message = tail[-1] if tail else f"`hare bench run` exited with status {code}"
        return progress

    def cancel(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the bench's process group (the bench stops its servers and records "cancelled"), then
        SIGKILL if it is still there after `grace_s`."""
        if not self.running:
            return
        self.cancelled = True
        self._signal(signal.SIGTERM)
        try:
            self._proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self._proc.wait(5)

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        code = self._proc.wait(timeout)
        for t in self._readers:
            t.join(timeout=5)
        return code
