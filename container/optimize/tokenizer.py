"""The bundle's tokenizer: a Rust `tokenizers` file with padding off and truncation at the model's maximum.

Some checkpoints ship a tokenizer.json with padding fixed to a length (all-MiniLM-L6-v2 pads to 128):
served as is, every request would cost a full 128-token pass. The server pads per batch instead.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from container.optimize.source import SourceModel
from tasks.errors import UnsupportedModel


def _load(folder: Path, trust_remote_code: bool = False) -> Tokenizer:
    if (folder / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    # No fast tokenizer file: let transformers convert the slow one (sentencepiece or vocab files).
    from transformers import AutoTokenizer

    try:
        slow_or_fast = AutoTokenizer.from_pretrained(str(folder), use_fast=True, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise UnsupportedModel(
            f"{folder} has no tokenizer.json and transformers could not load its tokenizer ({exc}); "
            "save one with `AutoTokenizer.from_pretrained(folder).save_pretrained(folder)`"
        ) from exc
    if not slow_or_fast.is_fast:
        raise UnsupportedModel(
            f"{folder} has only a slow (Python) tokenizer that transformers cannot convert to a fast one; "
            "hare serves Rust tokenizers only"
        )
    return Tokenizer.from_str(slow_or_fast.backend_tokenizer.to_str())


def write_tokenizer(source: SourceModel, out: Path) -> Path:
    """Write the serving tokenizer for `source` to `out`."""
    tokenizer = _load(source.path, source.trust_remote_code)
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=source.max_length)
    tokenizer.save(str(out))
    return out
