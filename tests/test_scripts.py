"""The measuring scripts the docs quote run against the code they measure: an interface they wrap (the
engine's backend, the batcher's model call) that changes under them fails here, not on the next device run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import ModelFactory, quick_bundle, unavailable
from tests.live_server import free_port
from tests.tiny_models import make_sentence_transformer

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stdout


def test_the_engine_transport_script_gets_calls_through_every_way() -> None:
    script = str(SCRIPTS / "engine-transport.py")
    # A short temporary folder of its own: a Unix socket's path has at most 107 bytes, and pytest's are long.
    with tempfile.TemporaryDirectory(prefix="t-", dir="/tmp") as folder:
        out = run(script, "--procs", "1", "--seconds", "0.5", "--rounds", "1", env={**os.environ, "TMPDIR": folder})
        left = os.listdir(folder)
    rows = re.findall(r"^\s+(token states|pooled by engine|pooled on device)\s+([\d,]+) calls/s.*?(\d+) us", out, re.M)
    assert [name for name, _, _ in rows] == ["token states", "pooled by engine", "pooled on device"], out
    assert all(int(calls.replace(",", "")) > 0 and int(us) > 0 for _, calls, us in rows), out
    assert not left, f"the engine's socket folders are left behind: {left}"


def test_the_request_cpu_script_takes_a_request_apart(fp32_bundle: ModelFactory) -> None:
    out = run(str(SCRIPTS / "request-cpu.py"), str(fp32_bundle("feature-extraction")), "a short text to embed")
    rows = dict(re.findall(r"^(\S.*?)\s{2,}(\d+)\s+\d+$", out, re.MULTILINE))
    layers = ["model call", "+ batcher", "+ pipeline", "+ app: POST /predict", "the same, model replayed"]
    assert all(layer in rows for layer in layers), out
    assert int(rows["+ app: POST /predict"]) >= int(rows["model call"]) > 0, out


def test_the_gpu_peers_script_runs_its_comparison_on_cpu(tiny_model: ModelFactory, tmp_path: Path) -> None:
    """scripts/gpu-peers.py is run on a lent GPU for minutes that cannot be spent on a broken script: its own CPU
    mode runs the same code (the served backend, the pooling, sentence-transformers' encode) on a tiny model."""
    folder = make_sentence_transformer(tmp_path / "model", tiny_model("feature-extraction"), pooling="mean")
    bundle = quick_bundle(folder, "feature-extraction", tmp_path / "bundle")
    out = run(str(SCRIPTS / "gpu-peers.py"), str(bundle), str(folder), "--device", "cpu", "--calls", "3")
    rows = re.findall(r"batch (\d+) x (\d+) tokens: hare ([\d,]+) texts/s .*min cosine ([\d.]+)", out)
    assert [(b, t) for b, t, _, _ in rows] == [("32", "128"), ("32", "16"), ("1", "128"), ("1", "16")], out
    # the bundle was built from the same folder: the same vectors, whichever ran them
    assert all(int(rate.replace(",", "")) > 0 and float(cosine) > 0.999 for _, _, rate, cosine in rows), out


def test_the_gpu_bulk_script_runs_its_comparison_on_cpu(tiny_model: ModelFactory, tmp_path: Path) -> None:
    """scripts/gpu-bulk.py, as gpu-peers.py: its CPU mode runs the model alone, `hare run` and
    sentence-transformers' encode over one small corpus."""
    folder = make_sentence_transformer(tmp_path / "model", tiny_model("feature-extraction"), pooling="mean")
    bundle = quick_bundle(folder, "feature-extraction", tmp_path / "bundle")
    out = run(str(SCRIPTS / "gpu-bulk.py"), str(bundle), str(folder), "--device", "cpu", "--rows", "60")
    alone = re.findall(r"model alone, (\d) thread\(s\): ([\d,]+) rows/s", out)
    runs = re.findall(r"hare run, (\d) model thread\(s\): its job ([\d,]+) rows/s", out)
    theirs = re.findall(
        r"sentence-transformers, batch (\d+): ([\d,]+) rows/s; hare run's cosine p1 to it ([\d.]+)", out
    )
    assert [s for s, _ in alone] == [s for s, _ in runs] == ["1", "2"], out
    assert [b for b, _, _ in theirs] == ["32", "128"], out
    assert all(int(r.replace(",", "")) > 0 for _, r in alone + runs), out
    assert all(float(p1) > 0.999 for _, _, p1 in theirs), out  # the same weights


def test_the_users_script_loads_workers_that_feed_the_shared_engine(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    """scripts/users-check is the device run's many-users step (scripts/gpu-check): here on CPU, two workers
    feeding the shared engine, loaded by wrk through the script's own request bodies; every answer a 2xx, and
    the engine's metrics show that the calls went through it."""
    if shutil.which("wrk") is None:
        unavailable("wrk is not installed (apt-get install wrk)")
    env = os.environ | {
        "HARE_ENGINE": "shared", "USERS": "8", "SEQ": "16", "DURATION": "1", "WRK_THREADS": "1",
        "HAREBENCH": "0", "PY": sys.executable, "OUT": str(tmp_path), "PORT": str(free_port()),
    }  # fmt: skip
    bundle = str(fp32_bundle("text-classification"))
    done = subprocess.run(
        [str(SCRIPTS / "users-check"), bundle, "2"], env=env, capture_output=True, text=True, timeout=180
    )
    out = done.stdout
    assert done.returncode == 0 and "did not get ready" not in out, out + done.stderr[-2000:]
    assert float(re.search(r"^Requests/sec:\s+([\d.]+)", out, re.MULTILINE)[1]) > 0, out  # type: ignore[index]
    assert "Non-2xx" not in out and "Socket errors" not in out, out
    calls = re.search(r"^hare_engine_batch_size_count ([\d.]+)", out, re.MULTILINE)
    assert calls is not None and float(calls[1]) > 0, out
