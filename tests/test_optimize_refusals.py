"""What `hare optimize` and `hare tune` refuse, and what they leave: a folder `--force` must not delete, a second
build onto the same bundle, a checkpoint that lacks weights, flags no build can use, a stop by SIGTERM. Each
refusal is one sentence and exit 2, before the work it would waste where it can be."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from container.bundle import MANIFEST_FILE, PARITY_FILE, TOKENIZER_FILE, checked_bundle
from container.defaults import DEFAULT_BUNDLE
from container.optimize.cli import checked_gates, declared_gates, gate_flag
from container.optimize.pipeline import holding
from hare.cli import main
from tasks.base import Gate
from tasks.errors import InputError
from tasks.registry import TASKS
from tests.conftest import ModelFactory
from tests.live_server import free_port

QUICK = ["--tune-lengths", "8", "--tune-batches", "1", "--tune-seconds", "0.02", "--tune-budgets", "128"]


def run(*args: object) -> int:
    return main(["optimize", *map(str, args)])


def _copy(model: Path, dst: Path) -> Path:
    shutil.copytree(model, dst)
    return dst


def _drop_weights(folder: Path, *prefixes: str) -> None:
    weights = load_file(str(folder / "model.safetensors"))
    kept = {k: v for k, v in weights.items() if not k.startswith(prefixes)}
    assert len(kept) < len(weights), sorted(weights)
    save_file(kept, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("out", ["model", "projects", "."])
def test_force_never_deletes_the_model_or_the_current_folder(
    tiny_model: ModelFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    out: str,
) -> None:
    # `--out . --force` emptied the current folder, model and all; `--out models --force` deleted every model
    # in models/, and the model folder itself as --out had its weights replaced by the bundle's.
    project = tmp_path / "projects"
    model = _copy(tiny_model("text-classification"), project / "model")
    (project / "notes.txt").write_text("mine")
    monkeypatch.chdir(project)
    target = {"model": model, "projects": project, ".": Path(".")}[out]
    assert run(model, "--task", "text-classification", "--out", target, "--force", *QUICK) == 2
    assert "give the bundle a folder of its own" in capsys.readouterr().err
    assert (project / "notes.txt").read_text() == "mine" and (model / "model.safetensors").is_file()


def test_force_replaces_a_bundle_but_not_a_folder_of_other_files(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("user data")
    model = tiny_model("text-ranking")
    assert run(model, "--task", "text-ranking", "--out", mine, "--variants", "fp32", *QUICK) == 2
    assert "pass --force to replace it" in capsys.readouterr().err
    assert run(model, "--task", "text-ranking", "--out", mine, "--variants", "fp32", "--force", *QUICK) == 2
    assert "holds files but no bundle (hare.json); --force replaces a bundle only" in capsys.readouterr().err
    assert (mine / "keep.txt").read_text() == "user data"
    assert not list(tmp_path.glob(".mine*"))  # neither a build's folder nor its lock is left


def test_a_second_build_onto_a_bundle_being_built_is_refused_at_once(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two builds onto one --out both ran; the later replaced the earlier's bundle without --force.
    out = tmp_path / "bundle"
    with holding(out):  # what a running build holds
        assert run(tiny_model("text-classification"), "--task", "text-classification", "--out", out, *QUICK) == 2
    assert f"another hare optimize is building {out}" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []  # the lock goes with its holder


def test_a_killed_builds_folder_is_removed_by_the_next_build_not_by_one_refused_beside_a_running_one(
    tiny_model: ModelFactory, tmp_path: Path
) -> None:
    """kill -9 (or docker stop's SIGKILL of a container optimizing at start) leaves a build's folder beside its
    --out, a model's size each time; the next build of that --out removes it, once it holds the --out."""
    out, model = tmp_path / "bundle", tiny_model("text-classification")
    running = tmp_path / ".bundle.partial-running"
    (running / "bundle").mkdir(parents=True)
    with holding(out):  # a build that runs: its folder stays
        assert run(model, "--task", "text-classification", "--out", out, *QUICK) == 2
    assert running.is_dir()
    # That build was killed: its folder stays behind it, until the next build.
    assert run(model, "--task", "text-classification", "--out", out, "--variants", "fp32", *QUICK) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_a_checkpoint_that_lacks_weights_its_output_reads_is_refused(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # transformers filled a missing head with random values (the fp32 gate then failed, blaming the export)
    # and a missing LayerNorm bias with zeros (the bundle shipped).
    for dropped in (("classifier.",), ("bert.embeddings.LayerNorm.bias",)):
        folder = _copy(tiny_model("text-classification"), tmp_path / dropped[0])
        _drop_weights(folder, *dropped)
        out = tmp_path / f"{dropped[0]}bundle"
        assert run(folder, "--task", "text-classification", "--out", out, "--variants", "fp32", *QUICK) == 2
        said = capsys.readouterr().err
        assert "weights lack" in said and f"that its output reads ({dropped[0]}" in said, said
        assert not out.exists()


def test_a_missing_weight_the_output_does_not_read_is_let_go(tiny_model: ModelFactory, tmp_path: Path) -> None:
    """A checkpoint saved without the pooler, embedded by its token states: the pooler is never read."""
    folder = _copy(tiny_model("feature-extraction"), tmp_path / "model")
    _drop_weights(folder, "pooler.")
    out = tmp_path / "bundle"
    assert run(folder, "--task", "feature-extraction", "--out", out, "--variants", "fp32", *QUICK) == 0


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--tune-lengths", "0"], "expected comma-separated whole numbers of at least 1, got '0'"),
        (["--tune-batches", ","], "expected comma-separated whole numbers of at least 1, got ','"),
        (["--tune-streams", "-1"], "expected 0 or more, got -1"),
        (["--tune-threads", "0"], "expected at least 1, got 0"),
        (["--tune-seconds", "nan"], "expected a finite number, got 'nan'"),
        (["--min-top1", "nan"], "expected a finite number, got 'nan'"),
    ],
)
def test_a_flag_no_build_can_use_is_a_usage_error_before_any_work(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    # Each failed only after the export, most with a traceback (ZeroDivisionError, IndexError, OverflowError), or
    # judged every variant against nan.
    with pytest.raises(SystemExit) as exit_:
        run(tiny_model("text-classification"), "--task", "text-classification", "--out", tmp_path / "b", *flags)
    assert exit_.value.code == 2 and said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--min-spearman", "0.5"], "--min-spearman is a gate of text-ranking, not of text-classification"),
        (["--variants", ""], "--variants '' names no variant"),
        (["--validation-file", "{tmp}"], "is a folder; give a file of texts"),
        (["--validation-file", "{tmp}/none.txt"], "none.txt does not exist"),
        (["--validation-file", "{tmp}-bad.jsonl"], "-bad.jsonl:2: not valid JSON"),  # read after the export
    ],
)
def test_an_input_the_build_would_ignore_or_fail_on_late_is_refused_first(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    # A gate of another task was ignored; an empty --variants (an unset variable) built every variant; a
    # validation file that is not one was said after the export.
    Path(f"{tmp_path}-bad.jsonl").write_text('{"text": "a fine day"}\n{"text": "a bad one\n')
    args = [a.format(tmp=tmp_path) for a in flags]
    assert run(tiny_model("text-classification"), "--task", "text-classification", "--out", tmp_path / "b", *args) == 2
    err = capsys.readouterr().err
    assert said in err and "export" not in err  # before the build's first stage
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "row",
    [
        {"query": "what is a cat", "documents": "a cat is an animal"},  # read as one document a character
        {"query": "q", "documents": [{"text": "a"}]},  # read as the text "{'text': 'a'}"
        {"query": 5, "documents": ["a"]},  # a traceback, with a hint about the model's max length
    ],
)
def test_a_ranking_validation_row_that_is_not_texts_is_refused_by_its_line(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], row: dict[str, object]
) -> None:
    texts = tmp_path / "set.jsonl"
    texts.write_text(json.dumps({"query": "a", "documents": ["b", "c"]}) + "\n" + json.dumps(row) + "\n")
    args = ["--task", "text-ranking", "--out", tmp_path / "b", "--validation-file", texts, "--variants", "fp32"]
    assert run(tiny_model("text-ranking"), *args, *QUICK) == 2
    assert f"{texts}:2: expected a text as query and a text as document or a list of texts" in capsys.readouterr().err


