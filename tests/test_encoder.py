"""The encoder's short cut past BERT's normalizer (api/engine/encoder.py): a clean ASCII text, lowered in Python
and tokenized without the normalizer, gets exactly the encoding the full tokenizer gives it (ids, offsets into
the text as sent, masks, truncation), on the default model's uncased tokenizer and a cased copy; any other text
takes the full tokenizer."""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable

import numpy as np
import pytest
from tokenizers import Encoding, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from api.engine.encoder import Encoded, Encoder
from container.defaults import default_model_dir
from tasks.base import Inputs, LongInput, Side

# Qwen2's (and Qwen3's) pre-tokenizer split: punctuation takes the newlines after it.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ALPHABET = string.ascii_letters + string.digits + string.punctuation + " " * 12 + "\t\n\r"


def tokenizers() -> list[tuple[str, Tokenizer]]:
    uncased = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    config = json.loads(uncased.to_str())
    config["normalizer"]["lowercase"] = False
    return [("uncased", uncased), ("cased", Tokenizer.from_str(json.dumps(config)))]


def cutting(tokenizer: Tokenizer, max_length: int) -> Tokenizer:
    """A copy of `tokenizer` as the server's would be without its short cuts: unpadded, cut at `max_length`."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    copy.enable_truncation(max_length=max_length)
    return copy


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


def spans(e: Encoding, begin: int = 0) -> list[tuple[int, int]]:
    """Each content token's offsets into the text as sent, where the encoding read it from `begin` (an end read
    alone: Encoded.begins); a special token's as they are (in no text)."""
    marks = zip(e.offsets, e.special_tokens_mask, strict=True)
    return [(start, end) if special else (start + begin, end + begin) for (start, end), special in marks]


def text_spans(got: Encoded) -> list[list[tuple[int, int]]]:
    """Each single text's spans (one sequence each) as the task reads them."""
    return [spans(e, got.begins.get(i, 0)) for i, e in enumerate(got.sequences)]


@pytest.mark.parametrize("offsets", [True, False])
def test_every_text_gets_the_full_tokenizers_encoding(offsets: bool) -> None:
    for name, tokenizer in tokenizers():
        reference = cutting(tokenizer, 128)
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


def long_texts(seed: int) -> list[str]:
    """Texts far past 16 characters a token of a 32-token model: words, numbers and marks with every kind of
    space between them, and the starts that hold too few tokens (a run of spaces, one giant word)."""
    rng = random.Random(seed)
    words = [
        "Hello",
        "world",
        "naïve",
        "don't",
        "e-mail",
        "3.14159",
        "1234567",
        "Ünïcødé",
        "東京",
        "🙂",
        "x.y",
        "##ing",
    ]
    gaps = [" ", " ", " ", "  ", "\n", "\n\n", "\t", ". ", ", ", ".\n", " - ", "? "]
    out = []
    for _ in range(12):
        parts = [rng.choice(words) + rng.choice(gaps) for _ in range(rng.randint(150, 700))]
        out.append("".join(parts))
    for _ in range(12):  # about 16 characters a token: the start holds about as many tokens as the model reads
        out.append("".join(
            rng.choice(words) + rng.choice([".", ",", ""]) + rng.choice(["\n", " "]) * rng.randint(8, 14)
            for _ in range(rng.randint(80, 120))
        ))  # fmt: skip
    out += [" " * 2000 + "late words " * 40, "x" * 3000 + " tail", "word " * 20 + "\n" * 3000 + "more " * 30]
    return out


