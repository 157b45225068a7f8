"""A point of a run: as planned (target, server shape, load) and as measured (bench.store's Point, its rates
worked out from the answers counted in the window). bench/runner.py and bench/overload.py make theirs here."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.stats import Summary
from bench.store import Point

# The mixes of lengths a point may send instead of exact token counts, by name (bench.inputs.MIXES makes their
# texts). Here, apart from the tokenizer bench.inputs needs, so that the console can check a form without it.
MIX_NAMES = ("comet", "mix")


@dataclass(frozen=True)
class Planned:
    target: str
    workers: int | None
    threads: int | None
    seq_len: int | str  # tokens, or a mix's name (bench.inputs.MIXES)
    batch: int
    concurrency: int
    rate: float


def make_point(
    run_id: int,
    idx: int,
    target: str,
    load: str,
    workers: int,
    threads: int,
    planned: Planned,
    tokens: float,
    window_s: float,
    requests: int,
    ok: int,
    errors: dict[str, int],
    lat: Summary,
    *,
    server: dict[str, float],
    client_cpu: float,
    server_cpu: float | None = None,
    extra: dict[str, Any] | None = None,
    answered: int | None = None,
) -> Point:
    """One measured point: the rates follow from `answered` answers (default `ok`, the latencies' count) in
    `window_s`, `planned.batch` sequences of `tokens` tokens each."""
    req_s = (ok if answered is None else answered) / max(window_s, 1e-9)
    return Point(
        run_id=run_id,
        idx=idx,
        target=target,
        load=load,
        workers=workers,
        threads=threads,
        seq_len=_seq_len(planned.seq_len, tokens),
        batch=planned.batch,
        concurrency=planned.concurrency,
        rate=planned.rate,
        duration_s=round(window_s, 3),
        requests=requests,
        ok=ok,
        errors=errors,
        req_s=req_s,
        seq_s=req_s * planned.batch,
        tokens_s=req_s * planned.batch * tokens if not math.isnan(tokens) else 0.0,
        lat_min=lat.min,
        lat_avg=lat.avg,
        lat_p50=lat.p50,
        lat_p90=lat.p90,
        lat_p95=lat.p95,
        lat_p99=lat.p99,
        lat_max=lat.max,
        server=server,
        client_cpu=client_cpu,
        server_cpu=server_cpu,
        extra=extra or {},
    )


def _seq_len(asked: int | str, tokens: float) -> int:
    if isinstance(asked, int):
        return asked
    return 0 if math.isnan(tokens) else round(tokens)
