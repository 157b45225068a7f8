"""`hare run` killed with SIGKILL in the middle, twice, and started again with the same command finishes with
every row exactly once: its output equals an uninterrupted run's, row by row."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from api.bulk import checkpoint
from api.bulk.job import BulkOptions, run_job
from api.config import Settings
from container.optimize import pipeline
from tests.conftest import ModelFactory, TorchWork, quick_bundle

ROWS, CHUNK = 3000, 50


def hare_run(bundle: Path, source: Path, out: Path) -> list[str]:
    files = ["-i", str(source), "-o", str(out)]
    return [
        sys.executable,
        "-m",
        "hare.cli",
        "run",
        str(bundle),
        *files,
        "--chunk-rows",
        str(CHUNK),
        "-q",
        "--max-chars",
        "2000",
    ]


def kill_after(command: list[str], folder: Path, parts: int) -> int:
    """Start `command` and SIGKILL it once `folder` holds `parts` more committed parts than now."""
    before = len(list(folder.glob("part-*"))) if folder.is_dir() else 0
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as process:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if folder.is_dir() and len(list(folder.glob("part-*"))) >= before + parts:
                break
            time.sleep(0.01)
        ended = process.poll() is not None
        os.kill(process.pid, signal.SIGKILL)
        _, err = process.communicate()
    assert not ended, f"the job ended before it could be killed: {err!r}"
    return len(list(folder.glob("part-*")))


def test_killed_twice_it_finishes_with_every_row_once(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("feature-extraction")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "light"]
    lines = [{"id": f"d{i}", "text": " ".join(rng.choice(words, rng.integers(1, 60)))} for i in range(ROWS)]
    lines[17]["text"] = ""  # a reject, whose chunk is redone or not: still one line in the rejects
    lines[2500]["text"] = "x" * 2001
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    out = tmp_path / "out.parquet"
    folder = tmp_path / "out.parquet.parts"
    command = hare_run(bundle, source, out)

    first = kill_after(command, folder, 3)
    assert not out.exists() and first >= 3
    second = kill_after(command, folder, 5)
    assert not out.exists() and second >= first + 5 and second < ROWS // CHUNK
    said = tmp_path / "summary.json"
    finished = subprocess.run([*command, "--summary", str(said)], capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert "done by an earlier run" in finished.stdout
    assert not folder.exists()
    # Its rejects are the whole job's, d17's from the first run among them, and so are their reasons' counts.
    summary = orjson.loads(said.read_bytes())
    assert summary["resumed"] and summary["rejected"] == sum(summary["reasons"].values()) == 2

    whole = tmp_path / "whole.parquet"
    settings = dataclasses.replace(Settings.from_env({}), bundle=bundle)
    run_job(settings, BulkOptions(source, whole, chunk_rows=CHUNK, max_chars=2000))
    resumed, uninterrupted = pq.read_table(out), pq.read_table(whole)
    assert resumed.column("id").to_pylist() == uninterrupted.column("id").to_pylist()
    assert len(resumed) == ROWS - 2 and len(set(resumed.column("id").to_pylist())) == ROWS - 2
    assert resumed.equals(uninterrupted)  # the same batches on the same one-thread sessions: the same bits
    rejects = (tmp_path / "out.rejects.jsonl").read_bytes().splitlines()
    assert [orjson.loads(r)["id"] for r in rejects] == ["d17", "d2500"]


def test_another_job_in_the_folder_is_refused(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("feature-extraction")
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"text": f"row {i}"}) + b"\n" for i in range(2000)))
    out = tmp_path / "out.parquet"
    kill_after(hare_run(bundle, source, out), tmp_path / "out.parquet.parts", 1)
    settings = dataclasses.replace(Settings.from_env({}), bundle=bundle)
    with pytest.raises(Exception, match="holds an unfinished job that differs from this one in its chunk_rows"):
        run_job(settings, BulkOptions(source, out, chunk_rows=CHUNK + 1, max_chars=2000))
    with pytest.raises(
        Exception, match="holds an unfinished job that differs from this one in its truncation_direction"
    ):
        run_job(settings, BulkOptions(source, out, chunk_rows=CHUNK, max_chars=2000, truncation_direction="left"))
    with pytest.raises(Exception, match="is the input or inside it"):
        run_job(settings, BulkOptions(source, tmp_path / "in.jsonl", chunk_rows=CHUNK, overwrite=True))


def test_a_bundle_rebuilt_in_place_is_not_resumed_into_the_same_output(
    fp32_bundle: ModelFactory, tmp_path: Path
) -> None:
    # Same path, task and variant, other weights: the job resumed, one output of two models' vectors, exit 0.
    bundle = tmp_path / "model"
    shutil.copytree(fp32_bundle("feature-extraction"), bundle)
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"text": f"row {i}"}) + b"\n" for i in range(2000)))
    out = tmp_path / "out.parquet"
    kill_after(hare_run(bundle, source, out), tmp_path / "out.parquet.parts", 1)
    shutil.rmtree(bundle)
    shutil.copytree(fp32_bundle("feature-extraction", "roberta"), bundle)
    settings = dataclasses.replace(Settings.from_env({}), bundle=bundle)
    with pytest.raises(Exception, match="holds an unfinished job that differs from this one in its model"):
        run_job(settings, BulkOptions(source, out, chunk_rows=CHUNK, max_chars=2000))


def test_a_second_job_on_the_same_output_is_refused_while_the_first_runs(
    fp32_bundle: ModelFactory, tmp_path: Path
) -> None:
    # Both once wrote the same parts and merged through the same temporary file: a corrupt output behind exit 0.
    # The first job here is one killed midway whose folder this process then holds, as a running job does.
    bundle = fp32_bundle("feature-extraction")
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"id": f"d{i}", "text": f"row {i}"}) + b"\n" for i in range(ROWS)))
    out, folder = tmp_path / "out.parquet", tmp_path / "out.parquet.parts"
    command = hare_run(bundle, source, out)
    kill_after(command, folder, 1)
    job = orjson.loads((folder / checkpoint.JOB_FILE).read_bytes())
    rejects = tmp_path / "out.rejects.jsonl"
    with checkpoint.open_folder(out, job, overwrite=False, rejects=rejects) as running:
        assert running.resumed
        second = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and "another hare run is writing" in second.stderr, second.stderr
        # Another output of the same stem shares its rejects file: the job that ended last replaced the other's.
        sibling = subprocess.run(hare_run(bundle, source, tmp_path / "out.jsonl"), capture_output=True, text=True)
        assert sibling.returncode == 2, sibling.stderr
        assert f"{rejects} is the rejects file of another hare run going on now" in sibling.stderr
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert pq.read_table(out).column("id").to_pylist() == [f"d{i}" for i in range(ROWS)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.parquet"]  # no lock, no folder left


@pytest.fixture(scope="module")
def openvino_bundle(tiny_model: ModelFactory, torch_work: TorchWork, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny embedding bundle that OpenVINO runs (bf16, the offer forced as tests/test_openvino.py does)."""
    pytest.importorskip("openvino")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "bf16_capable", lambda: True)
        out = tmp_path_factory.mktemp("openvino") / "bundle"
        return quick_bundle(tiny_model("feature-extraction"), "feature-extraction", out, ["bf16"], torch_work)


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_ctrl_c_stops_the_job_cleanly_and_the_same_command_finishes_it(
    runtime: str, fp32_bundle: ModelFactory, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # With its model threads left in OpenVINO's calls as the interpreter exited, the process aborted (SIGABRT,
    # "terminate called without an active exception").
    bundle = (
        fp32_bundle("feature-extraction") if runtime == "onnxruntime" else request.getfixturevalue("openvino_bundle")
    )
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"text": f"row {i} " * 30}) + b"\n" for i in range(ROWS)))
    out, folder = tmp_path / "out.parquet", tmp_path / "out.parquet.parts"
    command = hare_run(bundle, source, out)
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as process:
        deadline = time.monotonic() + 120
        while len(list(folder.glob("part-*"))) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "terminate" not in err, (process.returncode, err)
    assert "the same command resumes the job" in err  # it had left without a word
    assert not out.exists()
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0 and "done by an earlier run" in finished.stdout, finished.stderr
    assert pq.read_table(out).column("id").to_pylist() == list(range(ROWS))


def test_a_folder_changed_since_the_kill_is_another_input(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("feature-extraction")
    shards = tmp_path / "corpus"
    shards.mkdir()
    for k in range(4):  # four shards of 500 rows, killed in the first
        rows = [{"text": f"row {k * 500 + i} of shard {k}"} for i in range(500)]
        (shards / f"part-{k}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "out.parquet"
    command = hare_run(bundle, shards, out)
    kill_after(command, tmp_path / "out.parquet.parts", 1)
    (shards / "part-4.jsonl").write_text('{"text": "a shard added since"}\n')
    changed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert (
        changed.returncode == 2 and "holds an unfinished job that differs from this one in its input" in changed.stderr
    )
    (shards / "part-4.jsonl").unlink()
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert "done by an earlier run" in finished.stdout
    assert pq.read_table(out).column("id").to_pylist() == list(range(2000))
