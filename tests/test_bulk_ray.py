"""The bundle as a Ray Data stage on a local Ray cluster of two node processes (ray.cluster_utils.Cluster, as
Ray's own tests make one): the stage's answers in Ray are its answers in process, and with one actor's process
killed (SIGKILL) in the middle of the job, every row still comes out exactly once."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray  # the dev extra's (ray[data]): a missing ray fails here rather than skip

from tasks.errors import InputError
from tests.conftest import ModelFactory

# Ray warns of its own deprecated settings as it starts a job, and of a small dataset's few blocks.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray"),
    pytest.mark.filterwarnings("ignore::UserWarning:ray"),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    # Two CPUs a node: the two actors and Ray Data's read and write tasks must fit beside each other.
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    nodes.add_node(num_cpus=2)
    ray.init(address=nodes.address, log_to_driver=False)
    try:
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()  # type: ignore[no-untyped-call]


def stage_pids() -> list[int]:
    """The processes of this machine running a HareStage actor (Ray names them in their command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"HareStage" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_stage_keeps_every_row_when_an_actor_dies(cluster: Any, fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    from api.bulk.ray import HareStage

    bundle = fp32_bundle("feature-extraction")
    rng = np.random.default_rng(0)
    words = np.array(["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "light"])
    n = 20_000
    rows = [" ".join(rng.choice(words, rng.integers(5, 60))) for _ in range(n)]
    rows[7] = ""  # rejected, and kept with its reason
    pq.write_table(pa.table({"id": list(range(n)), "text": rows}), tmp_path / "in.parquet", row_group_size=200)
    out = tmp_path / "out"
    dataset = ray.data.read_parquet(str(tmp_path / "in.parquet")).map_batches(
        HareStage,
        fn_constructor_kwargs={"bundle": str(bundle)},
        batch_format="pyarrow",
        batch_size=100,
        num_cpus=1,
        compute=ray.data.ActorPoolStrategy(size=2),
    )
    job = threading.Thread(target=lambda: dataset.write_parquet(str(out)))
    job.start()
    deadline = time.monotonic() + 120
    while len(stage_pids()) < 2 and time.monotonic() < deadline and job.is_alive():
        time.sleep(0.1)
    time.sleep(3)  # both actors at work
    victims = stage_pids()
    assert job.is_alive() and victims, "the job ended (or never started its actors) before one could be killed"
    os.kill(victims[0], signal.SIGKILL)
    job.join(300)
    assert not job.is_alive()
    table = pq.read_table(out)
    ids = table.column("id").to_pylist()
    assert sorted(ids) == list(range(n))  # every row once: none lost, none twice
    errors = dict(zip(ids, table.column("error").to_pylist(), strict=True))
    assert errors[7] == "its text is an empty string" and sum(e is not None for e in errors.values()) == 1
    assert victims[0] not in stage_pids()


def test_the_stage_answers_as_predict(cluster: Any, fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    from api.bulk.ray import HareStage

    bundle = fp32_bundle("feature-extraction")
    texts = [f"row {i} of the river stone" for i in range(50)]
    stage = HareStage(str(bundle), {"encoding_format": "int8"})
    local = stage(pa.table({"id": list(range(50)), "text": texts}))
    kwargs = {"bundle": str(bundle), "parameters": {"encoding_format": "int8"}}
    dataset = ray.data.from_arrow(pa.table({"id": list(range(50)), "text": texts})).map_batches(
        HareStage, fn_constructor_kwargs=kwargs, batch_format="pyarrow", batch_size=16, num_cpus=1,
        compute=ray.data.ActorPoolStrategy(size=2),
    )  # fmt: skip
    result = dataset.to_arrow_refs()
    remote = pa.concat_tables(ray.get(result)).sort_by("id")
    assert remote.column("id").to_pylist() == list(range(50))
    assert remote.column("embeddings").to_pylist() == local.column("embeddings").to_pylist()
    assert remote.schema.field("embeddings").type.value_type == pa.int8()


def test_every_batch_has_the_answers_columns_even_when_all_its_rows_are_rejected(fp32_bundle: ModelFactory) -> None:
    # A batch of only rejected rows had no answer column: a reader taking the schema of the output's first file
    # (pyarrow's dataset, pandas.read_parquet on the folder) dropped every other file's answers.
    from api.bulk.ray import HareStage

    stage = HareStage(str(fp32_bundle("text-classification")))
    answered = stage(pa.table({"id": [1, 2], "text": ["a fine day", "a bad one"]}))
    rejected = stage(pa.table({"id": [3, 4], "text": ["", None]}))
    mixed = stage(pa.table({"id": [5, 6], "text": ["", "a day"]}))
    assert rejected.schema == answered.schema == mixed.schema
    assert answered.column_names == ["id", "labels", "truncated", "error"]
    assert rejected.column("labels").null_count == 2 and None not in rejected.column("error").to_pylist()
    assert [r["error"] is None for r in mixed.sort_by("id").to_pylist()] == [False, True]


def test_hare_run_on_ray_writes_every_row(
    cluster: Any, fp32_bundle: ModelFactory, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from hare.cli import main as hare

    texts = [f"row {i} by the old river" for i in range(300)] + [""]
    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},{t}\n" for i, t in enumerate(texts)))
    args = ["run", str(fp32_bundle("feature-extraction")), "-i", str(tmp_path / "in.csv"), "-o", str(tmp_path / "out")]
    assert hare([*args, "--ray", cluster.address, "--chunk-rows", "64"]) == 0
    assert "301 rows" in capfd.readouterr().out
    table = pq.read_table(tmp_path / "out")
    assert sorted(table.column("id").to_pylist()) == sorted(f"r{i}" for i in range(301))
    assert table.column("error").to_pylist().count("its text is an empty string") == 1
    # The one file in blocks of --chunk-rows rows, each written as its own file: Ray Data read a file as one
    # block, which one actor ran while the others idled (and wrote one file).
    assert len(list((tmp_path / "out").glob("*.parquet"))) >= 3
    # -q: the summary alone. Ray Data's plan, its datasets' starts and its progress bars came out all the same.
    assert hare([*args, "--ray", cluster.address, "--overwrite", "-q"]) == 0
    out, err = capfd.readouterr()
    assert "301 rows" in out and "Dataset" not in out + err and "Running" not in out + err, err


def test_csv_ids_stay_text_a_bad_row_is_a_reject_and_a_node_without_the_bundle_is_said_in_one_sentence(
    cluster: Any, fp32_bundle: ModelFactory, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from api.bulk.ray import run_on_ray
    from api.bulk.reader import Columns
    from hare.cli import main as hare

    # Ray Data's CSV reader guessed types: ids 007, 010 and 1e3 came out as the numbers 7.0, 10.0 and 1000.0.
    (tmp_path / "in.csv").write_text("id,text\n007,a text\n010,another\n1e3,a third\n")
    bundle = str(fp32_bundle("feature-extraction"))
    args = ["run", bundle, "-i", str(tmp_path / "in.csv"), "-o", str(tmp_path / "out"), "--ray", cluster.address]
    assert hare(args) == 0
    assert sorted(pq.read_table(tmp_path / "out").column("id").to_pylist()) == ["007", "010", "1e3"]
    capfd.readouterr()
    # A row with a field too many, and a value that is not UTF-8, are rejects, as on one machine: Ray Data's
    # reader failed the job on either (238 lines of tracebacks; then a sentence that said "fields" of both).
    (tmp_path / "bad.csv").write_bytes(b"id,text\nr1,a text\nr2,two,fields\nr3,caf\xe9\n")
    args = ["run", bundle, "-i", str(tmp_path / "bad.csv"), "-o", str(tmp_path / "bad"), "--ray", cluster.address]
    assert hare(args) == 0
    table = pq.read_table(tmp_path / "bad")
    rows = zip(table.column("id").to_pylist(), table.column("error").to_pylist(), strict=True)
    assert sorted(rows, key=repr) == [
        ("r1", None),
        ("r3", "its text is not valid UTF-8 (byte 3)"),
        (None, "row 3 of bad.csv (the header is row 1) has 3 fields, the header 2"),
    ]
    # A node that has no bundle at the path: its actors' error, said as such (it read "build one with hare
    # optimize" inside Ray's traceback text).
    stage = {"format": "csv", "pairs": False, "parameters": {}, "columns": Columns(id="id")}
    with pytest.raises(InputError, match=r"on the Ray node .*: .*does not exist.*every node reads the bundle"):
        run_on_ray(cluster.address, tmp_path / "gone", [tmp_path / "in.csv"], tmp_path / "o2", stage, 64, quiet=True)


def test_a_second_job_on_the_same_output_is_refused_while_the_first_runs(
    cluster: Any, fp32_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Both ran, and the second replaced the first's output (and removed its partial folder as it began).
    import fcntl

    from hare.cli import main as hare

    (tmp_path / "in.csv").write_text("id,text\nr1,a text\n")
    held = (tmp_path / ".out.ray-lock").open("w")  # the first job's lock
    fcntl.flock(held, fcntl.LOCK_EX)
    args = ["run", str(fp32_bundle("feature-extraction")), "-i", str(tmp_path / "in.csv"), "-o", str(tmp_path / "out")]
    assert hare([*args, "--ray", cluster.address]) == 2
    assert "another hare run --ray is writing" in capsys.readouterr().err and not (tmp_path / "out").exists()
    held.close()
    assert hare([*args, "--ray", cluster.address]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out"]  # the lock goes with the job


def test_a_rerun_is_refused_or_replaces_and_a_killed_runs_files_are_not_kept(
    cluster: Any, fp32_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each rerun wrote every row again beside the last run's (3,000 rows, then 6,000, then 9,000 with
    # --overwrite), and a driver killed mid-write left a half file that a rerun kept.
    from hare.cli import main as hare

    (tmp_path / "in.csv").write_text("id,text\n" + "".join(f"r{i},row {i} by the river\n" for i in range(120)))
    out = tmp_path / "out"
    args = ["run", str(fp32_bundle("feature-extraction")), "-i", str(tmp_path / "in.csv"), "-o", str(out)]
    killed = tmp_path / ".out.ray-partial"
    killed.mkdir()
    (killed / "half.parquet").write_bytes(b"PAR1 cut short")
    assert hare([*args, "--ray", cluster.address]) == 0
    assert hare([*args, "--ray", cluster.address]) == 2
    assert f"the output {out} exists; pass --overwrite to replace it" in capsys.readouterr().err
    assert hare([*args, "--ray", cluster.address, "--overwrite"]) == 0
    assert "120 rows" in capsys.readouterr().out
    ids = pq.read_table(out).column("id").to_pylist()
    assert sorted(ids) == sorted(f"r{i}" for i in range(120))  # every row once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out"]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["-p", "foo=1"], "foo"),  # 152 lines of Ray's tracebacks, after the cluster had started on it
        (["--id-column", "key"], "key"),
        (["-o", "{tmp}/in.csv"], "is the input"),
        (["-o", "{tmp}/file.txt"], "is a file; on Ray it is a folder of Parquet files"),
        (["--output-format", "jsonl"], "--output-format: not with --ray"),  # Parquet was written anyway
        (["--streams", "2"], "--streams: not with --ray"),
        (["--ray", "not an address"], "--ray takes the head's HOST:PORT"),
        (["--ray", "127.0.0.1:{port}"], "nothing answers at --ray 127.0.0.1"),  # 14 minutes before it said so
    ],
)
def test_what_the_cluster_would_refuse_is_refused_first_in_one_sentence(
    fp32_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], said: str
) -> None:
    import socket

    from hare.cli import main as hare

    with socket.socket() as s:  # a port just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "in.csv").write_text("id,text\nr1,a text\n")
    (tmp_path / "file.txt").write_text("mine")
    args = ["run", str(fp32_bundle("feature-extraction")), "-i", str(tmp_path / "in.csv"), "-o", str(tmp_path / "o")]
    args += ["--ray", f"127.0.0.1:{port}", *(a.format(tmp=tmp_path, port=port) for a in extra)]
    assert hare(args) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and (tmp_path / "file.txt").read_text() == "mine"


def test_a_jsonl_with_odd_rows_keeps_them_with_their_reason(
    cluster: Any, fp32_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ray Data's JSON reader guessed one type a column: a number among the texts, ids as ints then strings or a
    # line that is not JSON stopped the whole job with 286 lines of tracebacks. hare run keeps them as rejects.
    import json

    lines = [json.dumps({"id": i, "text": f"row {i} by the river"}) for i in range(40)]
    lines += [json.dumps({"id": "s1", "text": 12345}), "not json at all", json.dumps({"id": "s2"}), "[1, 2]"]
    # As on one machine: a byte order mark first is skipped, and a folder's files that are not JSONL are not read
    # (a README.md was read as rows, and the mark rejected the first); a blank line is skipped, and a line with a
    # byte that is not UTF-8 is rejected with its id (Ray Data's text reader failed the job on it, a traceback).
    (tmp_path / "in").mkdir()
    latin1 = '{"id": "s3", "text": "caf\xe9"}'.encode("latin-1")
    (tmp_path / "in" / "in.jsonl").write_bytes(("\ufeff" + "\n".join(lines) + "\n\n").encode() + latin1 + b"\n")
    (tmp_path / "in" / "README.md").write_text("# the corpus\nfrom the river\n")
    from hare.cli import main as hare

    args = ["run", str(fp32_bundle("feature-extraction")), "-i", str(tmp_path / "in"), "-o", str(tmp_path / "o")]
    assert hare([*args, "--ray", cluster.address]) == 0
    assert "45 rows" in capsys.readouterr().out
    table = pq.read_table(tmp_path / "o")
    rows = list(zip(table.column("id").to_pylist(), table.column("error").to_pylist(), strict=True))
    errors = dict(rows)
    assert all(errors[str(i)] is None for i in range(40))  # ids as text, as hare run writes a JSONL's
    assert errors["s1"] == "its text is a number, not text" and errors["s2"] == 'the row has no "text" field'
    assert errors["s3"] == "line 46 of in.jsonl: the line is not UTF-8: its byte 26 is 0xe9"
    # A line that is no object has no id to name it: its file and line do (it said "the line is not valid JSON").
    assert sorted(e for i, e in rows if i is None) == [
        "line 42 of in.jsonl: the line is not valid JSON (UTF-8): invalid literal, expected 'null': line 1 column 1 "
        "(char 0)",
        "line 44 of in.jsonl: the line is a list, not a JSON object",
    ]
    # Nothing but bad rows: one sentence and exit 2, as a job on one machine ends.
    (tmp_path / "in" / "in.jsonl").write_text("\n".join(lines[40:]) + "\n")
    assert hare([*args, "--ray", cluster.address, "--overwrite"]) == 2
    assert "every row of" in capsys.readouterr().err and pq.read_table(tmp_path / "o").num_rows == 4


def test_a_cluster_with_token_authentication_names_the_token_and_runs_with_it(
    fp32_bundle: ModelFactory, tmp_path: Path
) -> None:
    # Said "no Ray cluster at --ray 127.0.0.1:PORT; start one with `ray start --head`", of a head that answered,
    # after 20 s of Ray's "Authentication token is missing" lines. Ray turns token authentication on where a
    # token file exists, and by default from 2.61. A head of its own (its own process group and temp folder).
    import contextlib
    import shutil
    import socket
    import subprocess
    import sys
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "hare" * 8
    here = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # a short path: Ray's sockets live there
    start = ["start", "--head", "--port", str(port), "--num-cpus", "2", "--include-dashboard", "false"]
    with (tmp_path / "head.log").open("wb") as log:
        head = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ray.scripts.scripts",
                *start,
                "--disable-usage-stats",
                "--temp-dir",
                temp,
                "--block",
            ],
            env={**here, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (tmp_path / "in.csv").write_text("id,text\nr1,a text\nr2,another text\n")
    bundle = str(fp32_bundle("feature-extraction"))
    argv = [sys.executable, "-m", "hare.cli", "run", bundle, "-i", str(tmp_path / "in.csv"), "-o", str(tmp_path / "o")]
    argv += ["--ray", f"127.0.0.1:{port}", "-q"]
    driver = {**here, "HOME": str(tmp_path)}  # no ~/.ray/auth_token of this machine's
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(
            ["ray", "status", "--address", f"127.0.0.1:{port}"],
            env={**driver, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token},
            capture_output=True,
        ).returncode:
            assert time.monotonic() < deadline and head.poll() is None, "the head did not start"
            time.sleep(1)
        refused = subprocess.run(argv, env=driver, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and not (tmp_path / "o").exists()
        assert refused.stderr.splitlines()[-1].startswith(f"hare run: error: the Ray head at --ray 127.0.0.1:{port} ")
        assert "set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to its token" in refused.stderr
        ran = subprocess.run(
            argv, env={**driver, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}, capture_output=True, text=True
        )
        assert ran.returncode == 0, ran.stderr
        assert pq.read_table(tmp_path / "o").num_rows == 2
        # -q: the summary, without Ray's "Connected to Ray cluster." and "Progress bars disabled" lines
        assert "Connected to Ray" not in ran.stderr and "Progress bars" not in ran.stderr, ran.stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # `ray stop` would stop every Ray of the machine
        head.wait(30)
        shutil.rmtree(temp, ignore_errors=True)
