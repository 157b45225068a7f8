"""The kernel's advisory lock on a file or folder, as a job holds its place (`hare optimize` its bundle, `hare
run` its work folder): let go however the process ends, a kill included."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.errors import InputError


def locked(path: Path, flags: int, busy: str) -> int | None:
    """`path` opened with `flags` and locked by this process: its descriptor. InputError(`busy`) if another
    process holds it; InputError too if it is to be created (O_CREAT) where no file can be; None if it was
    removed or replaced between its opening and its locking (the caller opens it again, or gives up). On a file
    system without locks (some network mounts) it is returned unlocked: the work runs, unguarded."""
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if flags & os.O_CREAT:  # its folder is missing or takes no files (/proc): no look again creates it
            raise InputError(f"cannot create {path}: its folder is missing or holds no files") from None
        return None
    except OSError as exc:  # a read-only file system, another user's folder, /sys: said as "[Errno 13] ..." before
        verb = "create" if flags & os.O_CREAT else "open"
        raise InputError(f"cannot {verb} {path} ({exc.strerror}); give a place this user can write") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InputError(busy) from None
    except OSError:
        pass
    try:
        same = os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
        return None
    return fd


@contextmanager
def holding(lock: Path, busy: str) -> Iterator[None]:
    """Hold the lock file `lock` (made if missing) while the block runs: a second job that takes it meanwhile is
    refused with InputError(`busy`). Let go however the process ends; the file is removed after."""
    while (fd := locked(lock, os.O_RDWR | os.O_CREAT, busy)) is None:
        pass  # removed by the job that held it as this one took it: take the one there now
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


class flocked:
    """flock(`fd`) held exclusively while a `with` block runs: the pages the workers share (the core pool's slots,
    the rate limiter's buckets). None locks nothing: a page private to one process. A class, not a generator:
    the rate limiter takes it on every request."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
