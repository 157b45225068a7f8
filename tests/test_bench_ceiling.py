"""The server's own cost in `hare bench`: CPU milliseconds per answer in every point's row, and the
tiny-classifier geometry whose model is too small to matter, so that a run with it measures the server."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.geometries import build
from bench.tables import POINT_COLUMNS, point_row, server_ms_per_request, server_own_ms_per_request
from hare.cli import main as hare
from tests.test_bench_store import point


def test_every_point_row_shows_the_servers_cpu_per_answer() -> None:
    measured = dataclasses.replace(point(1, 1, "hare", 8, 2000.0, 1.0), server_cpu=0.8)  # 0.8 cores at 2000/s
    row = dict(zip(POINT_COLUMNS, point_row(measured), strict=True))
    assert server_ms_per_request(measured) == pytest.approx(0.4)
    assert row["server ms/req"] == "0.400" and row["server cpu"] == "0.80"
    # With the cores hare's event loops spent on their own work (its /metrics), its own CPU per answer in brackets.
    own = dataclasses.replace(measured, extra={**measured.extra, "own_cores": 0.6})
    assert server_own_ms_per_request(own) == pytest.approx(0.3)
    assert dict(zip(POINT_COLUMNS, point_row(own), strict=True))["server ms/req"] == "0.400 (0.300)"
    unmeasured = point(1, 2, "vanilla", 8, 40.0, 25.0)  # a baseline the bench does not probe
    assert dict(zip(POINT_COLUMNS, point_row(unmeasured), strict=True))["server ms/req"] == "-"


def test_the_tiny_classifier_geometry_is_a_real_classifier_with_next_to_no_model(tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    folder = build("tiny-classifier", tmp_path / "tiny")
    config = json.loads((folder / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (32, 1)
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    assert model.config.id2label == {0: "NEGATIVE", 1: "POSITIVE"}
    assert sum(p.numel() for p in model.parameters()) < 1.1e6  # the BERT vocabulary's embeddings, and little else


def test_a_model_folder_the_command_did_not_write_is_left_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A folder holding another model (config.json and model.safetensors) was taken for one already built: its
    # tokenizer_config.json was rewritten (another tokenizer class, its name_or_path gone), exit 0.
    folder = tmp_path / "mine"
    folder.mkdir()
    files = {
        "config.json": '{"model_type": "roberta"}',
        "model.safetensors": "weights",
        "tokenizer_config.json": '{"tokenizer_class": "RobertaTokenizer", "name_or_path": "mine"}',
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    assert hare(["bench", "model", "tiny-classifier", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"{folder} holds a model `hare bench model` did not write, not a tiny-classifier model folder" in err
    assert {p.name: p.read_text() for p in folder.iterdir()} == files


def test_a_folder_the_command_wrote_is_reused_for_its_geometry_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = build("tiny-classifier", tmp_path / "tiny")
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert hare(["bench", "model", "tiny-classifier", str(folder)]) == 0  # kept: no weights written again
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.name != "tokenizer_config.json"} == {
        k: v for k, v in before.items() if k != "tokenizer_config.json"
    }
    capsys.readouterr()
    assert hare(["bench", "model", "distilbert-base", str(folder)]) == 2
    assert "holds the tiny-classifier geometry, not a distilbert-base model folder" in capsys.readouterr().err


def test_a_folder_that_cannot_be_written_is_refused_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `hare bench model tiny-classifier /proc/nope` (here: under a file) printed a bare "[Errno 2] No such file or
    # directory: '/proc/nope.partial'", a folder the user never named.
    (tmp_path / "a-file").write_text("")
    folder = tmp_path / "a-file" / "tiny"
    assert hare(["bench", "model", "tiny-classifier", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"hare bench: error: {folder} cannot be written (Not a directory); give a folder this user can write in\n"
    )
