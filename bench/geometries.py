"""Model folders with the geometry of real checkpoints and random weights, for speed runs: speed does not
depend on the weights' values, and no checkpoint can be downloaded here. Every folder uses the default model's
BERT uncased vocabulary (tokenization costs about the same as each family's own tokenizer).

    hare bench model mpnet-base DIR                              write the folder (one it wrote: kept as it is)
    hare bench run DIR --task feature-extraction --baseline vanilla --seq 8,128
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container.defaults import default_model_dir
from container.optimize.source import ST_POOLING_KEYS
from tasks.errors import InputError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
# Written into every folder `build` makes, naming its geometry: only such a folder is reused (and its
# tokenizer_config.json brought up to date); any other model folder is the user's, never written to.
MARKER = "bench-geometry.json"
LABELS = {"id2label": {0: "NEGATIVE", 1: "POSITIVE"}, "label2id": {"NEGATIVE": 0, "POSITIVE": 1}}


@dataclass(frozen=True)
class Geometry:
    """task: what the folder is built for. config/model: transformers class names. settings: the real
    checkpoint's config.json values that decide speed. tokenizer_class: declared in tokenizer_config.json
    (None: BERT's, without token_type_ids, which these families' forward() does not take or ignores).
    sentence_transformers: write a normalizing sentence-transformers folder pooling with `pooling`.
    sparse_terms: a SPLADE geometry's output bias leaves about this many vocabulary entries reachable, so its
    vectors have a trained SPLADE's few hundred non-zero weights (random weights would make about half the
    vocabulary non-zero, and the answer's size, not the model, would be measured). labels: the head's
    id2label/label2id, as the real checkpoint names its classes."""

    task: str
    config: str
    model: str
    settings: dict[str, Any]
    tokenizer_class: str | None = None
    sentence_transformers: bool = False
    pooling: str = "mean"
    hidden: Callable[[dict[str, Any]], int] = field(default=lambda s: int(s["hidden_size"]))
    sparse_terms: int | None = None
    labels: dict[str, Any] = field(default_factory=dict)


GEOMETRIES: dict[str, Geometry] = {
    # distilbert-base-uncased-finetuned-sst-2-english, the Infinity case study's model.
    "distilbert-base": Geometry(
        "text-classification",
        "DistilBertConfig",
        "DistilBertForSequenceClassification",
        dict(vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072, max_position_embeddings=512),
        tokenizer_class="DistilBertTokenizer",
        hidden=lambda s: int(s["dim"]),
        labels=LABELS,
    ),
    # No real checkpoint: a classifier whose call takes well under 0.1 ms on one core, so that what a run
    # measures with it is the server's own cost per request (the ceiling: req/s with next to no model).
    "tiny-classifier": Geometry(
        "text-classification",
        "BertConfig",
        "BertForSequenceClassification",
        dict(
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=512,
        ),
        labels=LABELS,
    ),
    # sentence-transformers/all-mpnet-base-v2.
    "mpnet-base": Geometry(
        "feature-extraction",
        "MPNetConfig",
        "MPNetModel",
        dict(
            vocab_size=30527,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=514,
            relative_attention_num_buckets=32,
            pad_token_id=0,  # the BERT vocabulary's [PAD]
        ),
        sentence_transformers=True,
    ),
    # naver/splade-cocondenser-ensembledistil: BERT-base with its masked-LM head (SparseEncoder's SPLADE).
    "splade-base": Geometry(
        "sparse-embedding",
        "BertConfig",
        "BertForMaskedLM",
        dict(
            vocab_size=30522,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
        ),
        sparse_terms=300,
    ),
    # microsoft/deberta-v3-base with a two-label head.
    "deberta-v3-base": Geometry(
        "text-classification",
        "DebertaV2Config",
        "DebertaV2ForSequenceClassification",
        dict(
            vocab_size=128100,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
            relative_attention=True,
            position_buckets=256,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            max_relative_positions=-1,
            type_vocab_size=0,
            pad_token_id=0,
        ),
        labels=LABELS,
    ),
    # BAAI/bge-m3's dense embedding: XLM-RoBERTa large (24 layers of 1,024, a 250,002-entry vocabulary), CLS
    # pooling, normalized; issue 47's large encoder on a GPU.
    "bge-m3": Geometry(
        "feature-extraction",
        "XLMRobertaConfig",
        "XLMRobertaModel",
        dict(
            vocab_size=250002,
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            max_position_embeddings=8194,
            type_vocab_size=1,
            layer_norm_eps=1e-5,
            pad_token_id=0,  # the BERT vocabulary's [PAD] (the real tokenizer's is 1)
        ),
        sentence_transformers=True,
        pooling="cls",
    ),
    # Qwen/Qwen3-Embedding-0.6B: a decoder (grouped-query attention, rotary positions), last-token pooling.
    "qwen3-embedding-0.6b": Geometry(
        "feature-extraction",
        "Qwen3Config",
        "Qwen3Model",
        dict(
            vocab_size=151669,
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            max_position_embeddings=32768,
            rope_theta=1_000_000,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            pad_token_id=0,  # the BERT vocabulary's [PAD]; its [SEP] ends each text as Qwen's EOS does
        ),
        sentence_transformers=True,
        pooling="lasttoken",
    ),
}


def build(name: str, folder: Path, seed: int = 0, cache: bool = False) -> Path:
    """Write geometry `name` into `folder` (kept as it is when this function built it there already). cache:
    `folder` is the bench's own (the headline's), reused as it is, marked or built before folders were."""
    geometry = GEOMETRIES[name]
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        built = _built(folder)
        if built == name or cache:
            _tokenizer_config(folder, geometry)
            return folder
        # A real checkpoint of this geometry has the same config.json: only the marker tells ours apart.
        what = f"the {built} geometry" if built else "a model `hare bench model` did not write"
        raise InputError(f"{folder} holds {what}, not a {name} model folder; give a new or empty folder")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):  # never replaced: it is not ours
        what = "a file" if not folder.is_dir() else "a folder of other files"
        raise InputError(f"{folder} is {what}, not a {name} model folder; give a new or empty folder")
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
    except OSError as exc:  # /proc/nope: a bare "[Errno 2] No such file or directory: '/proc/nope.partial'"
        raise InputError(f"{folder} cannot be written ({exc.strerror}); give a folder this user can write in") from None
    try:
        _write(geometry, partial, seed)
        (partial / MARKER).write_text(json.dumps({"geometry": name}))
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if folder.exists():  # empty
        folder.rmdir()
    partial.rename(folder)
    return folder


def _built(folder: Path) -> str | None:
    """The geometry `build` wrote into `folder`, from its marker (None: no marker, not ours)."""
    try:
        built = json.loads((folder / MARKER).read_text()).get("geometry")
    except (OSError, ValueError, AttributeError):
        return None
    return built if isinstance(built, str) else None


def _write(geometry: Geometry, partial: Path, seed: int) -> None:
    import torch
    import transformers

    for file in TOKENIZER_FILES:
        shutil.copyfile(default_model_dir() / file, partial / file)
    _tokenizer_config(partial, geometry)
    config = getattr(transformers, geometry.config)(**geometry.settings, **geometry.labels)
    torch.manual_seed(seed)
    model = getattr(transformers, geometry.model)(config).eval()
    if geometry.sparse_terms:
        _sparse_bias(model, geometry.sparse_terms, seed)
    model.save_pretrained(str(partial), safe_serialization=True)
    if geometry.sentence_transformers:
        _sentence_transformers(partial, geometry.hidden(geometry.settings), geometry.pooling)


def _sparse_bias(model: Any, terms: int, seed: int) -> None:
    """Output bias 0 for `terms` random vocabulary entries and -3 for the rest: random logits have a standard
    deviation near 0.55 (768 dims x N(0, 0.02) weights), so only those entries come out positive."""
    import torch

    bias = model.get_output_embeddings().bias
    with torch.no_grad():
        bias.fill_(-3.0)
        bias[torch.randperm(len(bias), generator=torch.Generator().manual_seed(seed))[:terms]] = 0.0


def _tokenizer_config(folder: Path, geometry: Geometry) -> None:
    """Declare the tokenizer the model takes: the default model's says BertTokenizer, whose token_type_ids
    DistilBERT's and MPNet's forward() refuse, so the vanilla pipeline would fail on every request."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.pop("name_or_path", None)
    config |= {"tokenizer_class": geometry.tokenizer_class or "BertTokenizer"}
    config |= {"model_input_names": ["input_ids", "attention_mask"]}
    path.write_text(json.dumps(config, indent=2))


def _sentence_transformers(folder: Path, width: int, pooling: str) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 384, "do_lower_case": False}))
    (folder / "1_Pooling").mkdir()
    # Every mode spelled out, as sentence-transformers saves them (one left out would take its default).
    modes = {key: mode == pooling for mode, key in ST_POOLING_KEYS.items()}
    config = {"word_embedding_dimension": width, **modes}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "2_Normalize").mkdir()
