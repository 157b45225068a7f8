"""Request inputs: texts with an exact token count for the served tokenizer, varied per request, or a mix of
lengths by name (MIXES: Comet's 45-55-word sentences, a lognormal spread of 3-140 words), packed into `/predict`
bodies for each task and batch size.

Exact counts include the special tokens ([CLS] ... [SEP]), the way a model's maximum length counts them. The
texts are built from words that the tokenizer keeps as one token wherever they stand, then checked by
encoding: a text that misses its count is rebuilt, so every body holds exactly the length asked for.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from bench.points import MIX_NAMES
from container.optimize.textset import SENTENCES
from tasks.errors import InputError
from tasks.registry import TASKS

COMET_WORDS = (45, 55)
# The mix's words a text: lognormal (median 22, mean 26; 3-140): most texts short, a long tail, as live
# traffic sends them.
MIX_WORDS = (3, 140)
MIX_LOGNORMAL = (3.1, 0.6)
MAX_TEXTS = 8192  # texts per point at most (bodies x batch): enough variety, bounded memory and set-up time
_WORD = re.compile(r"^[a-z]{2,}$")


def load_tokenizer(path: Path) -> Tokenizer:
    """A tokenizer.json (or a folder holding one), with padding and truncation off so counts are true."""
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"no tokenizer.json at {path}; exact token counts need the bundle's tokenizer")
    tok = Tokenizer.from_file(str(file))
    tok.no_padding()
    tok.no_truncation()
    return tok


class TextMaker:
    """Makes varied texts of an exact token count (or pairs whose encoding has that count) for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer, seed: int = 0) -> None:
        self.tok = tokenizer
        self.rng = random.Random(seed)
        self.single = len(tokenizer.encode("").ids)
        self.pair = len(tokenizer.encode("", "").ids)
        self.words = self._single_token_words()
        if len(self.words) < 8:
            raise InputError("the tokenizer keeps too few English words whole to build exact-length inputs")

    def _single_token_words(self) -> list[str]:
        natural = {w.strip(".,;:!?'\"()").lower() for s in SENTENCES for w in s.split()}
        vocab = set()
        for token in self.tok.get_vocab():
            word = token.lstrip("Ġ▁").lower()
            if _WORD.match(word):
                vocab.add(word)
        candidates = sorted(w for w in natural | vocab if _WORD.match(w))
        # One token at the start of a text and one after a space (byte-level BPE and Metaspace differ there).
        starts = self.tok.encode_batch([w for w in candidates], add_special_tokens=False)
        inside = self.tok.encode_batch([f"{w} {w}" for w in candidates], add_special_tokens=False)
        return [
            w
            for w, a, b in zip(candidates, starts, inside, strict=True)
            if len(a.ids) == 1 and len(b.ids) == 2 and self.tok.token_to_id("[UNK]") not in a.ids
        ]

    def _words(self, k: int) -> str:
        return " ".join(self.rng.choice(self.words) for _ in range(k))

    def texts(self, tokens: int, count: int) -> list[str]:
        """`count` different texts whose encoding (special tokens included) is exactly `tokens` long."""
        body = tokens - self.single
        if body < 1:
            raise InputError(f"{tokens} tokens leaves no room for text after {self.single} special tokens")
        out: list[str] = []
        for _ in range(20):  # retries for the rare text whose words merge or split in context
            batch = [self._words(body) for _ in range(count - len(out))]
            enc = self.tok.encode_batch(batch)
            out += [t for t, e in zip(batch, enc, strict=True) if len(e.ids) == tokens]
            if len(out) == count:
                return out
        raise InputError(f"could not build texts of exactly {tokens} tokens with this tokenizer")

    def pairs(self, tokens: int, count: int) -> list[tuple[str, str]]:
        """(query, document) pairs whose pair encoding is exactly `tokens` long; queries of up to 8 words."""
        body = tokens - self.pair
        if body < 2:
            raise InputError(f"{tokens} tokens leaves no room for a query and a document")
        q = max(1, min(8, body // 2))
        out: list[tuple[str, str]] = []
        for _ in range(20):
            batch = [(self._words(q), self._words(body - q)) for _ in range(count - len(out))]
            enc = self.tok.encode_batch(batch)
            out += [p for p, e in zip(batch, enc, strict=True) if len(e.ids) == tokens]
            if len(out) == count:
                return out
        raise InputError(f"could not build pairs of exactly {tokens} tokens with this tokenizer")

    def count(self, text: str) -> int:
        return len(self.tok.encode(text).ids)


def comet_texts(count: int, seed: int = 0) -> list[str]:
    """Comet's inputs: English sentences cut to 45-55 words (about three sentences), different each time."""
    rng = random.Random(seed)
    words = [w for s in SENTENCES for w in s.split()]
    out = []
    for _ in range(count):
        n = rng.randint(*COMET_WORDS)
        start = rng.randrange(len(words))
        out.append(" ".join(words[(start + i) % len(words)] for i in range(n)))
    return out


def mixed_texts(count: int, seed: int = 0) -> list[str]:
    """Texts of MIX_WORDS words, lognormal (MIX_LOGNORMAL), of words from the built-in sentences. A runtime
    that compiles kernels per input shape (OpenVINO) shows under such a mix what exact lengths hide."""
    rng = random.Random(seed)
    words = [w for s in SENTENCES for w in s.split()]
    lengths = (int(min(MIX_WORDS[1], max(MIX_WORDS[0], rng.lognormvariate(*MIX_LOGNORMAL)))) for _ in range(count))
    return [" ".join(rng.choice(words) for _ in range(n)) for n in lengths]


# The mixes of lengths `--seq` takes by name, each `count` texts from a seed.
MIXES: dict[str, Callable[[int, int], list[str]]] = dict(zip(MIX_NAMES, (comet_texts, mixed_texts), strict=True))


def mix_pairs(name: str, groups: int, batch: int, seed: int = 0) -> list[tuple[str, str]]:
    """`groups` x `batch` (query, document) pairs from the mix `name`: documents of its lengths, each query the
    first 60 characters of another of its texts."""
    texts = MIXES[name](groups * batch + groups, seed)
    return [(texts[i][:60], d) for i, d in enumerate(texts[groups:])]


@dataclass(frozen=True)
class Bodies:
    """Prepared request bodies for one point and what they hold."""

    bodies: list[bytes]
    batch: int
    tokens_per_sequence: float  # exact for exact-length inputs, the mean for a mix


def make_bodies(
    task: str,
    batch: int,
    seq_len: int | str,
    maker: TextMaker | None,
    count: int = 512,
    seed: int = 0,
) -> Bodies:
    """`count` bodies (fewer for big batches) for `task`: of `seq_len` tokens each, or a mix's texts (MIXES)."""
    n = max(8, min(count, MAX_TEXTS // max(1, batch)))
    if TASKS[task].pairs:
        if isinstance(seq_len, str):
            pairs = mix_pairs(seq_len, n, batch, seed)
        else:
            if maker is None:
                raise InputError("exact-length inputs need the bundle's tokenizer")
            pairs = maker.pairs(seq_len, n * batch)
        bodies = [
            _ranking_body(pairs[i * batch][0], [d for _, d in pairs[i * batch : (i + 1) * batch]]) for i in range(n)
        ]
        lengths = [seq_len] if isinstance(seq_len, int) else [_pair_len(maker, p) for p in pairs]
        return Bodies(bodies, batch, _avg(lengths))
    if isinstance(seq_len, str):
        texts = MIXES[seq_len](n * batch, seed)
        lengths = [maker.count(t) for t in texts] if maker is not None else [float("nan")]
    else:
        if maker is None:
            raise InputError("exact-length inputs need the bundle's tokenizer")
        texts = maker.texts(seq_len, n * batch)
        lengths = [seq_len]
    bodies = [_text_body(texts[i * batch : (i + 1) * batch]) for i in range(n)]
    return Bodies(bodies, batch, _avg(lengths))


def _avg(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _pair_len(maker: TextMaker | None, pair: tuple[str, str]) -> float:
    return float(len(maker.tok.encode(*pair).ids)) if maker is not None else float("nan")


def _text_body(texts: list[str]) -> bytes:
    # Batch 1 sends a bare string, as a caller with one text would.
    return json.dumps({"inputs": texts[0] if len(texts) == 1 else texts}).encode()


def _ranking_body(query: str, documents: list[str]) -> bytes:
    return json.dumps({"inputs": {"query": query, "documents": documents}}).encode()
