"""`hare run`: a corpus through a real bundle (tiny random models from the real optimizer) gives /predict's own
answers row by row, bad rows go to the rejects with their reason, and a bad file stops with one sentence."""

from __future__ import annotations

import codecs
import csv
import dataclasses
import gzip
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from tokenizers import Tokenizer

from api.bulk import writer
from api.bulk.cli import report
from api.bulk.job import BulkOptions, Progress, _reason_kind, run_job
from api.bulk.model import BulkModel
from api.bulk.reader import Columns, Corpus, checked_chunk
from api.config import Settings
from container.bundle import MANIFEST_FILE, TOKENIZER_FILE
from hare.cli import main as hare
from tasks.errors import InputError
from tasks.ops import pad_batch
from tests.api_helpers import serve, without_special_tokens
from tests.conftest import ModelFactory

pytestmark = pytest.mark.anyio
WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "then", "went", "to", "sleep", "while", "dogs", "barked",
         "loudly", "outside", "near", "old", "river")  # fmt: skip


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def texts(n: int, seed: int = 0, longest: int = 40) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(1, longest))) for _ in range(n)]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_bytes(b"".join(r if isinstance(r, bytes) else orjson.dumps(r) + b"\n" for r in rows))
    return path


def settings(bundle: Path) -> Settings:
    return dataclasses.replace(Settings.from_env({}), bundle=bundle)


async def predict(bundle: Path, inputs: Any, **parameters: Any) -> Any:
    async with serve(bundle) as client:
        answer = await client.post("/predict", json={"inputs": inputs, "parameters": parameters})
        assert answer.status_code == 200, answer.text
        return answer.json()


