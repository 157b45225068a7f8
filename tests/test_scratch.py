"""The server's scratch folders (api/process/scratch.py) in a container restarted with its /tmp kept: its master
is PID 1 every time, so the folders the last one left are named after a live pid, this process's own."""

from __future__ import annotations

import os
from pathlib import Path

from api.process import scratch


def test_a_folder_named_after_this_process_that_it_did_not_make_is_swept(tmp_path: Path) -> None:
    mine = Path(scratch.make("metrics", tmp_path))
    before_the_restart = tmp_path / f"hare-metrics-{os.getpid()}-x1y2z3"
    running = tmp_path / f"hare-cores-{os.getppid()}-a1b2c3"  # another master, alive
    for folder in (before_the_restart, running):
        folder.mkdir()
    scratch.sweep(tmp_path)
    assert mine.is_dir() and running.is_dir()
    assert not before_the_restart.exists()
