"""`hare tune` as a user runs it on a bundle built elsewhere: the budget measured here, written or printed."""

from __future__ import annotations

import errno
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from container.bundle import read_manifest
from container.machine import describe
from container.optimize import autotune
from hare.cli import main
from tests.conftest import ModelFactory

# Decided by this machine's clock (a race, a pace, a deadline): scripts/check runs these alone, after the rest.
pytestmark = pytest.mark.serial

QUICK = ["--seconds", "0.02", "--streams", "2"]


@pytest.fixture
def elsewhere(tiny_bundle: ModelFactory, tmp_path: Path) -> Path:
    """A CPU bundle whose budget was measured on another machine."""
    bundle = shutil.copytree(tiny_bundle("feature-extraction"), tmp_path / "bundle")
    manifest = json.loads((bundle / "hare.json").read_text())
    other = {"cpu": "Another CPU", "physical_cores": 64, "streams": 64}
    (bundle / "hare.json").write_text(json.dumps(manifest | {"max_batch_tokens": 8192, "budget_machine": other}))
    return bundle


def test_tune_measures_the_budget_here_and_keeps_the_rest_of_the_bundle(elsewhere: Path) -> None:
    before = read_manifest(elsewhere)
    assert main(["tune", str(elsewhere), *QUICK]) == 0
    after = read_manifest(elsewhere)
    rates = {int(budget): rate for budget, rate in after.token_rates.items()}
    assert list(rates) == list(autotune.BUDGETS[: len(rates)]) and min(rates.values()) > 0
    assert after.max_batch_tokens == autotune.batch_budget(rates)
    assert after.budget_machine["cpu"] == describe()["cpu"] and after.budget_machine["streams"] == 2
    assert (after.variant, after.variants, after.machine, after.labels) == (
        before.variant,
        before.variants,
        before.machine,
        before.labels,
    )


def test_a_dry_run_prints_the_setting_and_leaves_the_bundle_alone(
    elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = (elsewhere / "hare.json").read_bytes()
    assert main(["tune", str(elsewhere), "--dry-run", *QUICK]) == 0
    captured = capsys.readouterr()
    line = captured.out.strip().splitlines()[-1]
    assert line.startswith("HARE_MAX_BATCH_TOKENS=") and int(line.split("=")[1]) in autotune.BUDGETS
    assert (elsewhere / "hare.json").read_bytes() == manifest
    # Each budget is said as the climb reaches it, the smallest first, before its calls are timed.
    climbed = [int(m[1]) for m in re.finditer(r"^batch budget: (\d+) tokens$", captured.err, re.MULTILINE)]
    assert climbed[:2] == list(autotune.BUDGETS[:2]), captured.err


def test_a_read_only_bundle_gets_the_setting_to_use_instead(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def read_only(*_: object) -> None:  # an image's /bundle on a read-only root filesystem
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("container.optimize.tune.os.replace", read_only)
    assert main(["tune", str(elsewhere), *QUICK]) == 2
    err = capsys.readouterr().err
    assert "Read-only file system" in err and "set HARE_MAX_BATCH_TOKENS=" in err
    assert read_manifest(elsewhere).max_batch_tokens == 8192
    assert [p.name for p in elsewhere.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


def test_a_bundle_on_a_read_only_mount_is_refused_before_the_measurement(
    elsewhere: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It measured for minutes, then failed with "[Errno 30] Read-only file system: '.hare.json.PID'" (its
    # temporary's removal failed too, over the sentence saying what to do).
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    if subprocess.run(["mount", "--bind", "-o", "ro", str(elsewhere), str(mounted)], capture_output=True).returncode:
        pytest.skip("no bind mount here (root and mount(8) are needed)")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mounted)], check=True)  # older mounts ignore ro above
        assert main(["tune", str(mounted), *QUICK]) == 2
        captured = capsys.readouterr()
        assert "the bundle's folder is read-only to this user): pass --dry-run" in captured.err
        assert "batch budget:" not in captured.err  # refused before any measurement
        assert main(["tune", str(mounted), "--dry-run", *QUICK]) == 0
        assert capsys.readouterr().out.strip().splitlines()[-1].startswith("HARE_MAX_BATCH_TOKENS=")
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stopped_tune_says_the_bundle_is_as_it_was(elsewhere: Path, stop: signal.Signals) -> None:
    # It left with exit 130 or 143 and not a word, where optimize and run say what they kept.
    before = (elsewhere / "hare.json").read_bytes()
    command = [sys.executable, "-m", "hare.cli", "tune", str(elsewhere), "--seconds", "30", "--streams", "1"]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as tune:
        assert tune.stderr is not None
        while "batch budget:" not in tune.stderr.readline():  # measuring
            assert tune.poll() is None
        tune.send_signal(stop)
        err = tune.stderr.read()
    assert tune.returncode == 128 + stop
    assert f"hare tune: stopped; {elsewhere / 'hare.json'} is as it was" in " ".join(err.split())
    assert (elsewhere / "hare.json").read_bytes() == before
    assert sorted(p.name for p in elsewhere.iterdir() if p.name.startswith(".")) == []


def test_tune_tries_only_the_budgets_named(elsewhere: Path) -> None:
    assert main(["tune", str(elsewhere), *QUICK, "--budgets", "256,128"]) == 0
    assert sorted(int(budget) for budget in read_manifest(elsewhere).token_rates) == [128, 256]


def test_a_gpu_bundle_is_refused_with_what_it_batches_to(elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = json.loads((elsewhere / "hare.json").read_text())
    (elsewhere / "hare.json").write_text(json.dumps(manifest | {"target": "gpu"}))
    assert main(["tune", str(elsewhere), *QUICK]) == 2
    assert "measured for CPU bundles" in capsys.readouterr().err


def test_check_runs_the_shipped_gates_on_this_cpu(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bundle carries its validation set and PyTorch's answers: the gates run again without torch."""
    bundle = shutil.copytree(tiny_bundle("text-classification"), tmp_path / "bundle")
    assert main(["tune", str(bundle), "--check"]) == 0
    captured = capsys.readouterr()
    assert "passes its gates on this CPU" in captured.out
    manifest = read_manifest(bundle)  # fp32 or int8, as autotune picked on this machine: its own gates
    shipped = next(v for v in manifest.variants if v["name"] == manifest.variant)
    assert shipped["gates"] and all(gate in captured.err for gate in shipped["gates"])


def test_check_fails_where_the_graph_misses_a_gate_and_says_what_to_do(
    fp32_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As an int8 graph whose error on this CPU's kernels is over its gate: here the stored answers are moved
    instead of the graph's, which the check cannot tell apart (fp32's max_abs_diff sees a shift of every
    logit; int8's score gates would not, softmax being blind to it)."""
    import numpy as np

    bundle = shutil.copytree(fp32_bundle("text-classification"), tmp_path / "bundle")
    with np.load(bundle / "parity.npz") as stored:
        arrays = {k: stored[k] + (1.0 if k.startswith("ref_") else 0) for k in stored.files}
    np.savez(bundle / "parity.npz", **arrays)  # type: ignore[arg-type]
    assert main(["tune", str(bundle), "--check"]) == 1
    err = " ".join(capsys.readouterr().err.split())  # the console wraps its lines
    assert "fails max_abs_diff" in err and "rebuild it here" in err


def test_check_of_a_bundle_without_its_validation_set_says_to_rebuild(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = shutil.copytree(tiny_bundle("feature-extraction"), tmp_path / "bundle")
    (bundle / "parity.npz").unlink()
    assert main(["tune", str(bundle), "--check"]) == 2
    assert "rebuild it" in " ".join(capsys.readouterr().err.split())
