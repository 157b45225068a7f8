"""The machine's cores, shared by every worker process: a model call holds the cores its ONNX Runtime threads
run on, so that all workers together never run more intra-op threads than the cgroup allows.

    pool folder (/dev/shm, made by the gunicorn master before it forks; a temp folder for a lone process)
      core-0 .. core-{C-1}   one lock file per core: a model thread holds core i while it holds flock(core-i)
      state                  shared page: when a call last found no free core, and each worker's queued tokens
                             and open connections

- flock locks belong to an open file description, so each model thread opens its own descriptors and threads
  of one process exclude each other like threads of two; the kernel drops the locks of a process that dies
  (kill -9 included), so a crashed worker never leaks cores.
- Adaptive parallelism: a call asks for every core only while the machine is quiet (no call found the cores
  all taken in the last `quiet` seconds); otherwise one core. A lone request runs on every core, and under
  load each stream runs on its own core without a second request ever waiting behind a wide one for long.
- Calls overlap = the machine is busy: a call that finds another core held marks the pool contended, as one
  that finds no free core does. Two users of a two-core machine then run one core each, steadily; before,
  each second without a failed grant let a wide call take both cores, and the other user's next request
  waited for it (the p99 at users = cores was that wait: 38 against 22 ms at 128 tokens).
- Pinning: where the pool's cores are exactly the CPUs this process may run on (no hyper-threads, no CPU
  quota narrower than the CPU set), a call's thread runs on the CPUs of the cores it holds. The kernel
  otherwise now and then queues two model threads on one CPU while the other serves the event loop, and
  both calls take twice as long (model-call p99 9-10 ms against 3.7 ms p50 at 8 tokens; pinned, 6 ms).
- A call that finds no free core sleeps in flock on its home core (the workers' threads spread their homes
  over the cores), so a waiting thread costs nothing and wakes when that core frees.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import shutil
import struct
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from container.locking import flocked

QUIET_SECONDS = 1.0  # a wide (all-core) call only after this long without contention
SLOTS = 64  # worker slots in the shared page at least (a gunicorn server restarts workers into free slots)
_HEADER = struct.Struct("d")  # contended_at (CLOCK_MONOTONIC, the same clock in every process)
# One worker's slot: pid (0: free), queued tokens, open connections (NOT_ACCEPTING until its accept loop runs).
_SLOT = np.dtype([("pid", "=i8"), ("tokens", "=f8"), ("connections", "=i8")])
NOT_ACCEPTING = -1  # a slot's connections while its worker takes none


def slots_for(workers: int) -> int:
    """The page's slots for a server of `workers` workers: twice as many, since a SIGHUP runs the new workers
    beside the old until they accept, and a few for replacements; at least SLOTS. A fixed 64 failed the 65th
    worker's start ("Worker failed to boot": the whole server stopped), on a machine of 65 physical cores or
    more by default, and at a reload from 33 workers."""
    return max(SLOTS, 2 * workers + 8)


def _size(slots: int) -> int:
    return _HEADER.size + slots * _SLOT.itemsize


class Seat:
    """One model thread's view of the pool: its own lock descriptors, its home core."""

    def __init__(self, pool: CorePool, home: int) -> None:
        self._pool = pool
        self._home = home % pool.cores
        self._fds = [os.open(pool.folder / f"core-{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(pool.cores)]
        self._held: list[int] = []
        self._pinned: frozenset[int] | None = None

    def acquire(self, want: int, wait: bool = True) -> int:
        """Hold `want` cores if that many are free, else one (waiting for it if none is free, or holding none
        and returning 0 without `wait`); returns how many."""
        order = [(self._home + i) % len(self._fds) for i in range(len(self._fds))]
        for i in order:
            if len(self._held) == want:
                break
            try:
                fcntl.flock(self._fds[i], fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            self._held.append(i)
        if not self._held:
            self._pool.contended()
            if not wait:
                return 0
            fcntl.flock(self._fds[self._home], fcntl.LOCK_EX)
            self._held.append(self._home)
        elif len(self._held) < want:  # a partial grant runs on one core: the sessions come in widths 1 and want
            self._pool.contended()
            for i in self._held[1:]:
                fcntl.flock(self._fds[i], fcntl.LOCK_UN)
            del self._held[1:]
        elif self._others_busy():
            self._pool.contended()
        self._pool.took(len(self._held))
        self._pin()
        return len(self._held)

    def _others_busy(self) -> bool:
        """Whether another process's call holds a core now (a free one is locked and unlocked again in passing;
        under load the first cores tried are usually held, so this costs a few system calls). This process's
        own other calls do not count: a worker that runs one request's calls side by side on a quiet machine
        (api/engine/batching.py, `spread`) would otherwise mark it busy and lose its spread after one round."""
        mine = self._pool.held_here()  # before this seat's own grant is counted
        busy = 0
        for i in range(len(self._fds)):
            if i in self._held:
                continue
            try:
                fcntl.flock(self._fds[i], fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                busy += 1
                if busy > mine:
                    return True
                continue
            fcntl.flock(self._fds[i], fcntl.LOCK_UN)
        return False

    def _pin(self) -> None:
        """Run this thread on the CPUs of the cores it holds (a system call only when they change)."""
        cpus = self._pool.cpus
        if cpus is None:
            return
        wanted = frozenset(cpus[i] for i in self._held)
        if wanted != self._pinned:
            try:
                os.sched_setaffinity(0, wanted)  # 0: the calling thread, on Linux
            except OSError:  # those CPUs were taken from the process since it started (a cpuset changed)
                self._pinned = None  # the call runs where the kernel places it; the next one tries again
                return
            self._pinned = wanted

    def unpin(self) -> None:
        """Let this thread run on every CPU again (for a thread that does other work between calls)."""
        if self._pinned is not None and self._pool.cpus is not None:
            with contextlib.suppress(OSError):  # as in _pin
                os.sched_setaffinity(0, self._pool.cpus)
            self._pinned = None

    def release(self) -> None:
        for i in self._held:
            fcntl.flock(self._fds[i], fcntl.LOCK_UN)
        self._pool.took(-len(self._held))
        self._held.clear()

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)


class CorePool:
    """`cores` cores shared through `folder` (None: a private folder, for a process serving alone)."""

    def __init__(
        self, cores: int, folder: Path | None = None, quiet: float = QUIET_SECONDS, slots: int = SLOTS
    ) -> None:
        self.cores = max(1, cores)
        self._owned = folder is None
        self.folder = Path(tempfile.mkdtemp(prefix="hare-cores-")) if folder is None else folder
        self._quiet = quiet
        # Cores this process's seats hold now (their threads update it under the lock).
        self._here = 0
        self._here_lock = threading.Lock()
        allowed = sorted(os.sched_getaffinity(0))
        # Core i is CPU cpus[i] when they are one to one; otherwise (hyper-threads, a CPU quota) the kernel places.
        self.cpus: list[int] | None = allowed if len(allowed) == self.cores else None
        fd = os.open(self.folder / "state", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            with flocked(fd):
                if os.fstat(fd).st_size < _size(slots):
                    os.ftruncate(fd, _size(slots))
                self._page = mmap.mmap(fd, 0)  # the whole page: its slots are the most any worker asked for
            # The slots as one array over the shared page: read per request (admission, balancing) at the
            # cost of one numpy call rather than 64 unpacks.
            self._slots = _slots(self._page)
            self._slot = self._claim(fd)
            self._others = np.arange(len(self._slots)) != self._slot
            # The columns as views of their own: a structured array's field lookup costs a view per call.
            self._pids = self._slots["pid"]
            self._tokens = self._slots["tokens"]
            self._connections = self._slots["connections"]
        finally:
            os.close(fd)

    def seat(self, home: int) -> Seat:
        """A seat for one model thread; `home` spreads waiting threads over the cores."""
        return Seat(self, home + self._slot)

    def quiet(self) -> bool:
        """No call found the cores all taken lately: a new call may take every core."""
        (contended_at,) = _HEADER.unpack_from(self._page, 0)
        return time.monotonic() - contended_at > self._quiet

    def took(self, cores: int) -> None:
        """A seat of this process took (or with a negative count, released) cores."""
        with self._here_lock:
            self._here += cores

    def held_here(self) -> int:
        """Cores this process's seats hold now."""
        return self._here

    def contended(self) -> None:
        _HEADER.pack_into(self._page, 0, time.monotonic())

    def set_queued(self, tokens: float) -> None:
        """This worker's queued tokens (admission reads the machine's sum)."""
        self._tokens[self._slot] = tokens

    def set_connections(self, count: int) -> None:
        """This worker's open connections (the accept loops balance them, api/process/worker.py), or
        NOT_ACCEPTING: a worker still loading its model, or draining, takes no new connection, so the others
        must not leave one to it."""
        self._connections[self._slot] = count

    def fewest_connections_elsewhere(self) -> int | None:
        """The open connections of the least busy other worker that accepts (None: no other one does)."""
        connections = self._connections
        others = connections[(self._pids != 0) & self._others & (connections != NOT_ACCEPTING)]
        return int(others.min()) if others.size else None

    def queued(self) -> float:
        """Tokens queued in every worker of the machine: a free slot holds none (claimed, closed and
        forgotten slots are zeroed), so the column's sum, with no mask to build per request."""
        return float(self._tokens.sum())

    def close(self) -> None:
        self._slots[self._slot] = (0, 0.0, 0)
        del self._slots, self._pids, self._tokens, self._connections  # the page cannot close while they point in
        self._page.close()
        if self._owned:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _claim(self, fd: int) -> int:
        """A free slot of the shared page for this process (a dead worker's slot is free again)."""
        with flocked(fd):
            for i in range(len(self._slots)):
                pid = int(self._slots["pid"][i])
                if pid == 0 or pid == os.getpid() or not _alive(pid):
                    self._slots[i] = (os.getpid(), 0.0, NOT_ACCEPTING)
                    return i
        raise RuntimeError(f"more than {len(self._slots)} workers share the core pool {self.folder}")


def forget(folder: Path, pid: int) -> None:
    """Clear a dead worker's slot (the gunicorn master calls this when it reaps one): its queue is gone."""
    try:
        fd = os.open(folder / "state", os.O_RDWR)
    except OSError:
        return
    try:
        with flocked(fd), mmap.mmap(fd, 0) as page:
            slots = _slots(page)
            slots[slots["pid"] == pid] = (0, 0.0, 0)
            del slots  # before the page closes
    finally:
        os.close(fd)


def accepting(folder: Path, pid: int) -> bool:
    """Whether worker `pid` of the pool in `folder` takes connections: its model loaded and warmed, its accept
    loop running (its slot's count is not NOT_ACCEPTING). The gunicorn master reads it on a reload."""
    try:
        page = (folder / "state").read_bytes()
    except OSError:
        return False
    if len(page) < _size(SLOTS):
        return False
    slots = _slots(page)
    return bool(((slots["pid"] == pid) & (slots["connections"] != NOT_ACCEPTING)).any())


def _slots(page: mmap.mmap | bytes) -> np.ndarray:
    """The page's worker slots as a structured array (writes go to the page, seen by every worker)."""
    count = (len(page) - _HEADER.size) // _SLOT.itemsize
    return np.frombuffer(page, dtype=_SLOT, count=count, offset=_HEADER.size)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
