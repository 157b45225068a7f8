"""`hare serve` under a mix of text lengths, as real traffic sends them, from wrk (an independent load generator;
`hare bench run BUNDLE --seq mix` measures the same mix from its own): wrk posts one of 2,000 texts of 3-140 words
(bench.inputs.mixed_texts) chosen at random, at each connection count; printed per point: req/s, the server's CPU
per answer (every server process's scheduler time), wrk's p50 / p99, and each server process's RSS after it. Where
a runtime compiles kernels per input shape (OpenVINO), this shows what fixed-length benchmarks cannot.

    python scripts/mixed-lengths.py BUNDLE [2,16]     # LABEL, DUR (s a point), PORT from the environment

Needs wrk (apt-get install wrk). Measured with it: docs/history/measurements-2026-11.md, "OpenVINO's served calls
padded to a multiple of 8 tokens".
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.inputs import mixed_texts


def wrk_script(path: Path) -> None:
    bodies = ",\n".join("[==[" + json.dumps({"inputs": t}) + "]==]" for t in mixed_texts(2000, seed=1))
    path.write_text(
        f"bodies = {{\n{bodies}}}\nmath.randomseed(1)\n"
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        "request = function() return wrk.format(nil, nil, nil, bodies[math.random(#bodies)]) end\n"
    )


def group(leader: int) -> list[int]:
    out = subprocess.run(["pgrep", "-g", str(os.getpgid(leader))], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for stat in glob.glob(f"/proc/{pid}/task/*/schedstat"):
            with contextlib.suppress(OSError, ValueError):  # a thread that ended
                total += int(Path(stat).read_text().split()[0])
    return total / 1e9


def rss_mb(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        out += [int(line.split()[1]) // 1024 for line in status.splitlines() if line.startswith("VmRSS")]
    return sorted(out)


def main(bundle: str, conns: list[int]) -> None:
    dur, port, label = os.environ.get("DUR", "10"), os.environ.get("PORT", "18431"), os.environ.get("LABEL", "")
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "hare.cli", "serve", bundle, "--port", port],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(f"{url}/ready").status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        with tempfile.TemporaryDirectory() as tmp:
            lua = Path(tmp) / "mix.lua"
            wrk_script(lua)
            subprocess.run(["wrk", "-t1", "-c2", "-d2", "-s", lua, f"{url}/predict"], capture_output=True)
            for c in conns:
                before = cpu_seconds(group(server.pid))
                out = subprocess.run(
                    ["wrk", "-t1", f"-c{c}", f"-d{dur}", "--latency", "-s", lua, f"{url}/predict"],
                    capture_output=True,
                    text=True,
                ).stdout
                spent = cpu_seconds(group(server.pid)) - before
                answers = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
                rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
                p50, p99 = (re.search(rf"^\s+{q}%\s+(\S+)", out, re.M).group(1) for q in (50, 99))  # type: ignore[union-attr]
                errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
                print(
                    f"{label} {c} connections: {rate:,.1f} req/s, server {1000 * spent / answers:.3f} ms of CPU an "
                    f"answer, p50 {p50} p99 {p99}, RSS {rss_mb(group(server.pid))} MB"
                    + (f", {errors.group(1)} errors" if errors else ""),
                    flush=True,
                )
    finally:
        os.killpg(os.getpgid(server.pid), signal.SIGTERM)
        server.wait()


if __name__ == "__main__":
    main(sys.argv[1], [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "2,16").split(",")])