def test_sigterm_stops_a_build_and_removes_its_folder(tiny_model: ModelFactory, tmp_path: Path) -> None:
    # docker stop, Kubernetes and timeout send SIGTERM: the build's folder of intermediate graphs (gigabytes for
    # a real model) was left behind, where SIGINT removed it.
    out = tmp_path / "bundle"
    # Timing seconds long after the export's first file, so that the signal lands in the build however late a
    # loaded machine lets this test see that file: at QUICK's 0.02 s a build under CI's load once finished (rc 0).
    slow = ["--tune-lengths", "8", "--tune-batches", "1", "--tune-seconds", "5", "--tune-budgets", "128"]
    args = [tiny_model("text-classification"), "--task", "text-classification", "--out", out, *slow]
    command = [sys.executable, "-m", "hare.cli", "optimize", *map(str, args)]
    log = tmp_path.parent / f"{tmp_path.name}.log"  # a file, not a pipe nobody reads until the end
    with log.open("w") as stderr, subprocess.Popen(command, stderr=stderr) as build:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".bundle.partial-*/*")):  # started: its folder holds a first file
            assert build.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        build.send_signal(signal.SIGTERM)
        assert build.wait(120) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
    said = log.read_text()
    assert f"hare optimize: stopped; {out} is as it was" in " ".join(said.split())  # it left without a word


