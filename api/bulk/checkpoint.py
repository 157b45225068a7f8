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
import shutil
from pathlib import Path
from typing import Any

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


def open_folder(output: Path, job: dict[str, Any], overwrite: bool) -> tuple[Path, bool]:
    """The work folder for `job` (made if new) and whether it was there already (a resumed run)."""
    folder = work_folder(output)
    found = folder / JOB_FILE
    if found.is_file():
        try:
            before = json.loads(found.read_text())
        except ValueError:
            before = None
        if before != job:
            changed = sorted(k for k in job if not isinstance(before, dict) or before.get(k) != job[k])
            raise InputError(
                f"{folder} holds an unfinished job with another {', '.join(changed) or 'description'}; run the "
                f"same command as before to finish it, or delete {folder} to start over"
            )
        return folder, True
    if output.exists() and not overwrite:
        raise InputError(f"{output} already exists; delete it or pass --overwrite")
    if folder.exists():  # a folder from a run killed before it wrote job.json: nothing of it can be trusted
        shutil.rmtree(folder)
    try:
        folder.mkdir(parents=True)
    except OSError as exc:
        raise InputError(
            f"cannot write {output}: {exc.strerror} ({exc.filename}); give an output in a folder this user can write"
        ) from exc
    tmp = found.with_name(JOB_FILE + ".tmp")
    tmp.write_text(json.dumps(job, indent=1, sort_keys=True))
    tmp.replace(found)
    return folder, False


def close_folder(folder: Path) -> None:
    """Remove the work folder once its parts are merged: the parts first, job.json last, so a run killed
    midway still finds a folder it can resume (and rewrite the missing parts)."""
    for path in sorted(folder.iterdir()):
        if path.name != JOB_FILE:
            path.unlink()
    (folder / JOB_FILE).unlink()
    folder.rmdir()
