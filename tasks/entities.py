"""Entity aggregation for token classification, answer for answer the same as transformers'
TokenClassificationPipeline (gather_pre_entities, aggregate, aggregate_word(s), group_entities).

Strategies: none (one entry per token), simple (adjacent tokens with the same tag grouped), and the
word-level first / average / max, which first force one label per word, then group.

Spans are the tokenizer's offsets (the bundle's tokenizer is the one transformers 5 builds for the model,
container/optimize/tokenizer.py) with whitespace at either edge left out: `text[start:end]` is the entity's
own text. transformers' spans already are for WordPiece, XLM-R's metaspace and RoBERTa's byte-level BPE; where
its tokenizer leaves the space before a word in the word's first token (DeBERTa-v2's metaspace, GPT-2-style
byte-level BPE), or a group ends in a token of whitespace alone, hare's span starts or ends one space inside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.base import Array, Vocab
from tasks.windows import Tokens

STRATEGIES = ("none", "simple", "first", "average", "max")


@dataclass(slots=True)
class _Token:
    word: str
    scores: Array
    start: int
    end: int
    index: int
    is_subword: bool


def _pre_entities(text: str, tokens: Tokens, scores: Array, vocab: Vocab) -> list[_Token]:
    found = []
    for i, (token_id, word, (start, end)) in enumerate(zip(tokens.ids, tokens.tokens, tokens.offsets, strict=True)):
        word_ref = text[start:end]
        if vocab.word_aware:
            is_subword = len(word) != len(word_ref)
        else:
            # transformers' fallback for tokenizers that do not mark continuations: glued to the previous char.
            is_subword = start > 0 and " " not in text[start - 1 : start + 1]
        if token_id == vocab.unk_id:
            word, is_subword = word_ref, False
        found.append(_Token(word, scores[i], start, end, tokens.index[i], is_subword))
    return found


def _word(group: list[_Token], strategy: str, labels: tuple[str, ...], vocab: Vocab) -> dict[str, Any]:
    if strategy == "first":
        scores = group[0].scores
    elif strategy == "max":
        scores = max(group, key=lambda t: t.scores.max()).scores
    else:  # average
        scores = np.nanmean(np.stack([t.scores for t in group]), axis=0)
    best = int(scores.argmax())
    return {
        "entity": labels[best],
        "score": scores[best],
        "word": vocab.decode([t.word for t in group]),
        "start": group[0].start,
        "end": group[-1].end,
    }


def _words(pre: list[_Token], strategy: str, labels: tuple[str, ...], vocab: Vocab) -> list[dict[str, Any]]:
    """One entry per word: subword tokens join the word before them."""
    words: list[dict[str, Any]] = []
    group: list[_Token] = []
    for token in pre:
        if group and not token.is_subword:
            words.append(_word(group, strategy, labels, vocab))
            group = []
        group.append(token)
    if group:
        words.append(_word(group, strategy, labels, vocab))
    return words


def _tag(label: str) -> tuple[str, str]:
    """(B or I, tag); labels without a B-/I- prefix count as continuations, as in transformers."""
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def _group(run: list[dict[str, Any]], vocab: Vocab) -> dict[str, Any]:
    return {
        "entity_group": run[0]["entity"].split("-", 1)[-1],
        "score": float(np.mean(np.nanmean([e["score"] for e in run]))),
        "word": vocab.decode([e["word"] for e in run]),
        "start": run[0]["start"],
        "end": run[-1]["end"],
    }


def _grouped(entities: list[dict[str, Any]], vocab: Vocab) -> list[dict[str, Any]]:
    """Adjacent entries with the same tag become one entity; a B- tag always starts a new one."""
    groups: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    for entity in entities:
        if run:
            bi, tag = _tag(entity["entity"])
            _, last_tag = _tag(run[-1]["entity"])
            if tag != last_tag or bi == "B":
                groups.append(_group(run, vocab))
                run = []
        run.append(entity)
    if run:
        groups.append(_group(run, vocab))
    return groups


def aggregate(
    text: str,
    tokens: Tokens,
    scores: Array,
    strategy: str,
    labels: tuple[str, ...],
    vocab: Vocab,
    ignore: tuple[str, ...],
) -> list[dict[str, Any]]:
    """Entities of `text` from per-token class probabilities `scores` [tokens, labels]."""
    pre = _pre_entities(text, tokens, scores, vocab)
    if strategy in ("none", "simple"):
        entities = []
        for token in pre:
            best = int(token.scores.argmax())
            entities.append(
                {
                    "entity": labels[best],
                    "score": token.scores[best],
                    "index": token.index,
                    "word": token.word,
                    "start": token.start,
                    "end": token.end,
                }
            )
    else:
        entities = _words(pre, strategy, labels, vocab)
    if strategy != "none":
        entities = _grouped(entities, vocab)
    else:
        for e in entities:
            e["score"] = float(e["score"])
    for e in entities:
        e["start"], e["end"] = _inside_spaces(text, e["start"], e["end"])
    return [e for e in entities if e.get("entity", e.get("entity_group")) not in ignore]


def without_overlaps(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pipeline's aggregate_overlapping_entities, which it runs on a text read in several windows: by start,
    of entities whose spans overlap only the longest is kept, the higher score between equals. Byte-level BPE
    gives several tokens of one character the same span, so this drops entities anywhere in such a text."""
    kept: list[dict[str, Any]] = []
    for entity in sorted(entities, key=lambda e: e["start"]):
        previous = kept[-1] if kept else None
        if previous is None or not previous["start"] <= entity["start"] < previous["end"]:
            kept.append(entity)
            continue
        longer = entity["end"] - entity["start"] - (previous["end"] - previous["start"])
        if longer > 0 or (longer == 0 and entity["score"] > previous["score"]):
            kept[-1] = entity
    return kept


def _inside_spaces(text: str, start: int, end: int) -> tuple[int, int]:
    """The span without whitespace at its edges; a span of whitespace alone becomes empty at its end (where
    RoBERTa's trimmed offsets put a token of spaces)."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
