"""The bundle's tokenizer: a Rust `tokenizers` file with padding off and truncation at the model's maximum.

Some checkpoints ship a tokenizer.json with padding fixed to a length (all-MiniLM-L6-v2 pads to 128):
served as is, every request would cost a full 128-token pass. The server pads per batch instead.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, normalizers, processors

from container.optimize.errors import UnsupportedModel
from container.optimize.source import SourceModel


def _load(folder: Path, trust_remote_code: bool = False) -> Tokenizer:
    """The tokenizer transformers 5 reads the folder with, which is what the reference pipelines feed the
    model: its tokenizer class rebuilds the pipeline around the folder's vocabulary (XLM-R's splits at
    whitespace before its metaspace, so no token's span starts at a space; Qwen2's splits digits one by one),
    and the folder's tokenizer.json may say otherwise. The file as it is where transformers cannot read it."""
    from transformers import AutoTokenizer

    file = folder / "tokenizer.json"
    try:
        loaded = AutoTokenizer.from_pretrained(str(folder), use_fast=True, trust_remote_code=trust_remote_code)
    except Exception as exc:
        if file.is_file():
            return Tokenizer.from_file(str(file))
        raise UnsupportedModel(
            f"{folder} has no tokenizer.json and transformers could not load its tokenizer ({exc}); "
            "save one with `AutoTokenizer.from_pretrained(folder).save_pretrained(folder)`"
        ) from exc
    if loaded.is_fast and (file.is_file() or set(loaded.get_vocab()) - set(loaded.all_special_tokens)):
        return Tokenizer.from_str(loaded.backend_tokenizer.to_str())
    if file.is_file():
        return Tokenizer.from_file(str(file))
    if loaded.is_fast:
        # transformers 5 builds its class's tokenizer from no files at all: a vocabulary of specials only.
        raise UnsupportedModel(
            f"{folder} has no tokenizer files (tokenizer.json, or a vocabulary such as vocab.txt or spm.model "
            "with tokenizer_config.json); copy them from the model's original folder"
        )
    raise UnsupportedModel(
        f"{folder} has only a slow (Python) tokenizer that transformers cannot convert to a fast one; "
        "hare serves Rust tokenizers only"
    )


def _lowercases(normalizer: normalizers.Normalizer | None) -> bool:
    """Whether `normalizer` lowercases (a Lowercase, or BERT's normalizer told to: lowercasing twice is once)."""
    return normalizer is not None and normalizer.normalize_str("HARE") == "hare"


def around(tokenizer: Tokenizer, prefix: str, suffix: str) -> processors.TemplateProcessing:
    """A post-processor that puts `prefix` and `suffix`, each tokenized on its own (as Qwen3-Reranker's card
    does), around every text; truncation then cuts the text between them, never the template."""
    pieces = {
        name: tokenizer.encode(text, add_special_tokens=False) for name, text in (("PRE", prefix), ("SUF", suffix))
    }
    return processors.TemplateProcessing(
        single="PRE $A SUF",
        pair="PRE $A $B:1 SUF:1",
        special_tokens=[{"id": name, "ids": e.ids, "tokens": e.tokens} for name, e in pieces.items()],
    )


def write_tokenizer(source: SourceModel, out: Path) -> Path:
    """Write the serving tokenizer for `source` to `out`."""
    tokenizer = _load(source.path, source.trust_remote_code)
    if source.pair_template:
        tokenizer.post_processor = around(tokenizer, source.pair_template["prefix"], source.pair_template["suffix"])
    if source.lowercase and not _lowercases(tokenizer.normalizer):
        # As sentence-transformers does: Lowercase before the tokenizer's own normalizers.
        first = [normalizers.Lowercase()]
        tokenizer.normalizer = normalizers.Sequence(first + ([tokenizer.normalizer] if tokenizer.normalizer else []))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=source.max_length)
    tokenizer.save(str(out))
    return out
