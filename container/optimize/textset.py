"""The validation set: varied English texts from 1 to 512 tokens (pairs for ranking), or the user's file, and
texts either side of the lengths where the model's arithmetic changes (regime_samples); and
a calibration set of other texts from the same sentences, for the stages that fit a graph to samples
(int8-mixed), so that the validation set stays a check on texts the fit never saw."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from tasks.errors import InputError

SENTENCES = [
    "I like you. I love you.",
    "The central bank raised interest rates by a quarter point on Wednesday, citing persistent inflation.",
    "Absolutely terrible service; we waited forty minutes and the soup was cold.",
    "Marie Curie was the first person to win Nobel Prizes in two different sciences.",
    "To reset your password, open Settings, choose Security, and follow the link sent to your email.",
    "The match ended in a 2-2 draw after a stoppage-time equaliser from the visiting side.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Can you recommend a quiet hotel near the old town in Prague for under 120 euros a night?",
    "This is the best phone I have owned: the battery lasts two days and the camera is superb.",
    "Apple opened a new office in Berlin, hiring 300 engineers to work on maps and Siri.",
    "The committee postponed its decision until further evidence could be reviewed.",
    "Mix the flour and butter, add cold water a spoonful at a time, then chill the dough for an hour.",
    "Our flight from New York to Tokyo was delayed because of a snowstorm over Chicago.",
    "Quantum computers use qubits, which can represent zero and one at the same time.",
    "I'm not sure this is what I ordered, but honestly it's better than I expected!",
    "Shares of Tesla fell 4% after the company reported lower deliveries than analysts forecast.",
    "The Amazon rainforest produces a significant share of the world's oxygen and hosts vast biodiversity.",
    "Please find attached the invoice for March; payment is due within thirty days.",
    "He walked along the river at dawn, listening to the birds and the distant traffic.",
    "Kubernetes schedules containers across a cluster and restarts them when they fail.",
    "The museum's new exhibition features works by Frida Kahlo and Diego Rivera.",
    "wow. just wow. never again",
    "Symptoms include fever, dry cough and fatigue; most patients recover within two weeks.",
    "The Treaty of Versailles was signed in 1919, formally ending the First World War.",
    "Turn left at the second traffic light, then the pharmacy is on your right next to the bakery.",
    "Barack Obama served as the 44th president of the United States from 2009 to 2017.",
    "The algorithm sorts the list in O(n log n) time and uses constant extra memory.",
    "Rain is expected across the north tomorrow, with sunny spells in the south by the afternoon.",
    "My cat knocked the glass off the table again, looked at me, and walked away.",
    "Renewable energy overtook coal as the largest source of electricity in the EU last year.",
    "Ok",
    "Customer support resolved my issue in five minutes. Impressive!",
]

RANKING = {
    "how do I reset my password": [4, 19, 17, 0, 11],
    "what did the central bank do about inflation": [1, 15, 29, 10, 23],
    "who won two Nobel prizes": [3, 25, 13, 20, 6],
    "flight delays because of weather": [12, 27, 5, 16, 7],
    "recipe for pastry dough": [11, 6, 18, 31, 8],
    "opinions about a new phone": [8, 14, 31, 2, 21],
}
LENGTHS = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 510, 600]
# The calibration set's prose lengths: none of LENGTHS, and each starts at another sentence than its
# validation neighbours; sentence pairs are two sentences STRIDE apart (validation prose runs consecutively).
CALIBRATION_LENGTHS = [3, 6, 10, 20, 40, 80, 160, 288]
STRIDE = 11


@dataclass(frozen=True)
class Sample:
    """One validation input: a text, or a (query, document) pair whose query is `group`."""

    text: str
    pair: str | None = None
    group: int = 0


def _text_of_length(tokenizer: Tokenizer, tokens: int, start: int) -> str:
    """Running English prose of about `tokens` tokens, cut at a token boundary."""
    text = ""
    i = start
    while len(tokenizer.encode(text, add_special_tokens=False).ids) < tokens:
        text = f"{text} {SENTENCES[i % len(SENTENCES)]}".strip()
        i += 1
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    return text[: offsets[tokens - 1][1]]


def builtin_samples(tokenizer: Tokenizer, pairs: bool) -> list[Sample]:
    """The built-in set: every sentence alone plus prose at each of LENGTHS (cut by the model's tokenizer).

    Prose longer than the model's maximum stays in: the bundle tokenizer truncates it, as serving does.
    """
    tokenizer = Tokenizer.from_str(tokenizer.to_str())
    tokenizer.no_truncation()
    if pairs:
        return [
            Sample(query, SENTENCES[i] if k % 2 else _text_of_length(tokenizer, 40 * (k + 1), i), g)
            for g, (query, docs) in enumerate(RANKING.items())
            for k, i in enumerate(docs)
        ]
    prose = [_text_of_length(tokenizer, n, start=k) for k, n in enumerate(LENGTHS)]
    return [Sample(s) for s in SENTENCES] + [Sample(t) for t in prose]


def calibration_samples(tokenizer: Tokenizer, pairs: bool) -> list[Sample]:
    """Texts (or query/document pairs) of the same sentences that builtin_samples never gives: each sentence's
    first words, two sentences STRIDE apart, and prose at CALIBRATION_LENGTHS; for ranking, each query
    against documents outside its validation group."""
    tokenizer = Tokenizer.from_str(tokenizer.to_str())
    tokenizer.no_truncation()
    n = len(SENTENCES)
    if pairs:
        samples = []
        for g, (query, docs) in enumerate(RANKING.items()):
            others = [i for i in range(n) if i not in docs]
            picked = [others[(g * 7 + k * 5) % len(others)] for k in range(4)]
            samples += [Sample(query, SENTENCES[i], g) for i in picked]
            samples.append(Sample(query, _text_of_length(tokenizer, 60 + 20 * g, start=picked[0] + 3), g))
        return samples
    heads = [" ".join(s.split()[: 3 + i % 3]) for i, s in enumerate(SENTENCES)]
    heads = [h for h, s in zip(heads, SENTENCES, strict=True) if h != s]  # "Ok" is validated already
    joined = [f"{SENTENCES[i]} {SENTENCES[(i + STRIDE) % n]}" for i in range(n)]
    prose = [_text_of_length(tokenizer, t, start=k + 7) for k, t in enumerate(CALIBRATION_LENGTHS)]
    return [Sample(t) for t in heads + joined + prose]


def regime_samples(tokenizer: Tokenizer, lengths: Sequence[int], pairs: bool) -> list[Sample]:
    """Prose whose encodings, special tokens included, are `lengths` tokens long (regimes.parity_lengths:
    either side of where the model's arithmetic changes); for ranking, documents after one query, in a group
    of their own."""
    tokenizer = Tokenizer.from_str(tokenizer.to_str())
    tokenizer.no_truncation()
    query = next(iter(RANKING)) if pairs else None
    group = len(RANKING) if pairs else 0
    samples = []
    for k, length in enumerate(lengths):
        content, text = length - len(_encode(tokenizer, "", query)), ""
        for _ in range(3):  # a cut text may encode a token longer or shorter than where it was cut
            if content < 1:
                break
            text = _text_of_length(tokenizer, content, start=k)
            missing = length - len(_encode(tokenizer, text, query))
            if not missing:
                break
            content += missing
        if text:
            samples.append(Sample(query, text, group) if query is not None else Sample(text))
    return samples


def _encode(tokenizer: Tokenizer, text: str, query: str | None) -> list[int]:
    return list(tokenizer.encode(query, text).ids if query is not None else tokenizer.encode(text).ids)


def file_samples(path: Path, pairs: bool) -> list[Sample]:
    """The user's set: one text per line, or JSONL of {"text"} or {"query", "document"|"documents"}."""
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise InputError(f"validation file {path} {what}; give a file of texts (--validation-file)")
    try:  # utf-8-sig: without the byte order mark Windows tools put first, which would begin the first text
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"validation file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    samples: list[Sample] = []
    queries: dict[str, int] = {}
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if not line.lstrip().startswith("{"):
            if pairs:
                raise InputError(f"{path}:{n}: ranking needs JSONL lines with query and document(s)")
            samples.append(Sample(line))
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path}:{n}: not valid JSON ({exc})") from exc
        if pairs and "query" in row:
            docs = row.get("documents") or [row.get("document")]
            if (
                not isinstance(row["query"], str)
                or not isinstance(docs, list)
                or not all(isinstance(d, str | None) for d in docs)
            ):  # a string "documents" was read as one document a character, an object as its repr
                raise InputError(
                    f"{path}:{n}: expected a text as query and a text as document or a list of texts as documents"
                )
            group = queries.setdefault(row["query"], len(queries))
            samples += [Sample(row["query"], d, group) for d in docs if d]
        elif not pairs and isinstance(row.get("text"), str):
            samples.append(Sample(row["text"]))
        else:
            want = '"query" and "document" or "documents"' if pairs else '"text"'
            raise InputError(f"{path}:{n}: expected an object with {want}")
    if not samples:
        raise InputError(f"validation file {path} holds no samples")
    return samples
