"""The server's scratch folders (its metrics, its core pool, its engine's socket): each named after the master's
pid, so that a server started later removes those of a master killed outright (kill -9, the OOM killer), which
could not remove them itself. A folder whose pid is alive, or is another user's process, is kept; one named
after this process that it did not make is a restarted container's (its master is PID 1 each time)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

KINDS = ("metrics", "cores", "engine")
_NAME = re.compile(rf"hare-(?:{'|'.join(KINDS)})-(\d+)-[^/]+")
_MADE: set[str] = set()  # the folders this process made: those of its pid that are not stale


def make(kind: str, parent: Path | None = None) -> str:
    """A new scratch folder of `kind` (one of KINDS) under `parent` (default: the temporary folder)."""
    assert kind in KINDS, kind
    folder = tempfile.mkdtemp(prefix=f"hare-{kind}-{os.getpid()}-", dir=parent)
    _MADE.add(os.path.realpath(folder))
    return folder


def sweep(parent: Path | None = None) -> None:
    """Remove the scratch folders under `parent` (default: the temporary folder) whose master is gone."""
    folder = Path(tempfile.gettempdir()) if parent is None else parent
    for path in folder.glob("hare-*-*-*"):
        named = _NAME.fullmatch(path.name)
        if named and path.is_dir() and not _alive(int(named[1]), path):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int, folder: Path) -> bool:
    """Whether the master that made `folder` may still use it."""
    if pid == os.getpid():
        return os.path.realpath(folder) in _MADE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
