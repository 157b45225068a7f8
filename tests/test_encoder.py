"""The encoder's short cut past BERT's normalizer (api/engine/encoder.py): a clean ASCII text, lowered in Python
and tokenized without the normalizer, gets exactly the encoding the full tokenizer gives it (ids, offsets into
the text as sent, masks, truncation), on the default model's uncased tokenizer and a cased copy; any other text
takes the full tokenizer."""

from __future__ import annotations

import json
import random
import string

import pytest
from tokenizers import Encoding, Tokenizer

from api.engine.encoder import Encoder
from container.defaults import default_model_dir
from tasks.base import Inputs

ALPHABET = string.ascii_letters + string.digits + string.punctuation + " " * 12 + "\t\n\r"


def tokenizers() -> list[tuple[str, Tokenizer]]:
    uncased = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    config = json.loads(uncased.to_str())
    config["normalizer"]["lowercase"] = False
    return [("uncased", uncased), ("cased", Tokenizer.from_str(json.dumps(config)))]


def texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    words = ["Hello", "WORLD", "naïve", "don't", "e-mail", "A.B.C", "x1y2", "##ing", "[CLS]", "Paris"]
    out = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 400))) for _ in range(40)]
    out += [" ".join(rng.choice(words[:2] + words[3:]) for _ in range(rng.randint(1, 200))) for _ in range(20)]
    out += ["naïve café", "tab\there", "bell\x07inside", "vertical\x0btab", "del\x7fchar", "ＦＵＬＬ width"]
    return out


def fields(e: Encoding, offsets: bool) -> tuple[object, ...]:
    """What the server reads of an encoding (offsets and tokens only where a task tracks them)."""
    spans = (e.offsets, e.tokens) if offsets else ()
    return (e.ids, e.type_ids, e.attention_mask, e.special_tokens_mask, len(e.overflowing), *spans)


@pytest.mark.parametrize("offsets", [True, False])
def test_every_text_gets_the_full_tokenizers_encoding(offsets: bool) -> None:
    for name, tokenizer in tokenizers():
        reference = Tokenizer.from_str(tokenizer.to_str())
        reference.no_padding()
        reference.enable_truncation(max_length=128)
        encoder = Encoder(tokenizer, 128, windows=False, offsets=offsets)
        for seed in range(3):
            batch = texts(seed)
            for one in batch:  # alone (the common request), then all together
                (got,) = encoder.encode(Inputs([one], single=True)).sequences
                assert fields(got, offsets) == fields(reference.encode(one), offsets), (name, one)
            encoded = encoder.encode(Inputs(batch, single=False))
            want = reference.encode_batch(batch)
            for text, got, expected in zip(batch, encoded.sequences, want, strict=True):
                assert fields(got, offsets) == fields(expected, offsets), (name, text)
            assert encoded.truncated == [bool(e.overflowing) for e in want]


def test_only_bert_normalizers_take_the_short_cut() -> None:
    uncased = tokenizers()[0][1]
    assert Encoder(Tokenizer.from_str(uncased.to_str()), 128, windows=False)._plain is not None
    config = json.loads(uncased.to_str())
    config["normalizer"] = {"type": "NFKC"}  # another normalizer changes ASCII too (e.g. ligatures aside)
    assert Encoder(Tokenizer.from_str(json.dumps(config)), 128, windows=False)._plain is None
