"""DeBERTa-v3-style checkpoints ship only a SentencePiece spm.model: `hare optimize` converts it to the Rust
tokenizer the server runs (transformers' converter): the served tokens equal SentencePiece's own, and the
answers the transformers pipeline's. The folder is written as transformers 4.x saved it (no tokenizer.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from container.bundle import TOKENIZER_FILE
from container.optimize.textset import SENTENCES
from tests.api_helpers import serve
from tests.conftest import quick_bundle
from tests.tiny_models import MAX_POSITIONS, make_sentencepiece_model

pytestmark = pytest.mark.anyio
TEXTS = ["Angela Merkel met Emmanuel Macron in Paris and Berlin.", "Zyxw qqq ÄÖÜ über naïve café!", "hello"]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def _sentencepiece_ids(model: Path, text: str, pair: str | None = None) -> tuple[list[int], list[int]]:
    """What the slow DebertaV2Tokenizer of transformers 4.x computed (transformers 5 has none): SentencePiece's
    own pieces, in [CLS] A [SEP] (B [SEP]), the text truncated to the model's maximum; and the type ids."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model / "spm.model"))
    limit = MAX_POSITIONS - 2 - 2
    first = [1, *sp.encode(text)[:limit], 2]
    second = [*sp.encode(pair), 2] if pair is not None else []
    return first + second, [0] * len(first) + [1] * len(second)


async def test_spm_only_folder_is_converted_and_served_like_sentencepiece(tmp_path: Path) -> None:
    from transformers import pipeline

    model = make_sentencepiece_model(tmp_path / "model")
    assert not (model / "tokenizer.json").exists()
    out = quick_bundle(model, "text-classification", tmp_path / "bundle")

    served = Tokenizer.from_file(str(out / TOKENIZER_FILE))
    for text in [*TEXTS, *SENTENCES]:
        assert served.encode(text).ids == _sentencepiece_ids(model, text)[0], text
    pair = served.encode("a question", "a passage")
    assert (pair.ids, pair.type_ids) == _sentencepiece_ids(model, "a question", "a passage")

    classify: Any = pipeline("text-classification", model=str(model), top_k=None)
    async with serve(out) as client:
        response = await client.post("/predict", json={"inputs": TEXTS, "parameters": {"top_k": None}})
    for ref, got in zip(classify(TEXTS), response.json(), strict=True):
        assert [r["label"] for r in ref] == [g["label"] for g in got]
        assert np.allclose([r["score"] for r in ref], [g["score"] for g in got], atol=1e-4)