def test_tune_check_on_a_damaged_bundle_is_one_sentence(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _copy(tiny_bundle("text-classification"), tmp_path / "bundle")
    parity = (bundle / PARITY_FILE).read_bytes()
    (bundle / PARITY_FILE).write_bytes(parity[: len(parity) // 2])  # cut short: zipfile's BadZipFile came out
    assert main(["tune", str(bundle), "--check"]) == 2
    assert f"{bundle / PARITY_FILE} is damaged" in capsys.readouterr().err
    (bundle / PARITY_FILE).write_bytes(parity)
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    manifest["variant"] = "int8-unknown"  # a StopIteration came out
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert main(["tune", str(bundle), "--check"]) == 2
    assert "ships variant 'int8-unknown' but records no gates for it" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [["--dry-run"], ["--check"], []])
@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ({TOKENIZER_FILE: "{not json"}, "tokenizer.json is unreadable"),
        ({MANIFEST_FILE: {"task": "summarize"}}, "serves task 'summarize', which this hare does not know"),
    ],
)
def test_tune_refuses_a_bundle_that_serve_and_run_refuse_in_their_words(
    tiny_bundle: ModelFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mode: list[str],
    damage: dict[str, Any],
    said: str,
) -> None:
    # A tokenizer.json that is no JSON came out of --dry-run as tokenizers' bare Exception; an unknown task came
    # out of --check as a KeyError, and a plain `hare tune` measured the bundle and rewrote its hare.json.
    bundle = _copy(tiny_bundle("feature-extraction"), tmp_path / "bundle")
    for name, content in damage.items():
        if isinstance(content, dict):
            content = json.dumps(json.loads((bundle / name).read_text()) | content)
        (bundle / name).write_text(content)
    manifest = (bundle / MANIFEST_FILE).read_bytes()
    with pytest.raises(InputError, match=said) as refused:  # as `hare serve` and `hare run` open a bundle
        checked_bundle(bundle)
    capsys.readouterr()  # the fixture's build
    assert main(["tune", str(bundle), *mode, "--seconds", "0.02", "--streams", "1"]) == 2
    assert capsys.readouterr().err.strip() == f"hare tune: error: {refused.value.message}"
    assert (bundle / MANIFEST_FILE).read_bytes() == manifest


