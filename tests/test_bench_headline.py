"""The headline's goals: each met or not with its figure, and by how much it falls short."""

from __future__ import annotations

from dataclasses import replace

from bench.headline import evaluate, goals_table, headline_table
from bench.store import Point


def pt(target: str, seq: int, req_s: float, p50: float, p99: float | None = None, conc: int = 2) -> Point:
    return Point(
        run_id=1, idx=1, target=target, load="closed", workers=2, threads=1, seq_len=seq, batch=1,
        concurrency=conc, rate=0.0, duration_s=8.0, requests=100, ok=100, errors={}, req_s=req_s, seq_s=req_s,
        tokens_s=req_s * seq, lat_min=p50, lat_avg=p50, lat_p50=p50, lat_p90=p50, lat_p95=p50,
        lat_p99=p99 if p99 is not None else p50 * 1.2, lat_max=p50 * 2, server={}, client_cpu=0.05,
    )  # fmt: skip


def test_goals_met_and_missed() -> None:
    cls = [
        replace(pt("hare", 8, 300, 6.2), extra={"server_cpu_by_process": [1.62, 0.01, 0.0]}),
        pt("vanilla", 8, 40, 50),
        pt("model-only", 8, 400, 6.0, conc=1),
        pt("model-only", 8, 700, 6.1),  # two streams side by side: not what the goal compares with
        pt("hare", 16, 200, 9),
        pt("vanilla", 16, 40, 50),
        pt("hare", 128, 30, 60, p99=120),
        pt("vanilla", 128, 9, 200),
        pt("model-only", 128, 20, 50, conc=1),
    ]
    emb = [pt("hare", 8, 500, 30, conc=16), pt("hare", 128, 60, 250, conc=16)]
    goals = {g["goal"]: g for g in evaluate(cls, emb, cores=2)}
    assert goals["throughput vs vanilla at seq 8"]["met"] and goals["throughput vs vanilla at seq 8"]["value"] == 7.5
    missed = goals["throughput vs vanilla at seq 16"]
    assert not missed["met"] and missed["gap"].startswith("short by 17%")
    assert goals["throughput vs vanilla at seq 512"]["gap"] == "not measured"
    assert goals["throughput at seq 8"]["met"] and not goals["throughput at seq 128"]["met"]
    assert (
        goals["e2e p50 - model-only p50 at seq 8"]["value"] == 0.2 and goals["e2e p50 - model-only p50 at seq 8"]["met"]
    )
    overhead = goals["(e2e p50 - model-only p50) / model-only p50 at seq 128"]
    assert overhead["value"] == 20 and overhead["gap"].startswith("over by 100%")
    assert goals["p99 / p50 (worst: seq 128)"]["value"] == 2.0
    assert goals["embeddings, 16 users, 8 tokens"]["met"] and not goals["embeddings, 16 users, 128 tokens"]["met"]
    assert goals_table(list(goals.values())).row_count == len(goals)
    table = headline_table(cls, emb)
    assert table.row_count == 5
    side_by_side = list(table.columns[9].cells)
    assert side_by_side[0] == "6.10 (x2)" and side_by_side[2] == "-"
    # Cores by worker, busiest first: here both clients' connections landed on one of the two workers.
    by_worker = list(table.columns[12].cells)
    assert by_worker[0] == "1.62+0.01" and by_worker[1] == "-"
