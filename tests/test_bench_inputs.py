"""Inputs with exact token counts for each tokenizer family, Comet's sentences, and /predict bodies."""

from __future__ import annotations

import json

import pytest

from bench.inputs import MIX_WORDS, TextMaker, comet_texts, load_tokenizer, make_bodies, mixed_texts
from tests.conftest import ModelFactory


@pytest.mark.parametrize("arch", ["bert", "roberta", "xlm-roberta"])
def test_exact_token_counts(tiny_model: ModelFactory, arch: str) -> None:
    tok = load_tokenizer(tiny_model("text-classification", arch))
    maker = TextMaker(tok, seed=3)
    for n in (4, 8, 16, 57):
        texts = maker.texts(n, 40)
        if n >= 8:  # two-word texts from a 300-word toy vocabulary repeat by chance
            assert len(set(texts)) >= 38, "inputs must vary per request"
        assert {len(e.ids) for e in tok.encode_batch(texts)} == {n}
    pairs = maker.pairs(24, 10)
    assert {len(e.ids) for e in tok.encode_batch(pairs)} == {24}


def test_comet_sentences_have_45_to_55_words() -> None:
    texts = comet_texts(50, seed=1)
    assert all(45 <= len(t.split()) <= 55 for t in texts)
    assert len(set(texts)) > 40


def test_the_mix_is_mostly_short_texts_with_a_long_tail() -> None:
    words = [len(t.split()) for t in mixed_texts(2000, seed=1)]
    assert MIX_WORDS[0] <= min(words) and max(words) <= MIX_WORDS[1]
    assert 15 <= sorted(words)[len(words) // 2] <= 30  # most are short
    assert sum(w > 60 for w in words) > 40 and len(set(words)) > 60  # and many lengths, some long
    assert mixed_texts(50, seed=1) == mixed_texts(2000, seed=1)[:50]  # a point's first texts are any other's


def test_bodies_per_task(tiny_model: ModelFactory) -> None:
    maker = TextMaker(load_tokenizer(tiny_model("text-classification")))
    single = make_bodies("text-classification", 1, 8, maker, count=10)
    assert len(single.bodies) == 10 and isinstance(json.loads(single.bodies[0])["inputs"], str)
    batched = make_bodies("feature-extraction", 4, 16, maker, count=10)
    inputs = json.loads(batched.bodies[0])["inputs"]
    assert isinstance(inputs, list) and len(inputs) == 4 and batched.tokens_per_sequence == 16
    ranking = make_bodies("text-ranking", 3, 20, maker, count=10)
    body = json.loads(ranking.bodies[0])["inputs"]
    assert set(body) == {"query", "documents"} and len(body["documents"]) == 3
    assert all(len(maker.tok.encode(body["query"], d).ids) == 20 for d in body["documents"])
    comet = make_bodies("text-classification", 1, "comet", maker, count=10)
    assert comet.tokens_per_sequence > 45
    mix = make_bodies("feature-extraction", 2, "mix", maker, count=100)
    lengths = [len(maker.tok.encode(t).ids) for b in mix.bodies for t in json.loads(b)["inputs"]]
    assert mix.tokens_per_sequence == pytest.approx(sum(lengths) / len(lengths))
    ranked = [json.loads(b)["inputs"] for b in make_bodies("text-ranking", 3, "mix", maker, count=40).bodies]
    assert all(len(r["documents"]) == 3 and 0 < len(r["query"]) <= 60 for r in ranked)
    assert len({len(d.split()) for r in ranked for d in r["documents"]}) > 20  # documents of the mix's lengths
