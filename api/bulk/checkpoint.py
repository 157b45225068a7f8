"""The job's work folder beside its output (`OUTPUT.parts/`): what job it belongs to, and which chunks are done.

    OUTPUT.parts/job.json    the input (path, size, modification time), the bundle, every option that shapes
                             the output; written once, when the folder is made
    OUTPUT.parts/part-*      the committed chunks (api/bulk/writer.py)

The same command again finds the folder, checks that job.json describes the same job, and skips the chunks
whose part is there: a run killed at any point (kill -9 included) finishes with every row exactly once. Another
job's folder is never mixed in: a changed input or option stops with a sentence saying what changed. When
every chunk is done the parts are merged into OUTPUT and the folder removed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from container.locking import locked
from tasks.errors import InputError

JOB_FILE = "job.json"


def work_folder(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def describe_input(path: Path, files: list[Path]) -> dict[str, Any]:
    """What identifies the input, a file or a folder's `files`: a file rewritten, added or taken away since the
    first run makes another input."""
    if path.is_file():
        stat = path.stat()
        return {"path": str(path.resolve()), "bytes": stat.st_size, "modified_ns": stat.st_mtime_ns}
    found = [(str(f.relative_to(path)), f.stat()) for f in files]
    return {"path": str(path.resolve()), "files": [[name, s.st_size, s.st_mtime_ns] for name, s in found]}


class WorkFolder:
    """A job's work folder, locked while the job runs (`with`): a second `hare run` on the same output is
    refused rather than writing the same parts and merging into the same temporary file. The lock is the
    kernel's (flock on the folder), so a process killed at any point holds it no longer."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.resumed = False
        self._fd: int | None = fd
        self._claim: tuple[Path, int] | None = None  # the rejects file's lock (`claim`)

    def __enter__(self) -> WorkFolder:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._claim is not None:
            os.close(self._claim[1])
            self._claim = None

    def claim(self, rejects: Path) -> None:
        """Lock the rejects file for this job, until it ends: two jobs whose outputs share a stem (out.parquet,
        out.jsonl) share out.rejects.jsonl, and the one that ended last replaced the other's rejects with its
        own (both found no file when they began). The lock is a hidden file beside it, removed with the folder."""
        lock = rejects.with_name(f".{rejects.name}.lock")
        busy = f"{rejects} is the rejects file of another hare run going on now; give this job --rejects FILE"
        while (fd := locked(lock, os.O_RDWR | os.O_CREAT, busy)) is None:
            pass  # removed by the job that held it, just now: create it again
        self._claim = (lock, fd)

    def close(self) -> None:
        """Remove the folder once its parts are merged: the parts first, job.json last, so a run killed midway
        still finds a folder it can resume (and rewrite the missing parts)."""
        for path in sorted(self.path.iterdir()):
            if path.name != JOB_FILE:
                path.unlink()
        (self.path / JOB_FILE).unlink()
        self.path.rmdir()
        if self._claim is not None:  # still held: a job that opens it now finds it replaced, and looks again
            self._claim[0].unlink(missing_ok=True)


def open_folder(output: Path, job: dict[str, Any], overwrite: bool, rejects: Path | None = None) -> WorkFolder:
    """The work folder for `job`, locked: made if new, resumed (`resumed`) if it holds the same job. A folder
    that holds no committed part (its run stopped before its first chunk was written, or was refused after
    the folder was made) is taken over by this job; one with parts of another job stops it with a sentence.
    A new job's output, and its `rejects` file, are not replaced unless `overwrite` (two outputs of one stem,
    out.parquet and out.jsonl, share out.rejects.jsonl: the second job deleted the first one's)."""
    folder = work_folder(output)

    def refuse_replacing() -> None:
        for path in (output, *([rejects] if rejects is not None else [])):
            if path.exists() and not overwrite:
                raise InputError(f"{path} already exists; delete it or pass --overwrite")

    while True:
        if not folder.is_dir():
            refuse_replacing()
            try:
                folder.mkdir(parents=True)
            except FileExistsError:  # another run made it just now: the lock decides
                pass
            except OSError as exc:
                raise InputError(
                    f"cannot write {output}: {exc.strerror} ({exc.filename}); give an output in a folder this "
                    "user can write"
                ) from exc
        work = _locked(folder, output)
        if work is None:  # merged and removed by the run that held it: look again
            continue
        try:
            if rejects is not None:
                work.claim(rejects)
            before = _job(folder)
            if before == job:
                work.resumed = True
                return work
            if any(folder.glob("part-*")):
                changed = ", ".join(sorted(k for k in job if before is None or before.get(k) != job[k]))
                raise InputError(
                    f"{folder} holds an unfinished job that differs from this one in its {changed or 'description'}; "
                    f"run the same command as before to finish it, or delete {folder} to start over"
                )
            refuse_replacing()
            for stale in folder.iterdir():  # nothing of a run without a committed part is worth keeping
                stale.unlink()
            tmp = folder / (JOB_FILE + ".tmp")
            tmp.write_text(json.dumps(job, indent=1, sort_keys=True))
            tmp.replace(folder / JOB_FILE)
            return work
        except BaseException:
            if not any(folder.iterdir()):  # refused before it held anything: nothing left behind
                folder.rmdir()
            work.release()
            raise


def _locked(folder: Path, output: Path) -> WorkFolder | None:
    """`folder` locked by this process (InputError if another holds it), or None if it was removed between
    its opening and its locking."""
    busy = f"another hare run is writing {output} ({folder} is in use); wait for it to finish, or give another output"
    fd = locked(folder, os.O_RDONLY | os.O_DIRECTORY, busy)
    return None if fd is None else WorkFolder(folder, fd)


def _job(folder: Path) -> dict[str, Any] | None:
    """The job a folder's job.json describes (None: none, or unreadable)."""
    try:
        before = json.loads((folder / JOB_FILE).read_text())
    except (OSError, ValueError):
        return None
    return before if isinstance(before, dict) else None