def test_a_row_without_tokens_is_rejected_not_the_end_of_the_job(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    """Where the tokenizer adds no special tokens, a text of whitespace has no tokens: /predict's 400, a reject
    here (the model failed on it, ending the job)."""
    bundle = without_special_tokens(fp32_bundle("feature-extraction"), tmp_path / "bundle")
    rows = [{"id": i, "text": t} for i, t in zip("abcd", ["hi", " ", "there", "\t"], strict=True)]
    out = tmp_path / "out.parquet"
    summary = run_job(settings(bundle), BulkOptions(write_jsonl(tmp_path / "in.jsonl", rows), out))
    assert pq.read_table(out).column("id").to_pylist() == ["a", "c"]
    rejects = [json.loads(line) for line in (tmp_path / "out.rejects.jsonl").read_text().splitlines()]
    assert [(r["row"], r["id"]) for r in rejects] == [(1, "b"), (3, "d")]
    assert all(r["reason"].startswith("it has no tokens") for r in rejects)
    assert (summary.written, summary.rejected) == (2, 2)


async def test_embeddings_are_predicts_and_bad_rows_are_rejected(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("feature-extraction")
    good = texts(300)
    rows: list[Any] = [{"id": f"r{i}", "text": t} for i, t in enumerate(good)]
    rows[3:3] = [{"id": "empty", "text": ""}, b"{not json\n", {"id": "number", "text": 7}, {"id": "none"}]
    rows.insert(100, {"id": "long", "text": "x" * 5001})
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.parquet"
    summary = run_job(settings(bundle), BulkOptions(source, out, max_chars=5000, chunk_rows=64))
    table = pq.read_table(out)
    assert table.column_names == ["id", "embeddings", "truncated"]
    assert pa.types.is_fixed_size_list(table.schema.field("embeddings").type)
    assert table.column("id").to_pylist() == [f"r{i}" for i in range(len(good))]  # every good row once, in order
    expected = np.asarray(await predict(bundle, good), np.float32)
    assert np.allclose(np.stack(table.column("embeddings").to_numpy(zero_copy_only=False)), expected, atol=1e-5)
    rejects = [json.loads(line) for line in (tmp_path / "out.rejects.jsonl").read_text().splitlines()]
    assert [(r["row"], r["id"]) for r in rejects] == [
        (3, "empty"),
        (4, None),
        (5, "number"),
        (6, "none"),
        (100, "long"),
    ]
    assert "empty string" in rejects[0]["reason"] and "not valid JSON" in rejects[1]["reason"]
    assert "a number, not text" in rejects[2]["reason"] and 'no "text" field' in rejects[3]["reason"]
    assert "5001 characters" in rejects[4]["reason"]
    assert (summary.rows, summary.written, summary.rejected) == (len(rows), len(good), 5)
    assert not (tmp_path / "out.parquet.parts").exists()


async def test_int8_vectors_and_jsonl_output(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("feature-extraction")
    good = texts(40, seed=1)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in good])
    run_job(settings(bundle), BulkOptions(source, tmp_path / "q.parquet", parameters={"encoding_format": "int8"}))
    table = pq.read_table(tmp_path / "q.parquet")
    assert table.schema.field("embeddings").type.value_type == pa.int8()
    assert table.column("id").to_pylist() == list(range(40))  # no id column: row numbers
    codes = np.stack(table.column("embeddings").to_numpy(zero_copy_only=False))
    expected = np.asarray(await predict(bundle, good, encoding_format="int8"))
    assert np.abs(codes.astype(int) - expected).max() <= 1  # a float ulp from batching may move one level
    run_job(settings(bundle), BulkOptions(source, tmp_path / "v.jsonl", parameters={"encoding_format": "ubinary"}))
    lines = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == list(range(40))
    assert all(len(line["embeddings"]) == len(expected[0]) // 8 for line in lines)


@pytest.mark.parametrize("task", ["text-classification", "token-classification"])
async def test_labels_and_entities_are_predicts(fp32_bundle: ModelFactory, tmp_path: Path, task: str) -> None:
    bundle = fp32_bundle(task)
    good = texts(50, seed=2, longest=200)  # some over the tiny model's maximum: cut, and marked so
    with (tmp_path / "in.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "body"])
        writer.writerows([f"k{i}", t] for i, t in enumerate(good))
    out = tmp_path / "out.parquet"
    options = BulkOptions(tmp_path / "in.csv", out, columns=Columns(text="body", id="key"), chunk_rows=16)
    run_job(
        settings(bundle), dataclasses.replace(options, parameters={"top_k": 2} if task == "text-classification" else {})
    )
    table = pq.read_table(out).to_pylist()
    answers = await predict(bundle, good, **({"top_k": 2} if task == "text-classification" else {}))
    assert [row["id"] for row in table] == [f"k{i}" for i in range(len(good))]
    column = "labels" if task == "text-classification" else "entities"
    for row, answer in zip(table, answers, strict=True):
        assert row["truncated"] == any(item.get("truncated", False) for item in answer) or not answer
        expected = [{k: v for k, v in item.items() if k != "truncated"} for item in answer]
        assert [item.keys() for item in row[column]] == [item.keys() for item in expected]
        for got, want in zip(row[column], expected, strict=True):
            assert got.pop("score") == pytest.approx(want.pop("score"), abs=1e-5)
            assert got == want
    assert any(row["truncated"] for row in table)


async def test_a_classifiers_pairs_are_predicts(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("text-classification")
    firsts, seconds = texts(30, seed=5, longest=150), texts(30, seed=6, longest=150)  # some pairs cut
    rows = [{"premise": a, "hypothesis": b} for a, b in zip(firsts, seconds, strict=True)]
    out = tmp_path / "out.jsonl"
    columns = Columns(text="premise", text_pair="hypothesis")
    run_job(settings(bundle), BulkOptions(write_jsonl(tmp_path / "in.jsonl", rows), out, columns=columns, chunk_rows=8))
    table = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    pairs = [{"text": a, "text_pair": b} for a, b in zip(firsts, seconds, strict=True)]
    answers = await predict(bundle, pairs)
    assert [row["id"] for row in table] == list(range(len(rows)))
    for row, answer in zip(table, answers, strict=True):
        assert row["truncated"] == answer[0].get("truncated", False)
        assert row["labels"][0]["label"] == answer[0]["label"]
        assert row["labels"][0]["score"] == pytest.approx(answer[0]["score"], abs=1e-5)
    assert any(row["truncated"] for row in table) and not all(row["truncated"] for row in table)
    with pytest.raises(InputError, match="reads single texts: --text-pair-column"):
        run_job(settings(fp32_bundle("feature-extraction")), BulkOptions(tmp_path / "in.jsonl", out, columns=columns))
    missing = BulkOptions(tmp_path / "in.jsonl", tmp_path / "o2.jsonl", columns=Columns("premise", text_pair="x"))
    with pytest.raises(InputError, match="name it with --text-column and --text-pair-column"):
        run_job(settings(bundle), missing)
    # One column named twice was read once: each row classified as a single text, the scores of a plain run.
    twice = BulkOptions(tmp_path / "in.jsonl", tmp_path / "o3.jsonl", columns=Columns("premise", text_pair="premise"))
    with pytest.raises(InputError, match="--text-column and --text-pair-column both name the column 'premise'"):
        run_job(settings(bundle), twice)
    assert not (tmp_path / "o3.jsonl").exists()


async def test_ranking_reads_query_and_document_columns(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("text-ranking")
    documents = texts(30, seed=3)
    queries = ["where is the cat", "dogs barked"]
    rows = [{"query": queries[i % 2], "document": d, "id": i * 10} for i, d in enumerate(documents)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    run_job(settings(bundle), BulkOptions(tmp_path / "in.parquet", tmp_path / "out.parquet", chunk_rows=7))
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.field("id").type == pa.int64()  # Parquet ids keep their type
    assert table.column_names == ["id", "score", "truncated"]  # the documents' place is the row's, no column
    assert table.schema.field("score").type == pa.float32()  # as /predict's, at float32 precision
    assert table.column("id").to_pylist() == [i * 10 for i in range(30)]
    scores = table.column("score").to_pylist()
    for q, query in enumerate(queries):
        mine = [i for i in range(30) if i % 2 == q]
        ranked = await predict(bundle, {"query": query, "documents": [documents[i] for i in mine]})
        for entry in ranked:
            assert scores[mine[entry["index"]]] == pytest.approx(entry["score"], abs=1e-5)
    same = BulkOptions(
        tmp_path / "in.parquet", tmp_path / "o2.parquet", columns=Columns(query="query", document="query")
    )
    with pytest.raises(InputError, match="--query-column and --document-column both name the column 'query'"):
        run_job(settings(bundle), same)  # an IndexError of the job's first chunk, its work folder left behind
    assert not (tmp_path / "o2.parquet.parts").exists()
    # A column named for the other kind of task was never read, and the job ran on the default columns.
    body = BulkOptions(tmp_path / "in.parquet", tmp_path / "o5.parquet", columns=Columns(text="document"))
    with pytest.raises(InputError, match="text-ranking reads --query-column and --document-column, not --text-col"):
        run_job(settings(bundle), body)
    other = BulkOptions(tmp_path / "in.parquet", tmp_path / "o6.parquet", columns=Columns(query="document"))
    with pytest.raises(InputError, match="feature-extraction reads --text-column: --query-column and --document-col"):
        run_job(settings(fp32_bundle("feature-extraction")), other)
    # top_n kept each query's best documents of a chunk: the other rows were written without a score.
    cut = BulkOptions(tmp_path / "in.parquet", tmp_path / "o4.parquet", parameters={"top_n": 1})
    with pytest.raises(InputError, match="top_n chooses among a request's inputs; a bulk job answers every row"):
        run_job(settings(bundle), cut)
    assert not (tmp_path / "o4.parquet").exists() and not (tmp_path / "o4.parquet.parts").exists()


async def test_windows_read_long_texts_whole(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("feature-extraction")
    good = texts(12, seed=4, longest=300)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in good])
    run_job(settings(bundle), BulkOptions(source, tmp_path / "w.parquet", long_input="window"))
    table = pq.read_table(tmp_path / "w.parquet")
    expected = np.asarray(await predict(bundle, good, long_input="window"), np.float32)
    assert np.allclose(np.stack(table.column("embeddings").to_numpy(zero_copy_only=False)), expected, atol=1e-5)
    assert not any(table.column("truncated").to_pylist())
    run_job(settings(bundle), BulkOptions(source, tmp_path / "r.parquet", long_input="refuse"))
    kept = pq.read_table(tmp_path / "r.parquet").column("id").to_pylist()
    rejected = [json.loads(line)["row"] for line in (tmp_path / "r.rejects.jsonl").read_text().splitlines()]
    assert rejected and sorted(kept + rejected) == list(range(12))


async def test_texts_cut_at_their_start_are_predicts_cut_so(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("feature-extraction")
    good = texts(12, seed=4, longest=300)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in good])
    out = tmp_path / "left.parquet"
    assert hare(["run", str(bundle), "-i", str(source), "-o", str(out), "-q", "--truncation-direction", "left"]) == 0
    table = pq.read_table(out)
    expected = np.asarray(await predict(bundle, good, truncation_direction="Left"), np.float32)
    assert np.allclose(np.stack(table.column("embeddings").to_numpy(zero_copy_only=False)), expected, atol=1e-5)
    cut = table.column("truncated").to_pylist()
    assert any(cut) and not all(cut)
    right = np.asarray(await predict(bundle, good), np.float32)
    assert all(np.allclose(right[i], expected[i], atol=1e-6) != cut[i] for i in range(len(good)))
    with pytest.raises(InputError, match="--truncation-direction must be right or left"):
        BulkModel(settings(bundle), {}, side="Middle")


async def test_entities_of_texts_cut_at_their_start_point_into_the_rows(
    fp32_bundle: ModelFactory, tmp_path: Path
) -> None:
    bundle = fp32_bundle("token-classification")
    longest = " ".join(texts(30, seed=6, longest=60))  # too long to tokenize whole: read by its end alone
    good = [*texts(6, seed=5, longest=200), longest]
    parameters = {"aggregation_strategy": "none", "ignore_labels": []}
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in good])
    options = BulkOptions(source, tmp_path / "out.parquet", parameters=parameters, truncation_direction="left")
    run_job(settings(bundle), options)
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    answers = await predict(bundle, good, truncation_direction="Left", **parameters)
    for text, row, answer in zip(good, table, answers, strict=True):
        assert [e["start"] for e in row["entities"]] == [e["start"] for e in answer]
        assert [e["end"] for e in row["entities"]] == [e["end"] for e in answer]
        assert all(e["word"].lstrip("#") == text[e["start"] : e["end"]].lower() for e in row["entities"])
    assert table[-1]["truncated"] and table[-1]["entities"][-1]["end"] == len(longest)


def test_the_ray_stage_takes_the_servers_default_for_long_texts(
    fp32_bundle: ModelFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.bulk.ray import HareStage

    monkeypatch.setenv("HARE_TRUNCATE", "0")  # the server refuses long texts: the stage rejects them
    stage = HareStage(str(fp32_bundle("feature-extraction")))
    long = " ".join(WORDS * 20)
    answered = stage(pa.table({"id": [1, 2], "text": ["a short one", long]})).to_pylist()
    assert [(row["id"], row["error"] is None) for row in answered] == [(1, True), (2, False)]
    assert "longer than the model's" in answered[1]["error"]
    left = HareStage(str(fp32_bundle("feature-extraction")), long_input="truncate", truncation_direction="left")
    answered = left(pa.table({"id": [1, 2], "text": ["a short one", long]})).to_pylist()
    assert [row["truncated"] for row in answered] == [False, True]


def test_the_job_batches_at_the_bundles_budget_of_the_best_rate(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(fp32_bundle("feature-extraction"), bundle)
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    rates = {"128": 1000.0, "256": 1040.0, "512": 1100.0, "1024": 1090.0}
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest | {"max_batch_tokens": 128, "token_rates": rates}))
    assert BulkModel(settings(bundle), {}).batching[1] == 512  # no answer waits on a batch here
    setting = dataclasses.replace(settings(bundle), max_batch_tokens=256)
    assert BulkModel(setting, {}).batching[1] == 256


async def test_a_rows_encodings_go_once_its_call_has_answered_it(fp32_bundle: ModelFactory) -> None:
    # Encodings are most of a chunk's memory (25 KB a text of 156 tokens); a chunk answered but not yet
    # written held all of them (20,000 texts: 924 MB of RSS at the peak, 849 without them).
    bundle = fp32_bundle("feature-extraction")
    model = BulkModel(dataclasses.replace(settings(bundle), max_batch_size=4), {})
    rows = texts(12)
    work = model.encode(checked_chunk(0, 0, list(range(12)), {"text": rows}, 10_000, "id"))
    first, *others = model.batches(work)
    model.run(work, first)
    assert [bool(w) for w in work.windows] == [r not in first for r in range(12)] and others
    for call in others:
        model.run(work, call)
    answered = model.answer(work, pa.int64()).table()
    assert answered.column("id").to_pylist() == list(range(12)) and not any(work.windows)
    vectors = np.stack(answered.column("embeddings").to_numpy(zero_copy_only=False))
    assert np.allclose(vectors, await predict(bundle, rows), atol=1e-5)


def test_a_call_padded_to_the_runtimes_multiple_never_passes_the_models_maximum(fp32_bundle: ModelFactory) -> None:
    tokenizer = Tokenizer.from_file(str(fp32_bundle("feature-extraction") / TOKENIZER_FILE))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    for max_length in (13, 512):
        for words in range(1, len(WORDS) + 1):
            encoding = tokenizer.encode(" ".join(WORDS[:words]))
            feeds = pad_batch([encoding], ["input_ids", "attention_mask"], 0, 8, max_length)
            n, padded = len(encoding), feeds["input_ids"].shape[1]
            assert feeds["attention_mask"].sum() == n  # the padding is masked
            # The next multiple of 8, unless the model's positions end first; never a cut (the tokenizer cuts).
            assert padded == max(n, min(max_length, n + (-n) % 8)), (n, max_length, padded)


def test_chunks_are_the_same_rows_however_the_file_is_read(tmp_path: Path) -> None:
    rows = [{"text": f"row {i}", "id": f"i{i}"} for i in range(1000)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet", row_group_size=77)
    corpus = Corpus(tmp_path / "in.parquet", Columns(), pairs=False)
    chunks = list(corpus.chunks(300, 100, done={1}))
    assert [(c.index, c.first, c.rows, c.skipped) for c in chunks] == [
        (0, 0, 300, False), (1, 300, 300, True), (2, 600, 300, False), (3, 900, 100, False)
    ]  # fmt: skip
    assert chunks[2].ids == [f"i{i}" for i in range(600, 900)] and chunks[3].values[0][-1] == "row 999"
    # Progress: chunks smaller than the reader's pieces stand where their rows end, not all at the piece's end.
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    ends = [c.end for c in Corpus(source, Columns(), pairs=False).chunks(100, 100)]
    assert ends == sorted(set(ends)) and ends[-1] == source.stat().st_size and ends[4] < 0.6 * ends[-1]


async def test_a_folder_of_shards_is_one_corpus(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    # Spark's and Hugging Face datasets' layout: shards in name order (subfolders' too), markers left out.
    bundle = fp32_bundle("feature-extraction")
    good = texts(500, seed=7)
    shards = tmp_path / "corpus"
    layout = {
        "lang=de/part-0.parquet": (0, 120),
        "lang=de/part-1.parquet": (120, 300),
        "lang=en/part-0.parquet": (300, 500),
    }
    for name, (a, b) in layout.items():
        (shards / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": good[a:b]}), shards / name, row_group_size=50)
    (shards / "_SUCCESS").write_text("")
    (shards / "lang=de" / ".part-9.parquet").write_bytes(b"a half-written file")  # hidden: never read
    (shards / "_temporary").mkdir()
    (shards / "_temporary" / "part-9.parquet").write_bytes(b"Spark's unfinished task")
    (shards / "dataset_info.json").write_text("{}")  # a dataset's card: --input-format parquet reads past it
    out = tmp_path / "out.parquet"
    summary = run_job(settings(bundle), BulkOptions(shards, out, input_format="parquet", chunk_rows=64))
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == list(range(500))  # row positions run on from shard to shard
    expected = np.asarray(await predict(bundle, good), np.float32)
    assert np.allclose(np.stack(table.column("embeddings").to_numpy(zero_copy_only=False)), expected, atol=1e-5)
    assert summary.to_dict()["rows"] == 500
    # Ids from each shard's id column; a bad CSV line is named with its shard.
    csvs = tmp_path / "csvs"
    csvs.mkdir()
    (csvs / "a.csv").write_text("id,text\na1,first\na2,second\n")
    (csvs / "b.csv").write_text('id,text\nb1,third\nb2,"fourth",extra\nb3,fifth\n')
    [chunk] = Corpus(csvs, Columns(), pairs=False).chunks(100, 100)
    assert chunk.ids == ["a1", "a2", "b1", "b3"] and chunk.values == [["first", "second", "third", "fifth"]]
    assert [r.reason for r in chunk.rejects] == ["row 3 of b.csv (the header is row 1) has 3 fields, the header 2"]
    # Without an id column a row's id is its place: a skipped line keeps its own (the good rows before it in
    # its block took the ids after theirs, the line the first), also past a value spanning lines.
    (csvs / "b.csv").write_text('text\nr0\n"r1\nstill r1"\nr2,extra\nr3\nr4,x\nr5\n')
    [chunk] = Corpus(csvs / "b.csv", Columns(), pairs=False).chunks(100, 100)
    assert chunk.ids == [0, 1, 3, 5] and chunk.values == [["r0", "r1\nstill r1", "r3", "r5"]]
    assert [(r.row, r.id) for r in chunk.rejects] == [(2, 2), (4, 4)]
    assert chunk.rejects[0].reason.startswith("row 4 (the header is row 1)")  # Arrow's record, not line 5


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({}, "holds no file named *.jsonl"),
        ({"a.jsonl": '{"text": "x"}\n', "b.csv": "text\ny\n"}, "holds files of csv and jsonl; pass --input-format"),
        ({"a.jsonl": '{"text": "x", "id": "k"}\n', "b.jsonl": '{"text": "y"}\n'}, "b.jsonl has no id column but"),
        ({"a.jsonl": '{"text": "x"}\n', "b.jsonl": '{"body": "y"}\n'}, "b.jsonl has no field text (it has: body)"),
    ],
)
def test_a_folder_that_is_not_one_corpus_stops_before_any_row(files: dict[str, str], said: str, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for name, content in files.items():
        (folder / name).write_text(content)
    with pytest.raises(InputError, match=re.escape(said)):
        Corpus(folder, Columns(), pairs=False)


@pytest.mark.parametrize("header", ["text\n", "text"])  # without its line end Arrow's reader said "Empty CSV"
def test_an_input_without_rows_gives_an_output_without_rows(
    fp32_bundle: ModelFactory, tmp_path: Path, header: str
) -> None:
    (tmp_path / "in.csv").write_text(header)
    run_job(settings(fp32_bundle("feature-extraction")), BulkOptions(tmp_path / "in.csv", tmp_path / "o.parquet"))
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 0


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("ids-first.csv", "id,text\nk1,first\nk2,second\n"),
        ("text-first.csv", "text,id\nfirst,k1\nsecond,k2\n"),
        ("in.jsonl", '{"id": "k1", "text": "first"}\n{"id": "k2", "text": "second"}\n'),
    ],
)
def test_a_file_that_starts_with_a_byte_order_mark_reads_as_without(name: str, content: str, tmp_path: Path) -> None:
    # Excel's "CSV UTF-8" and Windows editors write one: its header's first column kept its name, and its first
    # JSON line was a row.
    (tmp_path / name).write_bytes(codecs.BOM_UTF8 + content.encode())
    [chunk] = Corpus(tmp_path / name, Columns(), pairs=False).chunks(100, 100)
    assert chunk.ids == ["k1", "k2"] and chunk.values == [["first", "second"]] and not chunk.rejects


def test_a_csv_row_longer_than_a_megabyte_is_a_reject_not_the_end_of_the_job(tmp_path: Path) -> None:
    # Arrow's reader parsed 1 MiB at a time and stopped the job at a longer row ("straddling object").
    rows = "".join(f"r{i},row {i}\n" for i in range(100))
    (tmp_path / "in.csv").write_text(f"id,text\n{rows}big,{'x' * 2**21}\nafter,hi\n")
    [chunk] = Corpus(tmp_path / "in.csv", Columns(), pairs=False).chunks(1000, 1000)
    assert chunk.ids == [f"r{i}" for i in range(100)] + ["after"]
    assert [(r.id, r.reason.split(",")[0]) for r in chunk.rejects] == [("big", "its text is 2097152 characters long")]


def test_a_csv_naming_a_column_it_reads_twice_is_refused(tmp_path: Path) -> None:
    # Arrow read the first of the two, and the job ran the other's texts never (rc 0).
    (tmp_path / "in.csv").write_text("id,text,text\na,first,second\n")
    with pytest.raises(InputError, match="has 2 columns named 'text' \\(columns 2, 3\\)"):
        Corpus(tmp_path / "in.csv", Columns(), pairs=False).chunks(100, 100)
    (tmp_path / "in.csv").write_text("id,text,id\na,first,b\n")
    with pytest.raises(InputError, match="columns named 'id' \\(columns 1, 3\\)"):
        Corpus(tmp_path / "in.csv", Columns(), pairs=False).chunks(100, 100)
    (tmp_path / "in.csv").write_text("id,text,note,note\na,first,x,y\n")  # a column the job does not read
    [chunk] = Corpus(tmp_path / "in.csv", Columns(), pairs=False).chunks(100, 100)
    assert chunk.values == [["first"]]


@pytest.mark.parametrize(
    ("header", "opened"),
    [("id,text", '5,"oops'), ("id,text,note", '5,x,"oops'), ("id,text,note", '5,"oops')],
    ids=["its text", "a column not read", "a field short"],
)
def test_a_csv_quote_that_never_closes_stops_the_job_before_it_loses_the_rows_after_it(
    tmp_path: Path, header: str, opened: str
) -> None:
    # Arrow's reader took the rest of the file as one value: 6 rows run, rc 0, 994 rows neither written nor rejected.
    fields = header.count(",")
    rows = [f"{i},row {i}" + ",n" * (fields - 1) for i in range(1000)]
    rows[5] = opened
    (tmp_path / "in.csv").write_text("\r\n".join([header, *rows]) + "\r\n")
    with pytest.raises(InputError, match="row 7 \\(the header is row 1\\) opens a quote that never closes"):
        Corpus(tmp_path / "in.csv", Columns(), pairs=False).chunks(100, 100)
    # Closed quotes, line ends inside them and a quote inside an unquoted value read as they did.
    (tmp_path / "ok.csv").write_text(
        f'{header}\n1,"two\nlines"{",n" * (fields - 1)}\n2,12" pizza{",n" * (fields - 1)}\n'
    )
    [chunk] = Corpus(tmp_path / "ok.csv", Columns(), pairs=False).chunks(100, 100)
    assert chunk.values == [["two\nlines", '12" pizza']] and not chunk.rejects


def test_an_empty_csv_id_is_a_rejected_row_as_a_null_one(tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_bytes(b'id,text\n,no id\nb,fine\n"",quoted empty\n')  # "" was written as an id
    [chunk] = Corpus(tmp_path / "in.csv", Columns(), pairs=False).chunks(100, 100)
    assert chunk.ids == ["b"] and chunk.values == [["fine"]]
    assert [(r.row, r.reason) for r in chunk.rejects] == [(0, "its id is empty (null)"), (2, "its id is empty (null)")]


def test_a_jsonl_line_that_is_not_utf8_is_rejected_with_its_id(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_bytes(b'{"id": "a", "text": "fine"}\n{"id": "b", "text": "bad \xff"}\n')
    [chunk] = Corpus(tmp_path / "in.jsonl", Columns(), pairs=False).chunks(100, 100)
    assert chunk.ids == ["a"] and [(r.row, r.id) for r in chunk.rejects] == [(1, "b")]  # its id was None
    assert chunk.rejects[0].reason == "line 2: the line is not UTF-8: its byte 26 is 0xff"  # was orjson's "surrogates"


def test_a_jsonl_line_that_is_not_an_object_names_its_line_and_file(tmp_path: Path) -> None:
    # Its reject had a row position alone: blank lines are not rows, and a folder's positions run on from file to
    # file, so the line was not found by its number.
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"id": "a", "text": "fine"}\n')
    (tmp_path / "in" / "b.jsonl").write_text('\n{"id": "b", "text": "fine"}\n\nnot json\n')
    [chunk] = Corpus(tmp_path / "in", Columns(), pairs=False).chunks(100, 100)
    assert [(r.row, r.id) for r in chunk.rejects] == [(2, None)]
    assert chunk.rejects[0].reason.startswith("line 4 of b.jsonl: the line is not valid JSON (UTF-8): ")


def test_a_first_jsonl_row_without_the_text_or_its_id_is_a_reject_not_the_files_fields(tmp_path: Path) -> None:
    # The first object alone named the fields: without "text" it stopped the whole job ("has no field text"),
    # and without "id" every row's id was its number.
    (tmp_path / "in.jsonl").write_bytes(b'{"id": "a", "body": "x"}\n{"text": "no id"}\n{"id": "c", "text": "fine"}\n')
    [chunk] = Corpus(tmp_path / "in.jsonl", Columns(), pairs=False).chunks(100, 100)
    assert chunk.ids == ["c"] and chunk.values == [["fine"]]
    assert [(r.row, r.id, r.reason) for r in chunk.rejects] == [
        (0, "a", 'the row has no "text" field'),
        (1, None, 'the row has no "id" field'),
    ]


def test_a_nan_id_is_a_rejected_row(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1.5, float("nan"), 3.0], "text": ["a", "b", "c"]}), tmp_path / "in.parquet")
    [chunk] = Corpus(tmp_path / "in.parquet", Columns(), pairs=False).chunks(100, 100)
    assert chunk.ids == [1.5, 3.0] and [(r.row, r.reason) for r in chunk.rejects] == [(1, "its id is empty (NaN)")]


