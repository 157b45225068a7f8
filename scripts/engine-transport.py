"""The shared engine's own rate, with the model's run stood in for by a sleep (a GPU's batch time): how many
128-token sequences a second get through api/process/engine.py from several worker processes (2 model threads
each, as a worker's streams), answered as token states (output_value token_embeddings), pooled by the engine
(the default embedding request, where the device cannot pool) and pooled on the device (as CUDA graphs
answer it: container/cudagraphs.py), with the engine process's CPU time per call. What it measures is the
engine's Python and the sockets, not a model.

    python scripts/engine-transport.py [--procs 4] [--batch 7] [--length 128] [--width 384] [--run-ms 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from api.engine.remote import RemoteBackend
from api.process.engine import Engine, listen
from bench.servers import group_cpu_seconds


class StandIn:
    """Backend's interface to the engine: a sleep for the run, then an output of the model's shape."""

    def __init__(self, width: int, run_s: float, pools: bool) -> None:
        self.providers, self.input_names = ["stand-in"], ["input_ids", "attention_mask"]
        self.output_width, self.run_s, self.pools = width, run_s, pools

    def padded_length(self, longest: int) -> int:
        return longest  # any length runs alike here

    def run_padded(
        self, feeds: dict[str, NDArray[np.int64]], width: int = 1, pooling: str | None = None
    ) -> NDArray[np.float32]:
        """A vector a sequence where the device pools and a pooling is asked; token states otherwise (the
        engine pools them)."""
        n, length = feeds["input_ids"].shape
        time.sleep(self.run_s)
        if self.pools and pooling is not None:
            return np.ones((n, self.output_width), np.float32)
        return np.ones((n, length, self.output_width), np.float32)


def engine(socket: str, width: int, run_s: float, pools: bool) -> None:
    served = Engine(StandIn(width, run_s, pools), 0, 64, 16384, CollectorRegistry())  # type: ignore[arg-type]
    threading.Thread(target=served.run_forever, daemon=True).start()
    served.serve_forever(listen(Path(socket)))


def worker(socket: str, args: argparse.Namespace, pool: str | None, out: mp.Queue) -> None:  # type: ignore[type-arg]
    remote = RemoteBackend(Path(socket))
    feeds = {"input_ids": np.ones((args.batch, args.length), np.int64)}
    feeds["attention_mask"] = feeds["input_ids"]
    lengths = [args.length] * args.batch
    counts = [0, 0]

    def stream(i: int) -> None:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            remote.run_padded(feeds, pooling=pool, lengths=lengths)
            counts[i] += 1

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(sum(counts))


# (label, the callers' pooling, whether the stand-in's device pools)
CASES = [("token states", None, False), ("pooled by engine", "mean", False), ("pooled on device", "mean", True)]


def engine_cpu(pid: int) -> float:
    """Seconds of CPU the process has run, its threads that ended included (Linux's /proc)."""
    return (group_cpu_seconds(os.getpgid(pid)) or {}).get(pid, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=4, help="worker processes (2 model threads each)")
    parser.add_argument("--batch", type=int, default=7, help="sequences per worker call")
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--width", type=int, default=384, help="the model's hidden size")
    parser.add_argument("--run-ms", type=float, default=1.0, help="the stand-in model's time per batch")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds of each")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; {args.procs} workers x 2 threads, calls of {args.batch} x {args.length} tokens")
    for _ in range(args.rounds):
        for label, pool, pools in CASES:
            with tempfile.TemporaryDirectory(prefix="hare-transport-") as folder:
                socket = os.path.join(folder, "engine.sock")
                run_s = args.run_ms / 1000
                server = mp.Process(target=engine, args=(socket, args.width, run_s, pools), daemon=True)
                server.start()
                while not os.path.exists(socket):
                    time.sleep(0.05)
                out: mp.Queue = mp.Queue()  # type: ignore[type-arg]
                workers = [mp.Process(target=worker, args=(socket, args, pool, out)) for _ in range(args.procs)]
                for w in workers:
                    w.start()
                assert server.pid is not None
                cpu = engine_cpu(server.pid)  # the callers' connecting and the engine's greetings included
                calls = sum(out.get() for _ in workers)
                cpu = engine_cpu(server.pid) - cpu
                for w in workers:
                    w.join()
                server.terminate()
                server.join()
            rate = calls / args.seconds
            us = cpu / calls * 1e6 if calls else 0.0
            sequences = rate * args.batch
            print(f"  {label:17} {rate:8,.0f} calls/s  {sequences:9,.0f} sequences/s  {us:5.0f} us engine CPU a call")


if __name__ == "__main__":
    main()
