"""`hare bench bulk` (bench/bulk.py): its corpus has the lengths it promises, and its figures come from real
runs of the model alone and of `hare run` on a tiny bundle."""

from __future__ import annotations

from bench.bulk import corpus, measure, rows
from bench.inputs import load_tokenizer
from tests.conftest import ModelFactory


def test_the_corpus_runs_from_shortest_to_longest(fp32_bundle: ModelFactory) -> None:
    tok = load_tokenizer(fp32_bundle("feature-extraction") / "tokenizer.json")
    lengths = [len(e.ids) for e in tok.encode_batch(corpus(tok, 300, 10, 60))]
    assert min(lengths) >= 9 and max(lengths) <= 61  # a cut at a token boundary may merge or split one token
    assert min(lengths) <= 15 and max(lengths) >= 55


def test_measure_runs_the_model_alone_and_hare_run(fp32_bundle: ModelFactory) -> None:
    figures = measure(fp32_bundle("feature-extraction"), 200, None, streams=2)
    assert figures.rows == 200 and figures.tokens > 200 * 9
    assert figures.model_only.rows_per_s > 0 and figures.hare.rows_per_s > 0 and figures.hare.cpu_per_1000 > 0
    assert figures.rss_quarter_mb > 50 and 50 < figures.rss_mb < 2000  # the child's own peak, not the parent's
    assert figures.torch is None and [what for what, _ in rows(figures)][:3] == ["texts", "model-only", "hare run"]
