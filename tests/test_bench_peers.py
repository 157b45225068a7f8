"""`hare bench peers`: hare's bundle against the CPU stacks, in process, on a tiny sentence-transformers model.

With the dev dependencies only, hare and sentence-transformers' torch run and the other peers are skipped with
their reason; hare's fp32 bundle answers what torch answers. No timing is asserted: only that every figure
was measured. Every other peer needs optimum-onnx or optimum-intel, which cannot be installed beside hare's
pins (optimum-onnx 0.1.0, the newest, needs transformers<4.58; docs/development.md), so no test here depends
on them: `hare bench peers` measures them from an environment of their own."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from bench.inputs import load_tokenizer
from bench.peers.candidates import base
from bench.peers.candidates.base import int8_config_for
from bench.peers.candidates.hare import HareEncoder
from bench.peers.options import PeersOptions
from bench.peers.results import GOAL_P1, Row, goal
from bench.peers.runner import run_peers
from bench.peers.texts import fidelity_texts
from bench.servers import ServerProcess
from bench.store import Store
from container.bundle import MANIFEST_FILE
from tasks.ops import length_batches
from tests.conftest import ModelFactory, quick_bundle
from tests.tiny_models import make_sentence_transformer


def tiny(folder: Path, bundle: Path, work: Path, candidates: tuple[str, ...]) -> PeersOptions:
    """Options small enough for a test: 2 rounds of one call per slot, 24 fidelity texts."""
    return PeersOptions(
        model_dir=folder,
        bundle=bundle,
        seq_len=16,
        batch=4,
        threads=(1,),
        rounds=2,
        seconds=0.0,
        warmup_calls=1,
        min_calls=1,
        fidelity=24,
        fidelity_max=40,
        candidates=candidates,
        work=work,
    )


@pytest.fixture(scope="module")
def st_model(tiny_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A sentence-transformers folder (mean pooling, Normalize) and hare's fp32 bundle of it."""
    folder = make_sentence_transformer(
        tmp_path_factory.mktemp("peers") / "model", tiny_model("feature-extraction"), pooling="mean"
    )
    bundle = quick_bundle(folder, "feature-extraction", tmp_path_factory.mktemp("peers-bundle") / "bundle")
    return folder, bundle