def test_budgets_and_timed_batches_over_this_machines_memory_are_refused_before_any_work(
    tiny_model: ModelFactory,
    tiny_bundle: ModelFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `hare tune --budgets 100000000 --dry-run` grew to 22 GB and was killed; `hare optimize --tune-batches
    # 200000` failed after the export with ONNX Runtime's "Failed to allocate memory".
    from container.onnx_wire import hidden_width
    from container.optimize import autotune, pipeline

    model = tiny_model("feature-extraction")
    hidden = json.loads((model / "config.json").read_text())["hidden_size"]
    bundle = tiny_bundle("feature-extraction")
    assert hidden_width(bundle / "model.onnx") == hidden  # read from the graph's weights: a bundle has no config

    def never(*_: object, **__: object) -> None:
        raise AssertionError("worked on a call that cannot fit")

    monkeypatch.setattr(autotune, "available_bytes", lambda: 2**30)  # 1 GiB available, never the real memory
    monkeypatch.setattr(autotune, "token_rates", never)
    monkeypatch.setattr(pipeline, "_compose", never)  # the export and everything after it
    fitting = int(autotune.MEMORY_SHARE * 2**30) // (2 * hidden * autotune.HIDDEN_BYTES)  # two streams
    capsys.readouterr()  # the fixtures' builds
    assert main(["tune", str(bundle), "--budgets", "128,100000000", "--dry-run", "--streams", "2"]) == 2
    said = capsys.readouterr().err
    assert "100,000,000 padded tokens does not fit in this machine's memory" in said
    assert f"name budgets of 128 to {fitting:,}" in said
    out = tmp_path / "bundle"
    args = [model, "--task", "feature-extraction", "--out", out, "--variants", "fp32", "--tune-streams", "2"]
    assert run(*args, "--tune-budgets", "100000000") == 2
    assert f"name budgets of 128 to {fitting:,}" in capsys.readouterr().err
    assert run(*args, "--tune-batches", "1,200000", "--tune-lengths", "8,64") == 2
    one_call = int(autotune.MEMORY_SHARE * 2**30) // (hidden * autotune.HIDDEN_BYTES)  # autotune: one at a time
    said = " ".join(capsys.readouterr().err.split())
    assert "--tune-batches 200,000 of 64-token sequences (the longest of --tune-lengths the model reads)" in said
    assert "is a call of 12,800,000 padded tokens" in said and f"batches up to {one_call // 64:,} at that" in said
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("command", "flag", "why"),
    [
        ("tune", "--streams", "its thread's CPU time"),
        ("optimize", "--tune-streams", "its thread's CPU time"),
        ("optimize", "--tune-threads", "only wait for each other"),
    ],
)
def test_timing_with_more_calls_or_threads_than_cores_is_refused_before_any_work(
    tiny_model: ModelFactory,
    tiny_bundle: ModelFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    flag: str,
    why: str,
) -> None:
    # `--tune-streams 500` on 2 cores recorded 173,620,680 tokens/s in hare.json (a thread's CPU time does not
    # count its wait for a core); `--tune-threads 1000` was accepted.
    from container.machine import usable_cpus
    from container.optimize import autotune, pipeline

    def never(*_: object, **__: object) -> None:
        raise AssertionError("timed more calls or threads than cores")

    if command == "tune":  # built before the build's stages are taken away
        target = [str(tiny_bundle("feature-extraction")), "--dry-run"]
    else:
        target = [str(tiny_model("feature-extraction")), "--task", "feature-extraction", "--out", str(tmp_path / "b")]
    monkeypatch.setattr(autotune, "token_rates", never)
    monkeypatch.setattr(pipeline, "_compose", never)  # the export and everything after it
    capsys.readouterr()  # the fixtures' builds
    cpus = usable_cpus()
    assert main([command, *target, flag, str(cpus + 1)]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"{flag} {cpus + 1} is more than the {cpus} CPUs this process may use" in said
    assert why in said and said.endswith(f"give at most {cpus}")
    assert list(tmp_path.iterdir()) == []


def _outside(gate: Gate) -> list[float]:
    """Thresholds just outside the values the gate's metric takes."""
    low, high = gate.bounds
    return [low - 0.5, *([high + 1] if math.isfinite(high) else [])]


@pytest.mark.parametrize(
    ("task", "gate", "value"),
    [
        (TASKS[name].name if name in TASKS else "text-classification", gate, value)
        for name, gate in declared_gates()
        for value in _outside(gate)
    ],
)
def test_a_gate_threshold_its_metric_never_takes_is_refused_before_any_work(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    task: str,
    gate: Gate,
    value: float,
) -> None:
    # `--min-top1 2` and `--max-score-diff -1` ran the whole build before "no variant passed the parity gates".
    from container.optimize import pipeline

    def never(*_: object, **__: object) -> None:
        raise AssertionError("built against a gate no variant can meet")

    model = tmp_path / "model"  # refused before the folder is read
    model.mkdir()
    monkeypatch.setattr(pipeline, "optimize", never)
    assert run(model, "--task", task, "--out", tmp_path / "b", gate_flag(gate), value) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"{gate_flag(gate)} {value:g} is outside the values {gate.metric} takes" in said
    low, high = gate.bounds
    assert said.endswith(f"give a threshold from {low:g} to {high:g}" if math.isfinite(high) else f"of {low:g} or more")


def test_a_gate_threshold_at_the_ends_of_its_metrics_values_is_taken() -> None:
    for name, gate in declared_gates():
        task = name if name in TASKS else "text-classification"
        for end in gate.bounds:
            if math.isfinite(end):
                checked_gates({gate.metric: end}, task)  # exact, or anything: a user's choice, not a mistake


def test_a_roberta_config_with_a_null_pad_id_is_read(tiny_model: ModelFactory, tmp_path: Path) -> None:
    from container.optimize.source import inspect_source
    from tasks.registry import get_task

    folder = _copy(tiny_model("text-classification", "roberta"), tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    positions = config["max_position_embeddings"]
    (folder / "config.json").write_text(json.dumps(config | {"pad_token_id": None}))  # a TypeError came out
    source = inspect_source(folder, get_task("text-classification"), False, False)
    assert source.max_length <= positions - 2  # RoBERTa's positions start after padding_idx 1


@pytest.mark.slow  # the real default model's build, stopped once it has begun
def test_sigterm_stops_serves_default_build_and_removes_its_folder(tmp_path: Path) -> None:
    # `hare serve` with no bundle builds the default one first; a SIGTERM then killed it outright, its working
    # folder and lock left beside the bundle.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARE_")}
    command = [sys.executable, "-m", "hare.cli", "serve", "--port", str(free_port())]
    log, bundles = tmp_path.parent / f"{tmp_path.name}.log", tmp_path / DEFAULT_BUNDLE.parent
    with log.open("w") as stderr, subprocess.Popen(command, stderr=stderr, cwd=tmp_path, env=env) as serving:
        deadline = time.monotonic() + 120
        while not list(bundles.glob(f".{DEFAULT_BUNDLE.name}.partial-*/*")):  # begun: a first file written
            assert serving.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        serving.send_signal(signal.SIGTERM)
        assert serving.wait(120) == 128 + signal.SIGTERM
    assert list(bundles.iterdir()) == []
    assert "hare serve: stopped;" in log.read_text()
