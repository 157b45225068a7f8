"""Where a served worker's memory goes under `hare bench overload`'s phases: one fresh `hare serve BUNDLE`, the
phases run in the bench's order (one user, the tails at 8 and 128 tokens with 2 and 16 users, capacity, 3x open
loop, the 1000-connection flood, recovery), and after each every worker's RSS with its heap, its anonymous
mappings and the pages of the model file it holds (from /proc/PID/smaps). `hare bench overload` reads the largest
RSS only at warm-up and after the flood; this says which phase added what, and whether it is the model file's
pages (which its goal subtracts) or the process's own.

    python scripts/overload-memory.py BUNDLE [hare serve arguments...]

Measured with it: docs/history/measurements-2026-11.md, "Where an OpenVINO worker's memory goes under `hare
bench overload`".
"""

from __future__ import annotations

import collections
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.inputs import make_bodies
from bench.overload import OverloadOptions, _Scenario
from bench.servers import ServerProcess, group_rss_mb, hare_server
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


def report(label: str, server: ServerProcess, model_file: str) -> None:
    assert server.proc is not None
    rss = group_rss_mb(server.proc.pid)
    cells = []
    for pid in sorted(rss):
        if pid == server.proc.pid:
            continue  # the gunicorn master holds no model
        m = mappings_mb(pid)
        cells.append(f"{rss[pid]:.1f} (heap {m['[heap]']:.1f}, anon {m['[anon]']:.1f}, model file {m[model_file]:.1f})")
    print(f"{label:12s} " + " | ".join(cells), flush=True)


def main() -> None:
    bundle, extra = Path(sys.argv[1]), sys.argv[2:]
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as folder:
        sc = _Scenario(OverloadOptions(bundle=bundle, serve_args=tuple(extra)), Store(Path(folder) / "b.db"), stop)
        model_file = next((p.name for p in bundle.glob(f"{MODEL_FILE}.data")), MODEL_FILE)
        print(f"MB of RSS per worker: heap, anonymous mappings, the model file's pages ({model_file})")
        server = hare_server(bundle, extra=extra)
        with server.start():
            server.wait_ready(stop=stop)
            time.sleep(1.0)
            report("warm", server, model_file)
            users = 2 * sc.cores
            sc.load(server, "closed", 1)
            report("one user", server, model_file)
            for seq in (8, 128):
                bodies = make_bodies(sc.task, 1, seq, sc.maker)
                for n in (sc.cores, 16):
                    sc.load(server, "closed", n, bodies=bodies)
                    report(f"{seq}t {n}u", server, model_file)
            capacity = sc.load(server, "closed", users)
            report("capacity", server, model_file)
            sc.load(server, "open", rate=3 * capacity.ok / capacity.window_s, warmup=1.0)
            report("open 3x", server, model_file)
            sc.load(server, "closed", 1000, warmup=1000 * 0.006 + 2)
            report("flood", server, model_file)
            sc.load(server, "closed", users, warmup=0.0)
            report("recovery", server, model_file)


if __name__ == "__main__":
    main()
