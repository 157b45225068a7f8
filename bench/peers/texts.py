"""The texts: speed texts of an exact token count, and fidelity texts of prose from 3 tokens to the longest."""

from __future__ import annotations

import math
import random
import re

from tokenizers import Tokenizer

from bench.inputs import TextMaker


def prose(min_words: int = 12) -> list[str]:
    """Plain-prose paragraphs of Python's documentation (pydoc_data, standard library), whitespace folded."""
    import pydoc_data.topics

    out = []
    for topic in pydoc_data.topics.topics.values():
        for paragraph in topic.split("\n\n"):
            if paragraph.startswith(" "):  # code and indented examples
                continue
            text = " ".join(paragraph.split())
            if len(text.split()) >= min_words and re.fullmatch(r"[A-Za-z0-9 ,.;:()'\"-]+", text):
                out.append(text)
    return out


def fidelity_texts(tok: Tokenizer, count: int, longest: int = 200, shortest: int = 3, seed: int = 0) -> list[str]:
    """`count` texts whose encodings (special tokens included) run from `shortest` to `longest` tokens, spread
    evenly in log length; each a run of prose cut at a token boundary (so most counts are exact)."""
    paragraphs = prose()
    rng = random.Random(seed)
    special = len(tok.encode("").ids)
    out = []
    for i in range(count):
        frac = i / max(count - 1, 1)
        tokens = round(math.exp(math.log(shortest) + frac * (math.log(longest) - math.log(shortest))))
        body = max(tokens - special, 1)
        start = rng.randrange(len(paragraphs))
        text = ""
        for k in range(len(paragraphs)):  # as many paragraphs as the length needs
            text = (text + " " + paragraphs[(start + k) % len(paragraphs)]).strip()
            if len(tok.encode(text, add_special_tokens=False).ids) >= body:
                break
        enc = tok.encode(text, add_special_tokens=False)
        if len(enc.ids) > body:
            text = text[: enc.offsets[body - 1][1]]
        out.append(text)
    return out


def speed_texts(maker: TextMaker, seq_len: int, batch: int, groups: int = 8) -> dict[int, list[list[str]]]:
    """Calls of 1 and of `batch` texts of exactly `seq_len` tokens, `groups` different ones of each."""
    texts = maker.texts(seq_len, groups * max(batch, 1))
    return {
        1: [[t] for t in texts[:groups]],
        batch: [texts[i * batch : (i + 1) * batch] for i in range(groups)],
    }


def lengths(tok: Tokenizer, texts: list[str]) -> dict[str, int]:
    """How many texts, and their shortest and longest encoding in tokens (for the run's summary)."""
    counts = [len(e.ids) for e in tok.encode_batch(texts)]
    return {"texts": len(counts), "min": min(counts, default=0), "max": max(counts, default=0)}
