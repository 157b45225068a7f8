"""The model backend on a real session of a tiny model: one row per sequence, token-level rows trimmed back to
each sequence, unknown tokens counted, every width answering the same."""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from api.engine.backend import Backend
from container.bundle import MODEL_FILE, TOKENIZER_FILE, read_manifest
from tests.conftest import ModelFactory


def test_rows_come_back_per_sequence_trimmed_and_the_same_at_every_width(tiny_bundle: ModelFactory) -> None:
    bundle = tiny_bundle("feature-extraction")
    manifest = read_manifest(bundle)
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    unknown: list[int] = []
    unk_id = tokenizer.token_to_id("[UNK]")
    backend = Backend(bundle / MODEL_FILE, "cpu", (1, 2), manifest.output, unk_id, unknown.append)
    batch = tokenizer.encode_batch(["a short one", "a somewhat longer sentence than the first", "\u2603"])
    narrow, wide = backend.run(batch, 1), backend.run(batch, 2)
    assert backend.widths == (1, 2)
    assert [r.shape[0] for r in narrow] == [len(e) for e in batch]  # padding trimmed off each sequence
    for a, b in zip(narrow, wide, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)
    # Alone, a sequence gives the rows it gave inside the padded batch (up to dynamic int8's batch-wide scale).
    np.testing.assert_allclose(backend.run(batch[:1])[0], narrow[0], atol=2e-3)
    assert unknown == [1, 1]  # the snowman is one [UNK] in each run that carried it
