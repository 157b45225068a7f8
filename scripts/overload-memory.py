"""Where a served worker's memory goes under `hare bench overload`'s phases: the bench itself (bench/overload.py,
its run kept in a throwaway store, its goals printed), and after warm-up and each phase every worker's RSS with
its heap, its anonymous mappings and the pages of the model file it holds (from /proc/PID/smaps). The bench
reads the largest RSS only at warm-up and after the flood; this says which phase added what, and whether it is
the model file's pages (which its goal subtracts) or the process's own.

    python scripts/overload-memory.py BUNDLE [hare serve arguments...]

Measured with it: docs/history/measurements-2026-11.md, "Where an OpenVINO worker's memory goes under `hare
bench overload`".
"""

from __future__ import annotations

import collections
import functools
import sys
import tempfile
import threading
from pathlib import Path

from bench.overload import OverloadOptions, run_overload
from bench.servers import group_rss_mb
from bench.store import Store
from container.bundle import MODEL_FILE


def mappings_mb(pid: int) -> collections.defaultdict[str, float]:
    """RSS (MB) of a process by mapping: "[heap]", "[anon]" (every unnamed mapping), or a file's name."""
    found: collections.defaultdict[str, float] = collections.defaultdict(float)
    name = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and ":" not in fields[0]:  # a mapping's header: range, perms, offset, dev, inode, path
            name = Path(fields[5]).name if len(fields) > 5 and fields[5].startswith("/") else " ".join(fields[5:])
            name = name or "[anon]"
        elif fields[0] == "Rss:":
            found[name] += int(fields[1]) / 1024
    return found


def report(pgid: int, label: str, *, model_file: str) -> None:
    rss = group_rss_mb(pgid)
    cells = []
    for pid in sorted(rss):
        if pid == pgid:
            continue  # the gunicorn master holds no model
        m = mappings_mb(pid)
        cells.append(f"{rss[pid]:.1f} (heap {m['[heap]']:.1f}, anon {m['[anon]']:.1f}, model file {m[model_file]:.1f})")
    print(f"{label:14s} " + " | ".join(cells), flush=True)


def main() -> None:
    bundle, extra = Path(sys.argv[1]), sys.argv[2:]
    model_file = next((p.name for p in bundle.glob(f"{MODEL_FILE}.data")), MODEL_FILE)
    print(f"MB of RSS per worker after each phase: heap, anonymous mappings, the model file's pages ({model_file})")
    with tempfile.TemporaryDirectory() as folder:
        options = OverloadOptions(bundle=bundle, serve_args=tuple(extra))
        run_overload(
            options,
            Store(Path(folder) / "bench.db"),
            threading.Event(),
            functools.partial(report, model_file=model_file),
        )


if __name__ == "__main__":
    main()