def test_hare_and_torch_run_and_absent_peers_are_skipped_with_a_reason(
    st_model: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, bundle = st_model
    # A peer whose package is surely absent, whatever this environment holds.
    monkeypatch.setitem(base.NEEDS, "fastembed", ("fastembed_not_installed_here",))
    options = tiny(folder, bundle, tmp_path / "work", ("hare", "torch", "fastembed"))
    store = Store(tmp_path / "bench.db")
    run_id, rows = run_peers(options, store, say=lambda _: None)
    by_key = {r.key: r for r in rows}
    assert [r.key for r in rows] == ["hare", "torch", "fastembed"]
    assert "not installed: fastembed_not_installed_here" in by_key["fastembed"].skipped
    for key in ("hare", "torch"):
        row = by_key[key]
        assert not row.skipped
        assert row.p50_ms[1] > 0 and row.sentences_s[1] > 0 and row.cores
    assert by_key["torch"].cosine_p1 > 0.9999  # the reference against itself
    assert by_key["hare"].cosine_p1 > 0.999 and by_key["hare"].cosine_mean > 0.999

    run = store.run(run_id)
    assert run.kind == "peers" and run.status == "done"
    assert run.settings["threads"] == [1] and run.summary["fidelity_tokens"]["texts"] == 24
    points = store.points(run_id)
    assert sorted((p.target, p.batch) for p in points) == sorted((k, b) for k in ("hare", "torch") for b in (1, 4))
    assert all(p.load == "in-process" and p.ok >= 2 and p.threads == 1 for p in points)  # 2 rounds, 1 call each
    assert {g["figure"] for g in run.summary["goal"]} == {"batch 1 p50 ms", "batch sentences/s"}


def test_the_command_line_runs_and_shows_the_table(
    st_model: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hare.cli import main

    folder, bundle = st_model
    db = tmp_path / "bench.db"
    argv = ["bench", "peers", str(folder), "--bundle", str(bundle), "--only", "hare", "--seq", "12", "--batch", "3"]
    argv += ["--threads", "1", "--rounds", "1", "--seconds", "0", "--fidelity", "6", "--fidelity-max", "20"]
    assert main([*argv, "--work", str(tmp_path / "work"), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "hare's bundle, hare's own runtime code" in out and "sentence-transformers torch fp32" in out
    assert "goal: hare at least as fast" in out and "load average" in out
    run_id = Store(db).runs()[0].id
    assert main(["bench", "show", str(run_id), "--db", str(db)]) == 0  # a stored run prints the same table
    assert "cosine p1 to torch" in capsys.readouterr().out


def test_fidelity_texts_span_short_to_long(st_model: tuple[Path, Path]) -> None:
    _, bundle = st_model
    tok = load_tokenizer(bundle / "tokenizer.json")
    texts = fidelity_texts(tok, 30, longest=60)
    lengths = [len(tok.encode(t).ids) for t in texts]
    assert len(set(texts)) > 20 and min(lengths) >= 3 and max(lengths) <= 60 and lengths[-1] >= 50


def test_the_int8_configuration_follows_the_cpu() -> None:
    assert int8_config_for(["avx2", "avx512f", "avx512bw", "avx512_vnni"]) == "avx512_vnni"
    assert int8_config_for(["avx2", "avx512f", "avx512bw"]) == "avx512"
    assert int8_config_for(["avx2", "fma"]) == "avx2"
    assert int8_config_for(["asimddp"], "aarch64") == "arm64"


def test_the_goal_counts_only_peers_close_enough_to_torch() -> None:
    hare = Row("hare", "", p50_ms={1: 10.0}, sentences_s={1: 100.0}, cosine_p1=0.999)
    close = Row("onnx", "", p50_ms={1: 12.0}, sentences_s={1: 90.0}, cosine_p1=GOAL_P1)
    far = Row("onnx-int8", "", p50_ms={1: 5.0}, sentences_s={1: 200.0}, cosine_p1=0.98)
    skipped = Row("openvino", "", skipped="not installed: openvino")
    goals = goal([hare, close, far, skipped], [1])
    assert [(g["best_peer"], g["met"]) for g in goals] == [("onnx", True), ("onnx", True)]
    nobody = goal([hare, far], [1])
    assert all(g["best_peer"] is None and g["met"] is None for g in nobody)
    assert math.isnan(Row.from_dict(Row("x", "y").to_dict()).cosine_p1)


def test_hare_runs_a_batch_as_the_server_does_in_budget_sized_calls_and_answers_in_order(
    st_model: tuple[Path, Path], tmp_path: Path
) -> None:
    _, built = st_model
    bundle = tmp_path / "bundle"
    shutil.copytree(built, bundle)
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest | {"max_batch_tokens": 24}))
    texts = ["a short one", "a much longer text with many more words in it than the others", "mid sized text"]
    texts = texts * 4
    lengths = [len(HareEncoder(built, 1).tok.encode(t).ids) for t in texts]
    calls = length_batches(lengths, 32, 24)
    # Every text once, each call within the budget (one sequence always fits), nearest lengths together.
    assert sorted(i for call in calls for i in call) == list(range(len(texts))) and len(calls) > 1
    assert all(len(c) == 1 or max(lengths[i] for i in c) * len(c) <= 24 for c in calls)
    encoder, shapes = HareEncoder(bundle, 2), []
    run = encoder.narrow.run

    def counted(feeds: Mapping[str, NDArray[np.int64]], shrink: bool = False) -> NDArray[np.float32]:
        shapes.append(feeds["input_ids"].shape)
        return run(feeds, shrink)

    encoder.narrow.run = counted  # type: ignore[method-assign]
    split = encoder(texts)
    assert len(shapes) == len(calls) and all(rows == 1 or rows * width <= 24 for rows, width in shapes)
    alone = np.concatenate([HareEncoder(built, 1)([t]) for t in texts])
    np.testing.assert_allclose(split, alone, atol=1e-5)  # in the texts' order, whatever the calls were


def test_hare_serve_over_http_answers_as_hare_in_process_and_is_stopped_after_the_run(
    st_model: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, bundle = st_model
    options = tiny(folder, bundle, tmp_path / "work", ("hare", "hare-http", "torch"))
    servers: list[ServerProcess] = []
    start = ServerProcess.start

    def kept(self: ServerProcess) -> ServerProcess:
        servers.append(self)
        return start(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ServerProcess, "start", kept)
        patch.setenv("HARE_API_KEY", "k3y")  # which the server inherits: every call was a 401
        _, rows = run_peers(options, Store(tmp_path / "bench.db"), say=lambda _: None)
    http = {r.key: r for r in rows}["hare-http"]
    assert not http.skipped and http.p50_ms[1] > 0 and http.sentences_s[1] > 0
    assert http.cosine_p1 > 0.999  # the server's vectors (base64 float32) are the bundle's
    assert len(servers) == 1 and servers[0].proc is not None and servers[0].proc.poll() is not None
    # A row of hare's own is not a peer: the goal compares hare against the others only.
    assert all(g["best_peer"] != "hare-http" for g in goal(rows, [1]))