def test_undecodable_csv_values_are_rejected_rows(tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_bytes(b'text\nfine\n\xff\xfe bad\n""\nalso fine\n')
    [chunk] = Corpus(tmp_path / "in.csv", Columns(), pairs=False).chunks(100, 100)
    assert chunk.values == [["fine", "also fine"]] and chunk.ids == [0, 3]
    assert [(r.row, r.reason) for r in chunk.rejects] == [
        (1, "its text is not valid UTF-8 (byte 0)"), (2, "its text is an empty string")
    ]  # fmt: skip


@pytest.mark.parametrize("dictionary", [False, True])
def test_parquet_text_that_is_not_utf8_is_a_rejected_row(tmp_path: Path, dictionary: bool) -> None:
    # Arrow reads a string column without checking its UTF-8: one bad value stopped the job with a traceback.
    column = pa.array([b"fine", b"bad \xff", b"also fine"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"text": column.dictionary_encode() if dictionary else column}), tmp_path / "in.parquet")
    [chunk] = Corpus(tmp_path / "in.parquet", Columns(), pairs=False).chunks(100, 100)
    assert chunk.values == [["fine", "also fine"]] and chunk.ids == [0, 2]
    assert [(r.row, r.reason) for r in chunk.rejects] == [(1, "its text is not valid UTF-8 (byte 4)")]
    ids = pa.array([b"a", b"\xff", b"c"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"id": ids, "text": ["x", "y", "z"]}), tmp_path / "ids.parquet")
    with pytest.raises(InputError, match=r"column id of .*ids\.parquet holds an id that is not UTF-8 text"):
        list(Corpus(tmp_path / "ids.parquet", Columns(), pairs=False).chunks(100, 100))