def splitting_tokenizers() -> list[tuple[str, Tokenizer]]:
    """The default model's tokenizers, the tests' tiny byte-level BPE, WordPiece and Unigram (Metaspace) ones,
    Qwen's split, and the byte-level BPE behind RoBERTa's offset-trimming post-processor."""
    from tests.tiny_models import SPECIALS, _post_processor, _tokenizer

    made = []
    for kind, specials in [("bpe", "decoder"), ("wordpiece", "bert"), ("unigram", "roberta")]:
        tok = _tokenizer(kind, SPECIALS[specials])
        _post_processor(tok, specials)
        made.append((kind, tok))
    # Byte-level BPE split as Qwen's and Llama 3's tokenizer.json do, trained where marks end lines (its ".\n\n"
    # is one token, as in Qwen's vocabulary: a start cut before a newline would end on "." instead).
    qwen = Tokenizer(models.BPE())
    qwen.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN_SPLIT), "isolated"), pre_tokenizers.ByteLevel(use_regex=False)]
    )
    qwen.decoder = decoders.ByteLevel()
    lines = [f"{w}{mark}\n\n" for w in ("Hello", "world", "naïve", "e-mail") for mark in ".,!?"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    qwen.train_from_iterator(lines * 20, trainer)
    _post_processor(qwen, "decoder")
    # RoBERTa's post-processor, which trims each token's offsets to leave out the space before it.
    roberta = Tokenizer.from_str(made[0][1].to_str())
    eos = roberta.token_to_id("<|endoftext|>")
    assert eos is not None
    end = ("<|endoftext|>", eos)
    roberta.post_processor = processors.RobertaProcessing(end, end, trim_offsets=True, add_prefix_space=False)
    return tokenizers() + made + [("qwen", qwen), ("roberta", roberta)]


@pytest.mark.parametrize("offsets", [True, False])
def test_a_long_text_cut_at_the_maximum_is_read_by_its_start_with_the_same_encoding(offsets: bool) -> None:
    for name, tokenizer in splitting_tokenizers():
        reference = cutting(tokenizer, 32)
        encoder = Encoder(tokenizer, 32, windows=False, offsets=offsets)
        assert encoder._start_at == 32 * 16, name  # these tokenizers split at spaces: the start is read first
        for seed in range(2):
            batch = long_texts(seed)
            assert any(len(encoder._start(t)) < len(t) // 2 for t in batch)  # the short cut is taken
            encoded = encoder.encode(Inputs(batch, single=False))
            for text, got in zip(batch, encoded.sequences, strict=True):
                want = reference.encode(text)
                spans = (got.offsets, got.tokens) == (want.offsets, want.tokens) if offsets else True
                assert (got.ids, got.type_ids, got.attention_mask, got.special_tokens_mask) == (
                    want.ids,
                    want.type_ids,
                    want.attention_mask,
                    want.special_tokens_mask,
                ), (name, text[:80])
                assert spans, (name, text[:80])
            whole = reference.encode_batch(batch)
            assert encoded.truncated == [bool(e.overflowing) for e in whole]
            assert encoded.tokens == sum(len(e) for e in whole)
        # The rule itself, apart from its margin: starts that end anywhere, so that the cut falls within the
        # tokens the model reads (a start cut mid-word fails here).
        for text in long_texts(7)[12:15]:
            expected = reference.encode(text).ids
            for encoder._start_at in range(40, 400, 3):
                (got,) = encoder.encode(Inputs([text], single=True)).sequences
                assert got.ids == expected, (name, encoder._start_at, text[:80])


def test_a_tokenizer_that_reads_across_spaces_reads_every_text_whole() -> None:
    """Where the words before a space could tokenize otherwise for what follows it, no start is read first."""
    across = [
        ("pre_tokenizer", None),  # one word, the whole text
        ("pre_tokenizer", {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}),
        ("pre_tokenizer", {"type": "Digits", "individual_digits": False}),  # splits digits only
        ("pre_tokenizer", {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": False}),
        ("pre_tokenizer", {"type": "Split", "pattern": {"String": "\n"}, "behavior": "Removed", "invert": False}),
        (
            "pre_tokenizer",
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
        ),
        ("normalizer", {"type": "Replace", "pattern": {"String": "a b"}, "content": "ab"}),
        ("normalizer", {"type": "Replace", "pattern": {"String": " "}, "content": ""}),  # words run together
    ]
    for key, value in across:
        config = json.loads(tokenizers()[0][1].to_str())
        config[key] = value
        assert Encoder(Tokenizer.from_str(json.dumps(config)), 32, windows=False)._start_at == 0, value
    spaces = {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}  # XLM-R's, after its charsmap
    config = json.loads(tokenizers()[0][1].to_str())
    config["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, spaces]}
    assert Encoder(Tokenizer.from_str(json.dumps(config)), 32, windows=False)._start_at == 32 * 16


def test_a_long_document_to_be_cut_beside_its_query_is_read_by_its_start_with_the_same_encoding() -> None:
    """A ranking pair: the document's start is read first, and the pair cut to the maximum as the whole document
    gives it (as transformers' tokenizers cut a pair), for documents of every length around the start's and
    queries shorter and longer than the room's half."""
    for name, tokenizer in splitting_tokenizers():
        encoder = Encoder(Tokenizer.from_str(tokenizer.to_str()), 32, windows=False)
        whole = Encoder(Tokenizer.from_str(tokenizer.to_str()), 32, windows=False)
        whole._start_at = 0  # every document read whole: the encoding before starts were read first
        documents = long_texts(3)[9::2]  # every kind of long text, half of them: each read whole here is slow
        for query in ["what is naïve?", "a longer question " * 6]:
            want = whole.encode(Inputs(documents, single=False, query=query))
            for encoder._start_at in (512, *range(40, 400, 23)):
                got = encoder.encode(Inputs(documents, single=False, query=query))
                for a, b in zip(got.sequences, want.sequences, strict=True):
                    assert (a.ids, a.type_ids, a.offsets) == (b.ids, b.type_ids, b.offsets), (name, encoder._start_at)
                assert (got.truncated, got.tokens) == (want.truncated, want.tokens), name


def test_a_pair_is_cut_as_transformers_cuts_it() -> None:
    """A classifier's (text, text_pair) and a ranking's (query, document) too long for the model keep the tokens
    transformers' tokenizers keep (truncation=True, "longest_first"): the shorter text whole where it takes at
    most half the room, else half each, the longer one an odd room's extra token."""
    for name, tokenizer in splitting_tokenizers():
        reference = Tokenizer.from_str(tokenizer.to_str())
        reference.no_padding()  # the default model's tokenizer pads to 128
        for max_length in (31, 32):  # rooms of 28 and 29 tokens beside BERT's three special tokens
            encoder = Encoder(Tokenizer.from_str(tokenizer.to_str()), max_length, windows=True)
            reference.enable_truncation(max_length, strategy="longest_first")
            for first, second in [(5, 40), (40, 5), (20, 22), (22, 20), (30, 30), (14, 14), (15, 40), (3, 3)]:
                a, b = " ".join(["cat"] * first), " ".join(["dog"] * second)
                want = reference.encode(a, b)
                (got,) = encoder.encode(Inputs([a], single=True, pairs=[b])).sequences
                assert (got.ids, got.type_ids) == (want.ids, want.type_ids), (name, max_length, first, second)
                (ranked,) = encoder.encode(Inputs([b], single=False, query=a)).sequences
                assert ranked.ids == want.ids, (name, max_length, first, second)


def test_a_text_read_in_windows_has_the_spans_of_the_whole_text() -> None:
    """Every token of a text read in windows sits at the span the whole text's encoding gives it. RoBERTa's
    post-processor trims offsets, and the windows' content, encoded apart and trimmed, was trimmed again when
    each window got its special tokens: the "Ġw" of " weather" became an empty span at the "e"."""
    from tasks.windows import content_tokens

    for name, tokenizer in splitting_tokenizers():
        whole = Tokenizer.from_str(tokenizer.to_str())
        whole.no_padding()
        whole.no_truncation()
        encoder = Encoder(Tokenizer.from_str(tokenizer.to_str()), 32, windows=True)
        for text in ["The weather in Paris is cold today.", *long_texts(5)[:3]]:
            want = whole.encode(text)
            content = [o for o, special in zip(want.offsets, want.special_tokens_mask, strict=True) if not special]
            for stride in (0, 8):
                (windows,) = encoder.encode(Inputs([text], single=True), LongInput("window", stride=stride)).windows
                rows = [np.zeros((len(w), 1), np.float32) for w in windows]
                assert content_tokens(windows, rows, stride).offsets == content, (name, stride, text[:20])


@pytest.mark.parametrize("offsets", [True, False])
def test_a_text_cut_on_the_left_keeps_the_tokens_tokenizers_keeps(offsets: bool) -> None:
    """truncation_direction Left: a long text keeps its last tokens, a pair loses tokens from the start of each
    member, as `tokenizers`' own left truncation (transformers' truncation_side "left") gives them, offsets into
    the text as sent (a long text's end read alone, its offsets moved by where it begins); a text that fits is
    untouched."""
    left = LongInput("truncate", side="left")
    for name, tokenizer in splitting_tokenizers():
        reference = Tokenizer.from_str(tokenizer.to_str())
        reference.no_padding()
        reference.enable_truncation(32, strategy="longest_first", direction="left")
        encoder = Encoder(Tokenizer.from_str(tokenizer.to_str()), 32, windows=True, offsets=offsets)
        singles = [*long_texts(4)[:6], "a short text", "naïve café " * 40]
        got = encoder.encode(Inputs(singles, single=False), left)
        for text, enc in zip(singles, got.sequences, strict=True):
            want = reference.encode(text)
            assert fields(enc, offsets)[:4] == fields(want, offsets)[:4], name
        assert not offsets or text_spans(got) == [spans(reference.encode(t)) for t in singles], name
        assert got.begins, name  # long texts read by their ends
        assert got.truncated == [len(reference.encode(t).overflowing) > 0 for t in singles], name
        assert got.tokens == sum(len(e) for e in got.sequences)
        for first, second in [(5, 40), (40, 5), (22, 20), (30, 30)]:
            a = " ".join(f"cat{i % 7}" for i in range(first))
            b = " ".join(f"dog{i % 5}" for i in range(second))
            want = reference.encode(a, b)
            (pair,) = encoder.encode(Inputs([a], single=True, pairs=[b]), left).sequences
            assert (pair.ids, pair.type_ids) == (want.ids, want.type_ids), (name, first, second)
            (ranked,) = encoder.encode(Inputs([b * 30], single=False, query=a), left).sequences
            assert ranked.ids == reference.encode(a, b * 30).ids, (name, first, second)


def ends_apart() -> list[tuple[str, Tokenizer]]:
    """Tokenizers that read a text's end alone with a first word the whole text reads otherwise: a SentencePiece
    kind that prepends "▁" to the text as Llama's normalizer does, and Qwen's byte-level BPE behind a normalizer
    that strips the text's leading spaces (the end's first word loses its "Ġ" and its merges)."""
    from tokenizers import normalizers

    made = dict(splitting_tokenizers())
    prepend = Tokenizer.from_str(made["unigram"].to_str())
    prepend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    prepend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    strip = Tokenizer.from_str(made["qwen"].to_str())
    strip.normalizer = normalizers.Strip(left=True, right=False)
    strip.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return [("prepend", prepend), ("strip", strip)]


@pytest.mark.slow  # eight tokenizers, every margin (test_a_text_cut_on_the_left_keeps_... is the quick run's)
@pytest.mark.parametrize("offsets", [True, False])
def test_a_long_text_cut_on_the_left_is_read_by_its_end_with_the_same_encoding(offsets: bool) -> None:
    """truncation_direction Left on a text far longer than the model reads: its end alone is tokenized, with
    tokenizers' own left cut of the whole text (offsets into the text as sent, an end's moved by where it begins)."""
    left = LongInput("truncate", side="left")
    for name, tokenizer in splitting_tokenizers() + ends_apart():
        reference = cutting(tokenizer, 32)
        reference.enable_truncation(32, direction="left")
        encoder = Encoder(Tokenizer.from_str(tokenizer.to_str()), 32, windows=False, offsets=offsets)
        assert encoder._start_at == 32 * 16, name
        read: list[str] = []  # the texts the encoder tokenized one by one

        def logged(text: str, log: list[str] = read, content: Callable[[str], Encoding] = encoder._content) -> Encoding:
            log.append(text)
            return content(text)

        encoder._content = logged  # type: ignore[method-assign]
        for seed in range(1 if offsets else 2):
            batch = long_texts(seed)
            got = encoder.encode(Inputs(batch, single=False), left)
            for text, enc in zip(batch, got.sequences, strict=True):
                want = reference.encode(text)
                assert fields(enc, offsets)[:4] == fields(want, offsets)[:4], name
            assert not offsets or text_spans(got) == [spans(reference.encode(t)) for t in batch], name
            assert got.truncated == [bool(reference.encode(t).overflowing) for t in batch], name
        ends = [t for t in read if len(t) < 2 * 32 * 16]
        assert len(ends) > 10, (name, len(ends))  # most long texts are read by their ends
        # The rule apart from its margin: ends that begin anywhere, so that the cut falls within the tokens kept
        # (an end begun mid-word, or a first word kept where it reads otherwise, fails here).
        for text in long_texts(7)[12:15] if not offsets else long_texts(7)[12:13]:
            want = reference.encode(text)
            for encoder._start_at in range(40, 400, 7):
                got = encoder.encode(Inputs([text], single=True), left)
                assert got.sequences[0].ids == want.ids, (name, encoder._start_at, text[-80:])
                assert not offsets or text_spans(got) == [spans(want)], (name, encoder._start_at, text[-80:])


@pytest.mark.slow  # eight tokenizers, every margin (test_a_text_cut_on_the_left_keeps_... is the quick run's)
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_long_document_cut_beside_its_query_or_to_a_token_cap_is_read_by_one_end(side: Side) -> None:
    """A ranking's long document cut on either side, and texts and documents cut to a request's own token cap
    (Cohere's max_tokens, max_tokens_per_doc), read by their ends give what the whole texts give."""
    for name, tokenizer in splitting_tokenizers() + ends_apart():
        encoder = Encoder(Tokenizer.from_str(tokenizer.to_str()), 32, windows=False)
        whole = Encoder(Tokenizer.from_str(tokenizer.to_str()), 32, windows=False)
        whole._start_at = 0  # every text read whole
        documents = long_texts(3)[9::2]  # every kind of long text, half of them: each read whole here is slow
        cases = [
            (LongInput("truncate", side=side, text_tokens=9), Inputs(documents, single=False, query="what is naïve?")),
            (LongInput("truncate", side=side, text_tokens=9), Inputs(documents, single=False)),
        ]
        if side == "left":  # the right side's: test_a_long_document_to_be_cut_beside_its_query_...
            cases += [
                (LongInput("truncate", side=side), Inputs(documents, single=False, query=q))
                for q in ["what is naïve?", "a longer question " * 6]
            ]
        for long_input, inputs in cases:
            want = whole.encode(inputs, long_input)
            for encoder._start_at in (512, 40, 211):
                got = encoder.encode(inputs, long_input)
                for a, b in zip(got.sequences, want.sequences, strict=True):
                    assert (a.ids, a.type_ids) == (b.ids, b.type_ids), (name, long_input, encoder._start_at)
                assert (got.truncated, got.tokens) == (want.truncated, want.tokens), name
