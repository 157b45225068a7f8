"""The tasks' serving side as pure functions: parameter parsing, window merging, entity grouping."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from tasks import entities, params
from tasks.base import Vocab
from tasks.errors import InputError, InvalidRequest
from tasks.ops import ACTIVATIONS, POOLINGS, padded_length, pool_tokens, sigmoid, softmax
from tasks.registry import TASKS
from tasks.text_ranking import relevance_logit
from tasks.windows import Tokens, combine_vectors, content_tokens
from tests.tiny_models import _wordpiece

VOCAB = Vocab(unk_id=None, word_aware=True, decode=lambda tokens: " ".join(tokens).replace(" ##", ""))


def test_texts() -> None:
    assert params.texts("a").single and params.texts(["a", "b"]).texts == ["a", "b"]
    with pytest.raises(InputError, match="empty"):
        params.texts("")
    with pytest.raises(InvalidRequest, match=r"inputs\[1\] must be a string, got a number"):
        params.texts(["a", 1])
    with pytest.raises(InvalidRequest, match="got an object"):
        params.texts({"a": 1})


def test_parameter_helpers_name_the_field() -> None:
    assert params.integer({"k": 3.0}, "k", 1) == 3
    assert params.integer({"k": None}, "k", 1, nullable=True) is None
    with pytest.raises(InvalidRequest, match=r"parameters\.k must be an integer or null"):
        params.integer({"k": True}, "k", 1, nullable=True)
    with pytest.raises(InvalidRequest, match="between 1 and 5"):
        params.integer({"k": 9}, "k", 1, minimum=1, maximum=5)
    assert params.choice({"c": "max"}, "c", ("max", "min"), "min") == "max"
    with pytest.raises(InvalidRequest, match="between 0 and 9223372036854775807"):  # 64 bits, as JSON parsers
        params.integer({"k": 2**63}, "k", 1)
    with pytest.raises(InvalidRequest, match=r"9223372036854775807, got 1e\+30$"):  # as sent, not 31 digits
        params.integer({"k": 1e30}, "k", 1)
    # Exactly as listed (the OpenAPI document states them as an enum): "MAX" is not "max".
    for wrong in ("x", "MAX"):
        with pytest.raises(InvalidRequest, match=f"one of max, min; got '{wrong}'"):
            params.choice({"c": wrong}, "c", ("max", "min"), "min")
    with pytest.raises(InvalidRequest, match="list of strings"):
        params.string_list({"l": "O"}, "l", ())
    # null is the default, as the schema says ("type": ["array", "null"]): ignore_labels null still leaves "O" out.
    assert params.string_list({"l": None}, "l", ("O",)) == ("O",)
    # A fraction is no integer: top_k 2.5 was not cut to 2 without a word.
    with pytest.raises(InvalidRequest, match=r"parameters\.k must be an integer, got a number"):
        params.integer({"k": 2.5}, "k", 1)


def test_every_task_declares_its_serving_side() -> None:
    for task in TASKS.values():
        assert task.parameters and all(help for help in task.parameters.values())
        assert callable(task.parse_inputs) and callable(task.parse_params) and callable(task.postprocess)
    assert [t.name for t in TASKS.values() if t.embeddings] == ["feature-extraction"]
    assert [t.name for t in TASKS.values() if not t.windows] == ["text-ranking", "sparse-embedding"]


@pytest.mark.parametrize("stride", [0, 1, 2, 3, 5])
def test_window_merge_keeps_every_token_once(stride: int) -> None:
    tok = _wordpiece()
    text = "Angela Merkel met Emmanuel Macron in Paris and Berlin yesterday morning."
    whole = tok.encode(text)
    content = tok.encode(text, add_special_tokens=False)
    content.truncate(8, stride=stride)
    first = tok.post_process(content)
    windows = [first, *first.overflowing]
    # Each window's rows carry the token ids, so the merge's choices can be checked.
    rows = [np.array(w.ids, dtype=np.float32)[:, None] for w in windows]
    merged = content_tokens(windows, rows, stride)
    assert merged.ids == whole.ids[1:-1] and merged.tokens == whole.tokens[1:-1]
    assert merged.offsets == whole.offsets[1:-1] and merged.index == list(range(1, len(whole.ids) - 1))
    assert merged.rows[:, 0].tolist() == whole.ids[1:-1]


def test_combine_vectors() -> None:
    a, b = np.array([1.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32)
    assert np.allclose(combine_vectors([a, b], [3, 1], "mean"), [0.75, 0.25])
    assert np.allclose(combine_vectors([a, b], [3, 1], "max"), [1, 1])
    assert combine_vectors([a], [3], "mean") is a


def test_entities_group_b_and_i_tags() -> None:
    labels = ("O", "B-PER", "I-PER", "B-LOC")
    text = "Angela Merkel in Paris"
    tokens = Tokens(
        ids=[1, 2, 3, 4],
        tokens=["Angela", "Merkel", "in", "Paris"],
        offsets=[(0, 6), (7, 13), (14, 16), (17, 22)],
        index=[1, 2, 3, 4],
        rows=np.zeros((4, 4), np.float32),
    )
    scores = np.eye(4, dtype=np.float32)[[1, 2, 0, 3]] * 0.9 + 0.025
    found = entities.aggregate(text, tokens, scores, "simple", labels, VOCAB, ("O",))
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in found] == [
        ("PER", "Angela Merkel", 0, 13),
        ("LOC", "Paris", 17, 22),
    ]
    each = entities.aggregate(text, tokens, scores, "none", labels, VOCAB, ())
    assert [e["entity"] for e in each] == ["B-PER", "I-PER", "O", "B-LOC"]
    assert all(isinstance(e["score"], float) for e in each)


def test_the_tokenizers_decoder_rebuilds_words() -> None:
    tok: Tokenizer = _wordpiece()
    assert tok.decoder is not None and tok.decoder.decode(["mer", "##k", "##el"]) == "merkel"


@pytest.mark.parametrize("mode", POOLINGS)
def test_pooling_is_sentence_transformers_pooling(mode: str) -> None:
    """The one pooling (server and gate) gives sentence-transformers' Pooling module's vectors for a padded
    batch, each row pooled over its own tokens."""
    import torch
    from sentence_transformers.sentence_transformer.modules import Pooling

    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((2, 6, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    theirs = Pooling(4, pooling_mode="mean_sqrt_len_tokens" if mode == "mean_sqrt_len" else mode)(
        {"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(mask)}
    )["sentence_embedding"].numpy()
    for i, n in enumerate(mask.sum(axis=1)):
        assert np.allclose(pool_tokens(hidden[i, :n], mode), theirs[i], atol=1e-6)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_are_torchs(name: str) -> None:
    """The activations a Dense module or a cross-encoder's config names compute what its torch module does
    (GELU the exact erf form, torch.nn.GELU()'s default), so the served vectors and scores are the model's."""
    import torch

    modules = {
        "identity": torch.nn.Identity(),
        "sigmoid": torch.nn.Sigmoid(),
        "tanh": torch.nn.Tanh(),
        "relu": torch.nn.ReLU(),
        "gelu": torch.nn.GELU(),
    }
    x = np.linspace(-6, 6, 97, dtype=np.float32)
    assert np.allclose(ACTIVATIONS[name](x), modules[name](torch.from_numpy(x)).numpy(), atol=1e-6)


def test_a_call_is_padded_to_the_runtimes_multiple_never_past_the_models_positions() -> None:
    """OpenVINO pads a call to a multiple of its tokens (fewer shapes to compile); a model whose maximum is no
    multiple of it (the tiny models' 126) must still get at most its maximum, or its position table overflows."""
    assert padded_length(20, 16, 126) == 32
    assert padded_length(120, 16, 126) == 126
    assert padded_length(126, 16, 126) == 126
    assert padded_length(20, 1, 126) == 20 and padded_length(20, 16) == 20  # no maximum known: no padding


def test_multi_label_rankers_rank_by_the_last_label() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 3)).astype(np.float32)
    assert np.allclose(sigmoid(relevance_logit(logits)), softmax(logits)[:, -1], atol=1e-6)
    assert np.array_equal(relevance_logit(logits[:, :1]), logits[:, 0])


def test_the_ranking_instruction_is_documented_only_for_lm_rerankers() -> None:
    # A cross-encoder refuses `instruction` (422), so its OpenAPI document must not offer it.
    spec = TASKS["text-ranking"].parameters["instruction"]
    assert spec.schema({"pair_template": False}) is None
    assert spec.schema({"pair_template": True}) == {"type": "string", "description": spec.help}