def test_the_summary_counts_reasons_without_their_numbers_but_keeps_names() -> None:
    # "UTF-8" was counted as "UTF-N", and "(byte 4)" lost its bracket.
    reasons = ("its text is not valid UTF-8 (byte 4)", "row 12 of part-0001.csv has 3 fields")
    assert [_reason_kind(r) for r in reasons] == [
        "its text is not valid UTF-8 (byte N)", "row N of part-0001.csv has N fields"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "content", "args", "said"),
    [
        ("in.parquet", b"PAR1 this is no parquet", [], "is not a Parquet file"),
        ("in.jsonl", b'{"body": "x"}\n', [], "has no field text (it has: body); name it with --text-column"),
        ("in.csv", b"body\nx\n", [], "has no column text (it has: body)"),
        ("in.csv", b"text\nx\n", ["--id-column", "k"], "no column k (it has: text); name it with --id-column"),
        ("in.txt", b"x\n", [], "cannot tell the format"),
        # mtime=0: the header the same whenever collected, so that every test process sees the same test ids
        ("in.jsonl.gz", gzip.compress(b'{"text": "x"}\n', mtime=0), [], "is gzip-compressed; decompress it first"),
        ("in.csv", gzip.compress(b"text\nx\n", mtime=0), [], "is gzip-compressed"),  # its header read as garbage
        ("in.csv", b"id;text\n1;x\n", [], "its fields seem separated by ';'; hare run reads comma-separated"),
        # A JSON array read as lines: all but its last object rejected as bad JSON, exit 0.
        ("in.json", b'[\n  {"text": "a"},\n  {"text": "b"}\n]\n', [], "holds a JSON array; hare run reads JSON Lines"),
        ("in.jsonl", b'[{"text": "a"}, {"text": "b"}]\n', [], "holds a JSON array"),
        # A spreadsheet's "Unicode text": "has no column text (it has: \ufffd\ufffdi d ,  t e x t)".
        ("in.csv", "id,text\n1,x\n".encode("utf-16"), [], "is UTF-16 text (its byte order mark says so); save it as"),
        ("in.jsonl", '{"text": "x"}\n'.encode("utf-32"), [], "is UTF-32 text"),
    ],
)  # fmt: skip
def test_a_bad_file_stops_with_one_sentence(
    fp32_bundle: ModelFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: bytes,
    args: list[str],
    said: str,
) -> None:
    (tmp_path / name).write_bytes(content)
    bundle = fp32_bundle("feature-extraction")
    capsys.readouterr()  # what building the bundle printed (the first test to ask for it builds it)
    code = hare(
        [
            "run",
            str(bundle),
            "-i",
            str(tmp_path / name),
            "-o",
            str(tmp_path / "o.parquet"),
            *args,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.parquet").exists()


def test_a_job_that_rejects_every_row_ends_with_a_sentence_and_exit_2(
    fp32_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A Latin-1 CSV: every row "not valid UTF-8", and the job said "2 run, 0 written", exit 0.
    (tmp_path / "in.csv").write_bytes("text\ncaf\u00e9\nna\u00efve\n".encode("latin-1"))
    bundle = fp32_bundle("feature-extraction")
    capsys.readouterr()
    code = hare(["run", str(bundle), "-i", str(tmp_path / "in.csv"), "-o", str(tmp_path / "o.parquet"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"every row of {tmp_path / 'in.csv'} was rejected (2 of 2: its text is not valid UTF-8" in " ".join(
        err.split()
    )
    assert len((tmp_path / "o.rejects.jsonl").read_text().splitlines()) == 2  # the reasons, where it says
    # One good row among them is a job done, exit 0.
    (tmp_path / "in.csv").write_bytes("text\ncaf\u00e9\nfine\n".encode("latin-1"))
    assert (
        hare(["run", str(bundle), "-i", str(tmp_path / "in.csv"), "-o", str(tmp_path / "o2.parquet"), "--quiet"]) == 0
    )


def test_a_pipe_as_input_stops_with_one_sentence(
    fp32_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `-i <(zcat corpus.jsonl.gz)` or `-i /dev/stdin` from a pipe: "does not exist", which it did.
    os.mkfifo(tmp_path / "in.jsonl")
    bundle = fp32_bundle("feature-extraction")
    capsys.readouterr()
    code = hare(["run", str(bundle), "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a file but a pipe or device" in err and len(err.strip().splitlines()) == 1


def test_an_output_where_no_folder_can_be_made_stops_with_one_sentence(
    fp32_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "o.parquet"
    bundle = fp32_bundle("feature-extraction")
    capsys.readouterr()
    code = hare(["run", str(bundle), "-i", str(tmp_path / "in.jsonl"), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot write {out}: Not a directory" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("option", ["-o", "--rejects", "--summary"])
def test_an_output_that_is_a_pipe_or_a_device_is_refused_not_replaced(
    fp32_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    # The finished file was renamed over it: as root, `-o /dev/null --overwrite` replaced /dev/null.
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    out = ["-o", str(tmp_path / "o.parquet")] if option != "-o" else []
    bundle = fp32_bundle("feature-extraction")
    capsys.readouterr()
    code = hare(["run", str(bundle), "-i", str(tmp_path / "in.jsonl"), *out, option, str(pipe), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and f"{pipe} is not a regular file (a device, a pipe or a socket)" in err, err
    assert pipe.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "pipe"]


@pytest.mark.parametrize(
    ("output", "args", "said"),
    [
        ("a-folder", ["--overwrite"], "is a folder; name a file to write"),  # it ran the whole job, then failed
        ("o.csv", [], "writes Parquet or JSONL, not CSV"),  # it wrote Parquet into o.csv
        ("-", [], "the output - (standard output) is not one hare run writes to"),  # it wrote a file named -
        ("o.parquet", ["-p", "dimensions=100000"], "dimensions"),  # it left a work folder that refused the fix
        ("o.parquet", ["-p", "dimensions=8", "-p", "dimensions=16"], "--param dimensions is given twice"),  # 16 ran
        # Each of these destroyed a file, exit 0: the rejects merged over the output or the input, the summary
        # written over the output; the rejects inside the work folder went with it.
        ("o.parquet", ["--rejects", "o.parquet"], "--rejects o.parquet is the output"),
        ("o.parquet", ["--rejects", "in.jsonl"], "--rejects in.jsonl is the input"),
        ("o.parquet", ["--summary", "o.parquet"], "--summary o.parquet is the output"),
        ("o.parquet", ["--rejects", "r.jsonl", "--summary", "r.jsonl"], "--summary r.jsonl is --rejects"),
        ("o.parquet", ["--rejects", "o.parquet.parts/r.jsonl"], "is the job's work folder, inside it"),
        # Found only once the output was written (its summary then lost to "already exists").
        ("o.parquet", ["--summary", "nowhere/s.json"], "--summary nowhere/s.json cannot be written"),
        # A folder as the rejects file: the job ran whole, then its merge failed on it.
        ("o.parquet", ["--rejects", "a-folder"], "--rejects a-folder cannot be written"),
        ("new/o.parquet", ["--rejects", "new"], "--rejects new is the output, inside it or holds it"),
        # Said as "[Errno 13] Permission denied: '/sys/.r.jsonl.lock'" (the lock beside the rejects file).
        ("o.parquet", ["--rejects", "/sys/r.jsonl"], "cannot create /sys/.r.jsonl.lock ("),
        # Read as part of the input by the next run.
        ("a-folder/o.parquet", ["-i", "a-folder"], "the output a-folder/o.parquet is the input or inside it"),
    ],
)
def test_a_bad_output_stops_before_any_work_and_leaves_nothing_in_the_way(
    fp32_bundle: ModelFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    output: str,
    args: list[str],
    said: str,
) -> None:
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "a-folder").mkdir()
    bundle = fp32_bundle("feature-extraction")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)  # the paths as a user types them, relative
    code = hare(["run", str(bundle), "-i", "in.jsonl", "-o", output, *args])
    err = capsys.readouterr().err
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-folder", "in.jsonl"]
    assert hare(["run", str(bundle), "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o.parquet"), "-q"]) == 0


def test_two_outputs_of_one_stem_do_not_take_each_others_rejects(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    # out.parquet and out.jsonl both reject to out.rejects.jsonl: the second job deleted the first one's.
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "fine"}, {"text": ""}])
    bundle = fp32_bundle("feature-extraction")
    run_job(settings(bundle), BulkOptions(source, tmp_path / "out.parquet"))
    kept = (tmp_path / "out.rejects.jsonl").read_bytes()
    with pytest.raises(InputError, match=r"out\.rejects\.jsonl already exists; delete it or pass --overwrite"):
        run_job(settings(bundle), BulkOptions(source, tmp_path / "out.jsonl"))
    assert (tmp_path / "out.rejects.jsonl").read_bytes() == kept and not (tmp_path / "out.jsonl").exists()
    run_job(settings(bundle), BulkOptions(source, tmp_path / "out.jsonl", rejects=tmp_path / "other.jsonl"))


def test_a_job_stopped_before_its_first_part_leaves_no_job_to_resume(
    fp32_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An id column that is not UTF-8 stops the job at its first chunk, after its work folder was made; the
    # corrected file is another input, which that folder refused ("run the same command as before").
    source, out = tmp_path / "in.csv", tmp_path / "o.parquet"
    source.write_bytes(b"id,text\nabc,hello\ncaf\xe9,world\n")
    bundle = fp32_bundle("feature-extraction")
    command = ["run", str(bundle), "-i", str(source), "-o", str(out), "-q"]
    assert hare(command) == 2 and "invalid UTF8" in capsys.readouterr().err
    source.write_bytes("id,text\nabc,hello\ncafé,world\n".encode())
    assert hare(command) == 0, capsys.readouterr().err
    assert pq.read_table(out).column("id").to_pylist() == ["abc", "café"]


def test_ids_json_has_no_form_for_are_written_as_text(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    ids = pa.array([b"doc-1", b"\xff-2"])
    pq.write_table(pa.table({"id": ids, "text": ["a", ""]}), tmp_path / "in.parquet")
    out = tmp_path / "o.jsonl"
    run_job(settings(fp32_bundle("feature-extraction")), BulkOptions(tmp_path / "in.parquet", out))
    assert [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()] == ["doc-1"]
    assert orjson.loads((tmp_path / "o.rejects.jsonl").read_bytes())["id"] == "\\xff-2"


def test_an_input_without_rows_gives_the_output_columns(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    # Spark writes empty partitions as empty files: a folder of them beside others is read past.
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.jsonl").write_text("")
    (tmp_path / "in" / "part-1.jsonl").write_text('{"id": "k", "text": ""}\n')
    run_job(settings(fp32_bundle("feature-extraction")), BulkOptions(tmp_path / "in", tmp_path / "o.parquet"))
    schema = pq.read_schema(tmp_path / "o.parquet")
    assert schema.names == ["id", "embeddings", "truncated"] and schema.field("id").type == pa.string()


@pytest.mark.parametrize("option", ["--max-chars=-1", "--max-chars=0", "--chunk-rows=0", "--streams=0"])
def test_a_count_below_one_is_a_usage_error(option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --max-chars -1 rejected every row and exited 0; --max-chars 0 meant the default.
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(SystemExit) as stopped:
        hare(["run", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o.parquet"), option])
    assert stopped.value.code == 2 and "expected at least 1" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()


def test_chunks_past_the_most_a_job_holds_in_memory_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --chunk-rows 10000000 read the whole corpus into memory before its first answer.
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(SystemExit) as stopped:
        hare(["run", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o.parquet"), "--chunk-rows=16385"])
    said = capsys.readouterr().err
    assert stopped.value.code == 2 and "expected at most 16,384, got 16,385" in said and "in memory" in said
    assert not (tmp_path / "o.parquet").exists()


def test_a_parquet_column_that_is_not_text_stops(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "in.parquet")
    with pytest.raises(Exception, match=r"column text of .* holds int64, not text"):
        Corpus(tmp_path / "in.parquet", Columns(), pairs=False)


def test_an_output_named_as_a_folder_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `-o newdir/` wrote a file named newdir.
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    code = hare(["run", "-i", str(tmp_path / "in.jsonl"), "-o", f"{tmp_path / 'newdir'}/"])
    assert code == 2 and "newdir/ names a folder; name a file to write" in capsys.readouterr().err
    assert not (tmp_path / "newdir").exists()


class Stopped(Exception):
    """The job's end at a chosen place, as a kill there: what was committed stays, the rest is not written."""


class StopAfter(Progress):
    """Stops the job once `parts` chunks of this run are committed (a kill -9 between two chunks)."""

    def __init__(self, parts: int) -> None:
        self.parts = parts

    def advance(self, position: int, rows: int, skipped: bool) -> None:
        if not skipped:
            self.parts -= 1
            if self.parts == 0:
                raise Stopped


class Recorded(Progress):
    """What the job told its progress bar of each chunk: (position, rows, skipped)."""

    def __init__(self) -> None:
        self.chunks: list[tuple[int, int, bool]] = []

    def advance(self, position: int, rows: int, skipped: bool) -> None:
        self.chunks.append((position, rows, skipped))


def killed_at_commit(
    monkeypatch: pytest.MonkeyPatch, bundle: Path, options: BulkOptions, at: Callable[[Path], bool]
) -> None:
    """Run the job until the writer is to commit a file `at` picks, and stop it there, as a kill would."""
    commit = writer._commit

    def killed(path: Path, write: Any) -> None:
        if at(path):
            raise Stopped
        commit(path, write)

    with monkeypatch.context() as patch:
        patch.setattr(writer, "_commit", killed)
        with pytest.raises(Stopped):
            run_job(settings(bundle), options)


def stopped_after(bundle: Path, options: BulkOptions, parts: int) -> None:
    with pytest.raises(Stopped):
        run_job(settings(bundle), options, StopAfter(parts))
    assert not options.output.exists()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"max_chars": 10}, "max_chars"),
        ({"parameters": {"encoding_format": "int8"}}, "parameters"),
        ({"columns": Columns(id="key")}, "columns"),
        ({"long_input": "refuse"}, "long_input"),
        ({}, "input"),  # the input rewritten in place, of the same size
    ],
)
def test_a_stopped_job_resumes_only_as_it_began(
    fp32_bundle: ModelFactory, tmp_path: Path, change: dict[str, Any], said: str
) -> None:
    # Each of these resumed, and the output held rows of two jobs: vectors of two kinds, rows another limit
    # rejected or kept, ids from two columns.
    bundle = fp32_bundle("feature-extraction")
    rows = [{"id": f"d{i}", "key": f"k{i}", "text": f"row {i} of the corpus"} for i in range(50)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    options = BulkOptions(source, tmp_path / "out.parquet", chunk_rows=10)
    stopped_after(bundle, options, 2)
    if not change:
        before = source.stat().st_mtime_ns
        write_jsonl(source, [{**r, "text": r["text"].replace("row", "wor")} for r in rows])
        os.utime(source, ns=(before + 10**9, before + 10**9))
    with pytest.raises(
        InputError, match=f"holds an unfinished job that differs from this one in its {said}; run the same command"
    ):
        run_job(settings(bundle), dataclasses.replace(options, **change))
    if not change:
        return
    bar = Recorded()
    summary = run_job(settings(bundle), options, bar)
    assert summary.resumed and (summary.skipped, summary.rows) == (20, 30)
    # The progress bar's rate counts this run's chunks alone, the earlier run's told apart as skipped.
    assert [(rows, skipped) for _, rows, skipped in bar.chunks] == [(10, True)] * 2 + [(10, False)] * 3
    assert pq.read_table(options.output).column("id").to_pylist() == [f"d{i}" for i in range(50)]
    shown = Console(record=True, width=200)
    shown.print(report(summary))
    assert "20 rows were done by an earlier run" in shown.export_text()


def test_rejects_are_in_row_order_whatever_rejected_them(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    # The reader's rejects (an empty text) and the model's (a text without tokens) of one chunk, as the rows stand.
    bundle = without_special_tokens(fp32_bundle("feature-extraction"), tmp_path / "bundle")
    good = ["the cat sat", "dogs barked loudly"]
    rows = [{"id": i, "text": t} for i, t in zip("abcde", [good[0], " ", "", "\t", good[1]], strict=True)]
    summary = run_job(settings(bundle), BulkOptions(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "o.jsonl"))
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    tokenizer.no_padding()
    assert summary.tokens == sum(len(tokenizer.encode(t)) for t in good) > len(good)
    rejects = [json.loads(line) for line in (tmp_path / "o.rejects.jsonl").read_text().splitlines()]
    assert [(r["row"], r["id"]) for r in rejects] == [(1, "b"), (2, "c"), (3, "d")]
    assert summary.reasons == {"it has no tokens": 2, "its text is an empty string": 1}
    assert summary.rate == summary.to_dict()["rows_per_second"] == 5 / summary.seconds  # rows read, not written


def test_a_job_killed_between_a_chunks_rejects_and_its_part_keeps_every_reject(
    fp32_bundle: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A chunk is done once its part is there: its rejects must be there before, or a kill between the two lost them.
    bundle = fp32_bundle("feature-extraction")
    rows = [{"id": f"d{i}", "text": "" if i % 4 == 0 else f"row {i}"} for i in range(30)]
    options = BulkOptions(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.parquet", chunk_rows=10)
    killed_at_commit(monkeypatch, bundle, options, lambda path: path.name == "rejects-000001.jsonl")
    summary = run_job(settings(bundle), options)
    rejects = [json.loads(line)["id"] for line in (tmp_path / "out.rejects.jsonl").read_text().splitlines()]
    assert rejects == [f"d{i}" for i in range(0, 30, 4)] and summary.rejected == 8
    assert pq.read_table(options.output).column("id").to_pylist() == [f"d{i}" for i in range(30) if i % 4]


def test_overwrite_replaces_the_output_and_its_rejects(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("feature-extraction")
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "fine"}, {"id": "b", "text": ""}])
    out, rejects = tmp_path / "out.jsonl", tmp_path / "out.rejects.jsonl"
    run_job(settings(bundle), BulkOptions(source, out))
    assert rejects.is_file()
    write_jsonl(source, [{"id": "c", "text": "all"}, {"id": "d", "text": "good"}])
    (tmp_path / "out.jsonl.parts").mkdir()  # left by a run stopped before its first part: no leave either
    with pytest.raises(InputError, match=r"out\.jsonl already exists; delete it or pass --overwrite"):
        run_job(settings(bundle), BulkOptions(source, out))
    out.unlink()  # the rejects of the first job alone are in the way too
    with pytest.raises(InputError, match=r"out\.rejects\.jsonl already exists; delete it or pass --overwrite"):
        run_job(settings(bundle), BulkOptions(source, out))
    run_job(settings(bundle), BulkOptions(source, out, overwrite=True))
    assert [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()] == ["c", "d"]
    assert not rejects.exists()  # the first job's rejects are no rows of this output


@pytest.mark.parametrize("name", ["out.ndjson", "out.json", "out.JSONL"])
def test_an_output_named_as_json_lines_is_json_lines(fp32_bundle: ModelFactory, tmp_path: Path, name: str) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": 7, "text": "a"}, {"id": "x", "text": "b"}])
    run_job(settings(fp32_bundle("feature-extraction")), BulkOptions(source, tmp_path / name))
    lines = [orjson.loads(line) for line in (tmp_path / name).read_bytes().splitlines()]
    assert [line["id"] for line in lines] == ["7", "x"]  # a text format's ids are text: 7 written as "7"
    assert all(len(line["embeddings"]) > 1 for line in lines)


def test_a_text_of_exactly_max_chars_runs_and_blank_lines_are_no_rows(tmp_path: Path) -> None:
    source = write_jsonl(
        tmp_path / "in.jsonl", [{"text": "abcde"}, b"\n", b"  \r\n", {"text": "abcdef"}, {"text": "ab"}]
    )
    [chunk] = Corpus(source, Columns(), pairs=False).chunks(100, 5)
    assert chunk.ids == [0, 2] and chunk.values == [["abcde", "ab"]]
    assert [(r.row, r.reason) for r in chunk.rejects] == [
        (1, "its text is 6 characters long, over the limit of 5 (--max-chars)")
    ]


def test_a_param_is_read_as_json(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    # -p dimensions=8: the number 8, not the text "8".
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}, {"text": "b"}])
    out = tmp_path / "o.parquet"
    assert (
        hare(
            [
                "run",
                str(fp32_bundle("feature-extraction")),
                "-i",
                str(source),
                "-o",
                str(out),
                "-q",
                "-p",
                "dimensions=8",
            ]
        )
        == 0
    )
    assert pq.read_table(out).schema.field("embeddings").type.list_size == 8


def test_a_new_job_in_a_folder_without_parts_keeps_none_of_its_files(
    fp32_bundle: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run killed after its first chunk's rejects and before its part: the job begun again otherwise takes the
    # folder over, and that run's rejects were merged into its own.
    bundle = fp32_bundle("feature-extraction")
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": ""}, {"id": "b", "text": "fine"}])
    options = BulkOptions(source, tmp_path / "out.parquet")
    killed_at_commit(monkeypatch, bundle, options, lambda path: path.name.startswith("part-"))
    summary = run_job(settings(bundle), dataclasses.replace(options, columns=Columns(text="id")))
    assert pq.read_table(options.output).column("id").to_pylist() == ["a", "b"]
    assert summary.rejected == 0 and not options.rejects_path.exists()


def test_token_vectors_are_float32_lists_of_fixed_size_lists(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "the cat"}, {"text": "the cat sat on a mat"}])
    options = BulkOptions(source, tmp_path / "o.parquet", parameters={"output_value": "token_embeddings"})
    run_job(settings(fp32_bundle("feature-extraction")), options)
    kind = pq.read_schema(options.output).field("embeddings").type
    assert pa.types.is_list(kind) and pa.types.is_fixed_size_list(kind.value_type)
    assert kind.value_type.value_type == pa.float32()
    lengths = [len(tokens) for tokens in pq.read_table(options.output).column("embeddings").to_pylist()]
    assert lengths[0] < lengths[1]


def test_an_asked_output_format_is_written_whatever_the_name(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "the cat"}])
    run_job(settings(fp32_bundle("feature-extraction")), BulkOptions(source, tmp_path / "o.out", output_format="jsonl"))
    assert orjson.loads((tmp_path / "o.out").read_bytes())["id"] == "a"
