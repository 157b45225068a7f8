"""Texts to token sequences with the bundle's Rust tokenizer: truncation (and knowing it happened), windows
over long texts, and (query, document) pairs.

Two copies of the tokenizer: one truncating at the model's maximum (the common path, one call per request)
and one that never truncates, for windows, pairs and measuring how long a refused input was. Both are
thread-safe, so large requests can be tokenized off the event loop. Character offsets are tracked only for a
task whose answer has spans (TaskSpec.offsets): they cost a fifth of the tokenizer's time.

BERT's normalizer (cleaning, CJK spacing, accents, lowercasing) took half of the tokenizer's time on a
128-token English text (96 of 203 us, AMD EPYC, tokenizers 0.23), and on plain ASCII it is only `str.lower`
(or nothing, for a cased model): such texts go to a third copy without the normalizer, lowered in Python
first, with the same ids and offsets (tests/test_encoder.py compares them on random ASCII). A text that could
hold one of the tokenizer's added tokens ([CLS], [MASK] ...: matched on the text as sent, before
lowercasing) keeps the full path. On such text BERT's pre-tokenizer (split at whitespace, each punctuation
mark a word) is one regex over ASCII classes, which that copy runs instead: the 128-token text's encoding
took 61-69 us against 88-92 with BERT's (AMD EPYC, tokenizers 0.23).

A text to be cut that is far longer than the model reads is tokenized by its start first: the text up to a space,
about PREFIX_CHARS_PER_TOKEN characters a token of the model's maximum. Where the tokenizer splits words at spaces
and normalizes characters in place (`_splits_at_spaces`: BERT's, byte-level BPE's, the SentencePiece kinds; its
pre-tokenizer is tried on a text of every kind of gap), the start's tokens are the whole text's first ones, so when
the start alone overflows the maximum its cut is the text's cut; when it does not (long runs of spaces, words of
hundreds of characters), the whole text is tokenized. A 1 MB text took 240-285 ms to tokenize for MiniLM's 256
tokens. A text cut at its start instead (truncation_direction Left) is read by its end the same way, from a space:
the words after a space tokenize alike whatever precedes it, but for the end's first word (a normalizer's
Prepend or Strip reads it as a text's first), so the end serves where its kept tokens leave that word out. Its offsets
are into the end: where it begins in the text comes with it (Encoded.begins), for the spans of a task that reads
offsets. The same ends serve a request's own cap on a text's tokens (Cohere's max_tokens, max_tokens_per_doc).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tokenizers import Encoding, Regex, Tokenizer, pre_tokenizers
from tokenizers.pre_tokenizers import PreTokenizer

from tasks.base import TRUNCATE, Inputs, LongInput, Side, Vocab
from tasks.errors import InputError, InputTooLong

# Why a text was refused (a request's 400) or rejected (a bulk row): nothing of it reaches the model.
NO_TOKENS = (
    "has no tokens: the model's tokenizer drops every character of it (whitespace, zero-width or control "
    "characters) and adds none of its own"
)

# ASCII that BERT's clean_text changes beyond spacing: control characters, which it drops (\t, \n and \r it
# turns into spaces, which the pre-tokenizer splits on either way).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# BERT's pre-tokenizer on the rest: runs of letters and digits are words, every other character but whitespace
# (ASCII punctuation, all of it BERT's) is a word of its own, whitespace is dropped.
_BERT_ASCII_WORDS = r"[A-Za-z0-9]+|[^A-Za-z0-9 \t\n\r]"
PREFIX_CHARS_PER_TOKEN = 16  # a text longer than this many characters a token of the maximum is read by its start
# Normalizers that change characters where they are (or whitespace only) and pre-tokenizers that end a word at
# a space: with both, the words before a space are the same whatever follows it.
_IN_PLACE = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "Precompiled", "Strip",
             "Prepend"}  # fmt: skip
# Words, numbers and marks with every kind of gap, on which a pre-tokenizer shows whether it ends words at spaces.
_GAPS = "Hello world, don't  stop.\nNew line\t42 3.14 café\u00a0東京 -- end.  \n\n  x"
_AT_SPACES = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Metaspace", "ByteLevel", "Split", "Punctuation",
              "Digits"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Encoded:
    """A request's sequences. windows: per input, its encodings; sequences: all of them, flat, in order;
    tokens: real tokens over all sequences (special tokens included); begins: for an input read by its end alone
    (a single text cut on the left), the character of its text where that end begins: its offsets are into it."""

    windows: list[list[Encoding]]
    truncated: list[bool]
    sequences: list[Encoding]
    tokens: int
    begins: dict[int, int] = field(default_factory=dict)

    def blank(self) -> list[int]:
        """The inputs that have no tokens at all (only a window can be empty where the first is)."""
        return [i for i, w in enumerate(self.windows) if not len(w[0])]


class Encoder:
    def __init__(self, tokenizer: Tokenizer, max_length: int, windows: bool, offsets: bool = True) -> None:
        tokenizer.no_padding()  # the batcher pads per batch, never to a fixed length
        tokenizer.enable_truncation(max_length=max_length)
        self._cut = tokenizer
        text = tokenizer.to_str()  # read once: the copies below and the checks of its parts
        config = json.loads(text)
        self._whole = Tokenizer.from_str(text)
        self._whole.no_truncation()
        # What adds the special tokens to content encoded apart (self._content, windows, cut ends and pairs): the
        # whole tokenizer, but where its post-processor trims offsets (RoBERTa's, byte-level BPE's) one that
        # does not, as encoding the content trimmed them already; trimmed twice, a token after a space lost its
        # first character ("Ġw" of " weather" became an empty span).
        self._join = _without_trimming(json.loads(text)) or self._whole
        self.max_length = max_length
        # A window's content tokens: the model's maximum less a single text's special tokens.
        self.window_tokens = max_length - tokenizer.num_special_tokens_to_add(False)
        self._pair_budget = max_length - tokenizer.num_special_tokens_to_add(True)
        self._may_be_blank = not all(tokenizer.num_special_tokens_to_add(pair) for pair in (False, True))
        self._hint = ', or "long_input": "window" to read all of it' if windows else ""
        self._offsets = offsets
        self._plain, self._lower = _without_bert_normalizer(text, config)
        # The characters an added token starts with, either case: a text without them holds none.
        added = tokenizer.get_added_tokens_decoder().values()
        self._added = frozenset(c for t in added for c in _cases(t.content))
        local = _splits_at_spaces(config, tokenizer.pre_tokenizer) and not any(" " in t.content for t in added)
        self._start_at = max_length * PREFIX_CHARS_PER_TOKEN if local else 0

    @property
    def whole(self) -> Tokenizer:
        """The tokenizer that never truncates (for /tokenize and /decode)."""
        return self._whole

    def encode(self, inputs: Inputs, long_input: LongInput = TRUNCATE, keep_blank: bool = False) -> Encoded:
        """Encode a request's inputs, a long text cut, refused or read in windows as `long_input` says. Windows
        are a single text's (transformers reads no pair in windows either): a long pair asked for them is cut.
        An input without a single token is refused (InputError), or with `keep_blank` kept (Encoded.blank)."""
        encoded = self._encode_inputs(inputs, long_input)
        # A sequence of no tokens fails the model (ONNX Runtime's Reshape) or, batched, reads only padding: only a
        # tokenizer that adds no special tokens can give one (of whitespace, zero-width characters), so only its
        # encodings are looked at.
        if self._may_be_blank and not keep_blank and (blank := encoded.blank()):
            raise InputError(f"{_namer(inputs)(blank[0])} {NO_TOKENS}; send some text")
        return encoded

    def _encode_inputs(self, inputs: Inputs, long_input: LongInput) -> Encoded:
        truncate = long_input.mode != "refuse"
        if inputs.query is not None:
            query = [inputs.query] * len(inputs.texts)
            return self._pairs(query, inputs.texts, truncate, long_input, _namer(inputs))
        if inputs.pairs is not None:
            return self._pairs(inputs.texts, inputs.pairs, truncate, long_input, _namer(inputs))
        if long_input.mode == "window":
            return self._windows(inputs.texts, long_input.stride)
        cap = long_input.text_tokens
        if cap is not None and cap < self.window_tokens:
            return self._capped_singles(inputs, truncate, long_input.side, cap)
        return self._singles(inputs, truncate, long_input.side)

    def _singles(self, inputs: Inputs, truncate: bool, side: Side = "right") -> Encoded:
        """Single texts: each cut at the maximum (the right side's way, which also tells which overflow), one that
        overflows refused, or, to lose its start instead (`side` left), read whole and its last tokens kept."""
        whole = inputs.texts
        texts = [self._start(t) for t in whole] if truncate and self._start_at else whole
        cut = self._cut
        if self._plain is not None and all(self._plain_ascii(t) for t in texts):
            # Offsets stay those of the text as sent: ASCII lowercasing keeps every character in its place.
            texts, cut = [t.lower() for t in texts] if self._lower else texts, self._plain
        encodings = self._encode(cut, texts)
        truncated = [False] * len(encodings)
        begins: dict[int, int] = {}
        tokens = 0
        for i, enc in enumerate(encodings):
            overflows = self._overflows(enc)
            if not overflows and len(texts[i]) < len(whole[i]):  # its start held less than the model reads
                enc = encodings[i] = self._encode(self._cut, [whole[i]])[0]
                overflows = self._overflows(enc)
            if overflows:
                if not truncate:
                    name = inputs.named(i)
                    if inputs.sent is not None and inputs.sent[i] != whole[i]:  # its prompt's tokens count too
                        name += " with the prompt or template it is written in"
                    raise self._too_long(name, len(self._whole.encode(whole[i])))
                if side == "left" and inputs.sent is not None and inputs.sent[i] != whole[i]:
                    enc = encodings[i] = self._keep_written(whole[i], inputs.sent[i])
                elif side == "left":
                    enc, begin = self._keep_end(whole[i])
                    encodings[i] = enc
                    if begin:  # read by its end alone
                        begins[i] = begin
                truncated[i] = True
            tokens += len(enc)
        return Encoded([[e] for e in encodings], truncated, encodings, tokens, begins)

    def _capped_singles(self, inputs: Inputs, truncate: bool, side: Side, cap: int) -> Encoded:
        """Single texts cut to `cap` of their own tokens (fewer than the model reads) on `side`, as a request's
        own cap asks; where the request refuses to cut, a text over it is refused."""
        if inputs.sent is not None:
            return self._capped_written(inputs, truncate, side, cap)
        encodings, truncated = [], []
        if truncate:
            contents, begins = self._contents(inputs.texts, side, cap + 1)
        else:
            contents, begins = self._whole_contents(inputs.texts), {}
        for i, content in enumerate(contents):
            self._check_cap(inputs, i, len(content), cap, truncate)
            truncated.append(len(content) > cap)
            content.truncate(cap, direction=side)
            encodings.append(self._join.post_process(content))
        return Encoded([[e] for e in encodings], truncated, encodings, sum(len(e) for e in encodings), begins)

    def _capped_written(self, inputs: Inputs, truncate: bool, side: Side, cap: int) -> Encoded:
        """Texts the task wrote before the ones sent (a prompt; an LM reranker's template, the document last):
        the cap is the sent text's. Each is cut to `cap` of its own tokens by their characters, written after
        what the task wrote, and read as any text (the whole was cut to it: a long prompt or template left
        no room for the text, and every text read alike)."""
        assert inputs.sent is not None
        texts, cut = [], []
        for i, (text, sent) in enumerate(zip(inputs.texts, inputs.sent, strict=True)):
            own = self._content(sent).offsets
            self._check_cap(inputs, i, len(own), cap, truncate)
            cut.append(len(own) > cap)
            if cut[-1]:
                kept = sent[: own[cap - 1][1]] if side == "right" else sent[own[-cap][0] :]
                text = text[: len(text) - len(sent)] + kept  # the task's writing ends with the text sent
            texts.append(text)
        encoded = self._singles(replace(inputs, texts=texts), truncate, side)
        return replace(encoded, truncated=[a or b for a, b in zip(encoded.truncated, cut, strict=True)])

    @staticmethod
    def _check_cap(inputs: Inputs, i: int, tokens: int, cap: int, truncate: bool) -> None:
        if tokens > cap and not truncate:
            raise InputTooLong(  # the cap is Cohere's max_tokens, and the refusal its truncate NONE
                f"{inputs.named(i)} is {tokens} tokens long, more than max_tokens ({cap}); send truncate END or "
                "START to cut it",
                limit=cap,
            )

    def _keep_end(self, text: str) -> tuple[Encoding, int]:
        """The encoding of `text`, too long for the model, that keeps its last tokens, and the character where
        the text it read begins (an end's)."""
        content, begin = self._end_content(text, "left", self.window_tokens) or (self._content(text), 0)
        content.truncate(self.window_tokens, direction="left")
        return self._join.post_process(content), begin

    def _keep_written(self, text: str, sent: str) -> Encoding:
        """The encoding of `text`, written by the task around `sent` (which it ends with) and too long for the
        model, that loses the start of `sent` alone: a prompt, or an LM reranker's instruction and query, stays
        read (cut with the rest, every document scored alike, unread). As few of its tokens go as fit, by their
        characters; where the writing alone overflows, the whole text's last tokens."""
        own = self._content(sent).offsets
        writing = text[: len(text) - len(sent)]
        over = len(self._whole.encode(text)) - self.max_length
        for drop in range(max(over, 1), len(own)):  # more than `over` where tokens merge across the new start
            enc = self._cut.encode(writing + sent[own[drop][0] :])
            if not self._overflows(enc):
                return enc
        return self._keep_end(text)[0]

    def _overflows(self, enc: Encoding) -> bool:
        """Whether `enc` was cut at the maximum (only an encoding at the limit can have been; `overflowing` copies,
        so the length is tested first)."""
        return len(enc) >= self.max_length and bool(enc.overflowing)

    def _encode(self, cut: Tokenizer, texts: list[str], special: bool = True) -> list[Encoding]:
        """`texts` encoded by `cut`, offsets only where the task reads them; `special`: with special tokens."""
        if not self._offsets:
            return cut.encode_batch_fast(texts, add_special_tokens=special)
        if len(texts) == 1:
            return [cut.encode(texts[0], add_special_tokens=special)]
        return cut.encode_batch(texts, add_special_tokens=special)

    def _start(self, text: str) -> str:
        """`text`, or where it is longer than `_start_at` characters its start: up to a space that follows
        something else than whitespace, the last one before `_start_at` (a text with none stays whole)."""
        if len(text) <= self._start_at:
            return text
        end = text.rfind(" ", 0, self._start_at)
        while end > 0 and text[end - 1].isspace():
            end = text.rfind(" ", 0, end)
        return text[:end] if end > 0 else text

    def _end(self, text: str) -> str:
        """`text`, or where it is longer than `_start_at` characters its end: from a space that follows something
        else than whitespace, the last one that leaves `_start_at` characters after it (a text with none stays
        whole)."""
        if not self._start_at or len(text) <= self._start_at:
            return text
        begin = text.rfind(" ", 0, len(text) - self._start_at + 1)
        while begin > 0 and text[begin - 1].isspace():
            begin = text.rfind(" ", 0, begin)
        return text[begin:] if begin > 0 else text

    def _plain_ascii(self, text: str) -> bool:
        """Whether BERT's normalizer would only lowercase `text` and no added token can be in it."""
        return text.isascii() and not _CONTROL.search(text) and not any(c in text for c in self._added)

    def _windows(self, texts: list[str], stride: int) -> Encoded:
        windows = []
        for text in texts:
            content = self._whole.encode(text, add_special_tokens=False)
            if len(content) > self.window_tokens:
                content.truncate(self.window_tokens, stride=stride)
            first = self._join.post_process(content)  # adds special tokens to every window
            windows.append([first, *first.overflowing])
        flat = [w for ws in windows for w in ws]
        return Encoded(windows, [False] * len(texts), flat, sum(len(w) for w in flat))

    def _pairs(
        self, firsts: list[str], seconds: list[str], truncate: bool, long_input: LongInput, name: Callable[[int], str]
    ) -> Encoded:
        """Pairs: a ranking's (query, document)s, a classifier's (text, text_pair)s, a too-long one cut on
        `long_input.side` of each member, second members first cut to its text_tokens where it names fewer
        than the pair's room. `name`: pair i as the request names it, for a refusal."""
        side, cap = long_input.side, long_input.text_tokens
        if cap is not None and cap < self._pair_budget:
            return self._capped_pairs(firsts, seconds, truncate, side, cap, name)
        # No truncation here: tokenizers' pair truncation also builds every overflow combination, which
        # explodes on long documents. Too-long pairs are cut by hand below; a long second member is read by the
        # end it keeps first, as a single text is: where that end alone fills the room, the pair is cut from it.
        # No task reads a pair's offsets (token classification, which reads offsets, reads no pairs): no begins.
        encode = self._whole.encode_batch if self._offsets else self._whole.encode_batch_fast
        ends = (self._end_content(d, side, self._pair_budget) for d in seconds) if truncate else ()
        content = {i: d[0] for i, d in enumerate(ends) if d is not None}
        heads = {i: self._content(firsts[i]) for i in content}
        # An end (holding the room's tokens) cuts the pair as the whole second member would where it is the
        # longer member: the cut then keeps the same number of its tokens at that end (`pair_lengths`).
        filled = {i for i, d in content.items() if len(d) >= len(heads[i])}
        encodings = encode([(firsts[i], d) for i, d in enumerate(seconds) if i not in filled])
        for i in sorted(filled):
            encodings.insert(i, self._fit_pair(heads[i], content[i], side))
        truncated = [i in filled for i in range(len(seconds))]
        for i, enc in enumerate(encodings):
            if i not in filled and len(enc) > self.max_length:
                if not truncate:
                    raise self._too_long(name(i), len(enc), windows=False)
                encodings[i] = self._fit_pair(self._content(firsts[i]), self._content(seconds[i]), side)
                truncated[i] = True
        return Encoded([[e] for e in encodings], truncated, encodings, sum(len(e) for e in encodings))

    def _capped_pairs(
        self, firsts: list[str], seconds: list[str], truncate: bool, side: Side, cap: int, name: Callable[[int], str]
    ) -> Encoded:
        """Pairs whose second members are first cut to `cap` of their own tokens (less than the pair's room),
        then cut as a pair to the model's maximum where the first member is long too."""
        first = self._whole_contents(firsts)
        second = self._contents(seconds, side, cap + 1)[0] if truncate else self._whole_contents(seconds)
        encodings, truncated = [], []
        for i, (a, b) in enumerate(zip(first, second, strict=True)):
            over = len(a) + min(len(b), cap) > self._pair_budget
            if over and not truncate:
                raise self._too_long(name(i), len(a) + min(len(b), cap) + self.max_length - self._pair_budget, False)
            truncated.append(len(b) > cap or over)
            b.truncate(cap, direction=side)
            encodings.append(self._fit_pair(a, b, side))
        return Encoded([[e] for e in encodings], truncated, encodings, sum(len(e) for e in encodings))

    def _content(self, text: str) -> Encoding:
        """`text`'s tokens without special tokens, never cut."""
        return self._whole.encode(text, add_special_tokens=False)

    def _whole_contents(self, texts: list[str]) -> list[Encoding]:
        return self._encode(self._whole, texts, special=False)

    def _contents(self, texts: list[str], side: Side, tokens: int) -> tuple[list[Encoding], dict[int, int]]:
        """Each text's tokens without special tokens, a long one's only those of its `side` end where they are
        `tokens` or more of the whole text's there (`_end_content`): the rest in one batch. With them, where each
        text read by its left end begins (Encoded.begins)."""
        ends = {i: e for i, t in enumerate(texts) if (e := self._end_content(t, side, tokens)) is not None}
        rest = iter(self._whole_contents([t for i, t in enumerate(texts) if i not in ends]))
        contents = [ends[i][0] if i in ends else next(rest) for i in range(len(texts))]
        return contents, {i: begin for i, (_, begin) in ends.items() if begin}

    def _end_content(self, text: str, side: Side, tokens: int) -> tuple[Encoding, int] | None:
        """The tokens (without special tokens) of only `text`'s `side` end, where the text is long enough to
        have one (`_start`, `_end`) and the end holds at least `tokens` of the whole text's tokens at that end,
        with the character where that end begins (its offsets are into it); else None: read the whole text."""
        if side == "right":
            start = self._start(text)
            if start is text:
                return None
            content = self._content(start)
            return (content, 0) if len(content) >= tokens else None
        end = self._end(text)
        if end is text:
            return None
        content = self._content(end)
        words = content.word_ids  # the end's first word may tokenize otherwise than within the text: not kept
        return (content, len(text) - len(end)) if len(content) > tokens and words[-tokens] != words[0] else None

    def _fit_pair(self, first: Encoding, second: Encoding, side: Side = "right") -> Encoding:
        """Cut a pair (each member's content tokens; of the second, where longer, possibly only as many of its
        first ones as fill the room) to the model's maximum on `side` of each, as transformers' tokenizers cut it."""
        keep_first, keep_second = pair_lengths(len(first), len(second), self._pair_budget)
        first.truncate(keep_first, direction=side)
        second.truncate(keep_second, direction=side)
        return self._join.post_process(first, second)

    def _too_long(self, name: str, length: int, windows: bool = True) -> InputTooLong:
        """`windows`: the input could be read in windows (a pair cannot)."""
        return InputTooLong(
            f"{name} is {length} tokens long; this model reads at most {self.max_length}. "
            f'Send "truncate": true to cut it{self._hint if windows else ""}',
            limit=self.max_length,
        )


def _namer(inputs: Inputs) -> Callable[[int], str]:
    """What the request calls its input i: a text, a document with the query, or a pair."""
    if inputs.query is not None:
        return lambda i: f"{inputs.named(i)} with the query"
    return inputs.pair_named if inputs.pairs is not None else inputs.named


def pair_lengths(first: int, second: int, budget: int) -> tuple[int, int]:
    """The tokens each member of a pair keeps within `budget` (the model's maximum less the pair's special
    tokens), as transformers' tokenizers keep them (truncation=True: "longest_first"): the shorter member whole
    where it takes at most half, the longer one the rest; else half each, the longer one an odd budget's extra
    token (the second of two alike)."""
    if first + second <= budget:
        return first, second
    shorter = min(first, second)
    small, large = (budget // 2, budget - budget // 2) if 2 * shorter > budget else (shorter, budget - shorter)
    return (small, large) if first <= second else (large, small)


def _without_trimming(config: dict[str, Any]) -> Tokenizer | None:
    """The tokenizer of `config` (no truncation) with its post-processor's trim_offsets off, or None where no
    part of it trims."""
    processor = config.get("post_processor")
    trimming = [p for p in _parts(processor, "processors") if p.get("trim_offsets")] if processor else []
    if not trimming:
        return None
    for part in trimming:
        part["trim_offsets"] = False
    untrimmed = Tokenizer.from_str(json.dumps(config))
    untrimmed.no_truncation()
    return untrimmed


def _cases(content: str) -> tuple[str, ...]:
    return (content[:1].lower(), content[:1].upper()) if content else ()


def _without_bert_normalizer(text: str, config: dict[str, Any]) -> tuple[Tokenizer | None, bool]:
    """A copy of a tokenizer (`text`, its JSON, and `config`, that parsed) without its normalizer (and with
    BERT's pre-tokenizer as one regex, where it has that one), and whether the normalizer lowercased, where the
    normalizer is BERT's (on clean ASCII it only lowercases, or does nothing); (None, False) for any other."""
    normalizer = config.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        return None, False
    plain = Tokenizer.from_str(text)
    plain.normalizer = None
    if (config.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer":
        plain.pre_tokenizer = pre_tokenizers.Split(Regex(_BERT_ASCII_WORDS), behavior="removed", invert=True)
    return plain, bool(normalizer.get("lowercase", True))


def _splits_at_spaces(config: dict[str, Any], pre_tokenizer: PreTokenizer | None) -> bool:
    """Whether a tokenizer (`config`, its parsed JSON, and its `pre_tokenizer`) gives the words before a space
    the same tokens whatever follows the space: its normalizer changes characters in place (a Replace only of
    spaces, by a space or "▁"), and its pre-tokenizer, of the kinds that split, never lets a word run on past a
    space (tried on a text of every kind of gap)."""
    for part in _parts(config.get("normalizer"), "normalizers"):
        if part["type"] == "Replace":
            pattern = part["pattern"].get("String") or part["pattern"].get("Regex") or "x"
            if set(pattern) - set(" {},+*0123456789") or part.get("content") not in (" ", "\u2581"):
                return False
        elif part["type"] not in _IN_PLACE:
            return False
    pre = _parts(config.get("pre_tokenizer"), "pretokenizers")
    if not pre or any(p["type"] not in _AT_SPACES for p in pre) or pre_tokenizer is None:
        return False  # no pre-tokenizer: the whole text is one word
    # Where `_start` may end a start (a space after something else than whitespace), no piece may run across:
    # a piece may begin there (byte-level BPE's "Ġword"), or end there.
    ends = [i for i in range(1, len(_GAPS)) if _GAPS[i] == " " and not _GAPS[i - 1].isspace()]
    pieces = pre_tokenizer.pre_tokenize_str(_GAPS)
    return not any(start < i < end for _, (start, end) in pieces for i in ends)


def _parts(component: dict[str, Any] | None, kind: str) -> list[dict[str, Any]]:
    """A normalizer's, pre-tokenizer's or post-processor's parts, a Sequence's flattened."""
    if not component:
        return []
    if component["type"] == "Sequence":
        return [p for c in component[kind] for p in _parts(c, kind)]
    return [component]


def vocab(tokenizer: Tokenizer, pad_id: int) -> Vocab:
    """What post-processing needs to know about `tokenizer` (see tasks.base.Vocab); `pad_id`: the bundle's."""
    model = json.loads(tokenizer.to_str())["model"]
    unk_id = model.get("unk_id")  # Unigram names the id
    if unk_id is None and model.get("unk_token"):  # WordPiece and BPE name the token
        unk_id = tokenizer.token_to_id(model["unk_token"])
    decoder = tokenizer.decoder
    return Vocab(
        unk_id=unk_id,
        word_aware=bool(model.get("continuing_subword_prefix")),
        decode=decoder.decode if decoder is not None else " ".join,
        # An empty text is the template alone (padding too, where the tokenizer pads).
        special_ids=frozenset({*tokenizer.encode("").ids, pad_id, *([] if unk_id is None else [unk_id])}),
    )
