"""The server's own cost in `hare bench`: CPU milliseconds per answer in every point's row, and the
tiny-classifier geometry whose model is too small to matter, so that a run with it measures the server."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.geometries import build
from bench.tables import POINT_COLUMNS, point_row, server_ms_per_request, server_own_ms_per_request
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
