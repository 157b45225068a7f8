"""Inspect a Hugging Face model folder before any work: refuse early, with a reason, what cannot be served."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container.optimize import sparse as sparse_source
from container.optimize.errors import UnsupportedModel
from tasks.base import TaskSpec

# Families whose position ids start after padding_idx (RoBERTa-style embeddings), so two positions are not
# usable. Any other family is taken at its max_position_embeddings; a wrong guess fails the reference stage.
PADDING_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "mpnet", "xlm-roberta-xl")
# sentence-transformers / CrossEncoder activation class paths -> tasks.ops.ACTIVATIONS names.
ACTIVATION_CLASSES = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
}
ST_POOLING_KEYS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
HUGE_MAX_LENGTH = 1_000_000
# A causal LM served as a reranker reads each (query, document) pair in its model card's chat template and
# scores the next token "yes" against "no" (Qwen3-Reranker). The fixed prefix and suffix become the serving
# tokenizer's post-processor (tokenized on their own, as the card does); the middle is formatted per pair.
QWEN3_RERANKER = {
    "prefix": "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n',
    "suffix": "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "format": "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    "instruction": "Given a web search query, retrieve relevant passages that answer the query",
}


@dataclass(frozen=True)
class DenseModule:
    """A sentence-transformers Dense module: its folder (weights read at bundle time) and its config."""

    weights: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str


@dataclass(frozen=True)
class SourceModel:
    """What the optimizer learned from the folder; everything later stages need about the source.
    lowercase: the bundle's tokenizer lowercases every text first (sentence_bert_config.json's do_lower_case,
    which sentence-transformers applies whatever the tokenizer does)."""

    path: Path
    config: dict[str, Any]
    model_type: str
    architecture: str
    labels: dict[int, str]
    multi_label: bool
    pooling: str | None
    normalize: bool
    max_length: int
    weights: list[Path]
    weights_sha256: str
    dense: list[DenseModule] = field(default_factory=list)
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    activation: str | None = None
    trust_remote_code: bool = False
    pad_id: int | None = None
    scorer: tuple[int, int] | None = None
    pair_template: dict[str, str] = field(default_factory=dict)
    sparse: sparse_source.SparseModel | None = None  # sparse-embedding: SPLADE's pooling or bge-m3's heads
    lowercase: bool = False
    regression: bool = False  # the checkpoint's problem_type is regression: its logits are the scores
    truncate_dim: int | None = None  # embeddings: the dimensions a vector keeps by default (see _truncate_dim)


ST_CONFIG = "config_sentence_transformers.json"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise UnsupportedModel(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UnsupportedModel(f"{path} should hold a JSON object")
    return data


def _weights(folder: Path, allow_pickle: bool) -> list[Path]:
    safetensors = sorted(folder.glob("*.safetensors"))
    if safetensors:
        return safetensors
    pickles = sorted(folder.glob("pytorch_model*.bin"))
    if pickles and allow_pickle:
        return pickles
    if pickles:
        raise UnsupportedModel(
            f"{folder} has weights only as pickle ({pickles[0].name}), which can run arbitrary code when "
            "loaded; convert them to safetensors or pass --allow-pickle if you trust the source"
        )
    raise UnsupportedModel(f"{folder} has no weights (model.safetensors or pytorch_model.bin)")


def _activation(path: str, where: str) -> str:
    name = ACTIVATION_CLASSES.get(path)
    if name is None:
        raise UnsupportedModel(
            f"{where} uses activation {path!r}; hare applies {', '.join(ACTIVATION_CLASSES)} in numpy at serve time"
        )
    return name


def _modules(folder: Path) -> list[dict[str, Any]]:
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return []
    modules = json.loads(modules_file.read_text())
    return sorted(modules, key=lambda m: int(m.get("idx", 0))) if isinstance(modules, list) else []


def _pooling_mode(folder: Path, module: dict[str, Any]) -> str:
    cfg = _read_json(folder / module["path"] / "config.json")
    named = cfg.get("pooling_mode")
    if named is None:
        modes = [name for name, key in ST_POOLING_KEYS.items() if cfg.get(key)]
    else:  # a name, or (sentence-transformers 6) a list of names
        modes = [str(m).removesuffix("_tokens") for m in ([named] if isinstance(named, str) else named)]
    if len(modes) != 1 or modes[0] not in ST_POOLING_KEYS:
        raise UnsupportedModel(
            f"{folder} pools with {', '.join(modes) or 'no mode'}; hare supports exactly one of "
            f"{', '.join(ST_POOLING_KEYS)}"
        )
    # Leaving the prompt's tokens out of pooling changes nothing for lasttoken (the last token is never the
    # prompt's). sentence-transformers 6's cls then takes the first token after the prompt, and the other modes
    # average past it: hare would need each request's prompt length.
    if cfg.get("include_prompt") is False and modes[0] != "lasttoken":
        raise UnsupportedModel(
            f"{folder} pools {modes[0]} without its prompt tokens (include_prompt false); hare pools every token "
            "(with lasttoken pooling, whose last token is never the prompt's, such folders are served)"
        )
    return modes[0]


def _dense(folder: Path, module: dict[str, Any], allow_pickle: bool) -> DenseModule:
    path = folder / module["path"]
    cfg = _read_json(path / "config.json")
    if cfg.get("use_residual"):
        raise UnsupportedModel(f"{path} adds its input to its output (use_residual true), which hare's Dense does not")
    if cfg.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise UnsupportedModel(
            f"{path} projects {cfg['module_input_name']}; hare applies a Dense to the pooled sentence embedding only"
        )
    return DenseModule(
        weights=_weights(path, allow_pickle)[0],
        in_features=int(cfg["in_features"]),
        out_features=int(cfg["out_features"]),
        bias=bool(cfg.get("bias", True)),
        activation=_activation(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"), str(path)),
    )


def _sentence_transformers(folder: Path, allow_pickle: bool) -> tuple[str | None, list[DenseModule], bool]:
    """Pooling, Dense modules and Normalize from sentence-transformers' modules.json, in their order.

    Modules hare cannot apply (anything after the transformer but Pooling, Dense and Normalize, or those in
    another order than hare applies them: pooling, then each Dense, then Normalize) are refused: serving
    without them would answer different vectors than the model's own library.
    """
    pooling: str | None = None
    dense: list[DenseModule] = []
    normalize = False
    for module in _modules(folder):
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind == "Transformer":
            if module.get("path", "") not in ("", "."):
                raise UnsupportedModel(
                    f"{folder} keeps its transformer in {module['path']}/ (an older sentence-transformers layout); "
                    f"hare reads it at the folder's top: move the files of {module['path']}/ into {folder} and set "
                    'its "path" in modules.json to ""'
                )
            continue
        if kind == "Pooling" and pooling is not None:
            continue
        if (kind == "Dense" and (pooling is None or normalize)) or (kind == "Pooling" and dense):
            raise UnsupportedModel(
                f"{folder} applies its modules in the order {', '.join(_kinds(folder))}; hare applies pooling, "
                "then each Dense, then Normalize"
            )
        if kind == "Pooling":
            pooling = _pooling_mode(folder, module)
        elif kind == "Dense":
            dense.append(_dense(folder, module, allow_pickle))
        elif kind == "Normalize":
            normalize = True
        else:
            raise UnsupportedModel(
                f"{folder} has a sentence-transformers module {kind!r} hare does not apply; supported after "
                "the transformer: Pooling, Dense, Normalize"
            )
    return pooling, dense, normalize


def _kinds(folder: Path) -> list[str]:
    return [str(m.get("type", "")).rsplit(".", 1)[-1] for m in _modules(folder)]


def _st_config(folder: Path) -> dict[str, Any]:
    """config_sentence_transformers.json, as SentenceTransformer and SparseEncoder save it ({} without one)."""
    path = folder / ST_CONFIG
    return _read_json(path) if path.is_file() else {}


def _st_module_config(folder: Path) -> dict[str, Any]:
    """sentence_bert_config.json, the Transformer module's settings ({} without one)."""
    path = folder / "sentence_bert_config.json"
    return _read_json(path) if path.is_file() else {}


def _truncate_dim(folder: Path, cfg: dict[str, Any], width: int | None) -> int | None:
    """The dimensions sentence-transformers 6's encode keeps of every vector of a folder saved with truncate_dim
    (`cfg`: config_sentence_transformers.json): the bundle's default `dimensions`. None where it cuts nothing
    (unset, or at least the vector's `width`, as encode's slice keeps every dimension then)."""
    value = cfg.get("truncate_dim")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UnsupportedModel(f"{folder / ST_CONFIG}: truncate_dim must be a positive integer or null, got {value!r}")
    return None if width is not None and value >= width else value


def _prompts(folder: Path, cfg: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """prompts and default_prompt_name from config_sentence_transformers.json (`cfg`)."""
    path = folder / ST_CONFIG
    prompts = {str(k): str(v) for k, v in (cfg.get("prompts") or {}).items()}
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise UnsupportedModel(f"{path}: default_prompt_name {default!r} is not one of its prompts {list(prompts)}")
    return prompts, default


def _cross_encoder_activation(config: dict[str, Any]) -> str:
    """The activation CrossEncoder.predict applies to the logits: the config's, else sigmoid for one logit
    and identity for more (sentence-transformers' own default)."""
    path = (config.get("sentence_transformers") or {}).get("activation_fn") or config.get(
        "sbert_ce_default_activation_function"
    )
    if path:
        return _activation(str(path), "the cross-encoder's config")
    return "sigmoid" if len(config.get("id2label") or {0: ""}) == 1 else "identity"


def _max_length(folder: Path, config: dict[str, Any]) -> int:
    """The maximum sentence-transformers reads with: sentence_bert_config.json's max_seq_length, else the
    tokenizer's model_max_length (the first overrides the second, as sentence-transformers sets it), within the
    position embeddings."""
    limits: list[int] = []
    tc = folder / "tokenizer_config.json"
    if isinstance(declared := _st_module_config(folder).get("max_seq_length"), int):
        limits.append(declared)
    elif tc.is_file():
        declared = _read_json(tc).get("model_max_length")
        if isinstance(declared, int | float) and declared < HUGE_MAX_LENGTH:
            limits.append(int(declared))
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int):
        # RoBERTa-style models start positions after padding_idx, so two slots are not usable.
        pad = config.get("pad_token_id")  # null in some configs: the tokenizer's pad then, 1 for RoBERTa's
        offset = (pad if isinstance(pad, int) else 1) + 1 if config["model_type"] in PADDING_OFFSET_POSITIONS else 0
        limits.append(positions - offset)
    if not limits:
        raise UnsupportedModel(f"{folder} declares no maximum length (max_position_embeddings)")
    return min(limits)


def _token_ids(folder: Path, *tokens: Any) -> list[int | None]:
    """The ids of `tokens` (strings, or tokenizer_config's {"content": ...}) in the folder's tokenizer.json,
    read once (a decoder's is tens of MB); None for each one it lacks."""
    names = [t.get("content") if isinstance(t, dict) else t for t in tokens]
    if not (folder / "tokenizer.json").is_file():
        return [None for _ in names]
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    found = [tokenizer.token_to_id(n) if isinstance(n, str) else None for n in names]
    return [None if i is None else int(i) for i in found]


def _pad_id(folder: Path, config: dict[str, Any]) -> int | None:
    """The pad token's id: config.json's pad_token_id (what transformers' heads compare with), else the
    tokenizer's pad_token."""
    if isinstance(config.get("pad_token_id"), int):
        return int(config["pad_token_id"])
    tc = folder / "tokenizer_config.json"
    return _token_ids(folder, _read_json(tc).get("pad_token"))[0] if tc.is_file() else None


def _scorer(folder: Path, architecture: str) -> tuple[int, int]:
    """A causal LM taken as a reranker: the ids of its "no" and "yes" tokens. Its tokenizer must also know the
    chat markers of Qwen3-Reranker's template, the only one hare writes pairs in: an LM trained on another
    template (bge-reranker-v2-gemma's "A: ... B: ...") would score text it has never seen."""
    markers = ("<|im_start|>", "<|im_end|>")
    no, yes, *found = _token_ids(folder, "no", "yes", *markers)
    missing = [t for t, i in zip(markers, found, strict=True) if i is None]
    if no is None or yes is None or missing:
        lacks = 'no "yes"/"no" tokens' if no is None or yes is None else f"no {' or '.join(missing)} token"
        raise UnsupportedModel(
            f"{folder} is a causal LM ({architecture}) without a ranking head; hare ranks with an LM only as "
            'Qwen3-Reranker does (its chat template, the next token "yes" against "no"), and its tokenizer has '
            f"{lacks}. Give a folder with a sequence-classification head (AutoModelForSequenceClassification)"
        )
    return no, yes


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


# Families whose checkpoints carry remote code from before transformers had their classes (transformers 5 has
# them): their auto_map is not needed. Only these: a folder of another type whose auto_map names its own code
# (a BERT with a changed forward) would otherwise be built, and checked, as plain BERT, without a word.
NATIVE_SINCE_TRANSFORMERS_5 = frozenset({"nomic_bert", "gte", "jina_embeddings_v3", "eurobert"})


def _native(model_type: str) -> bool:
    """Whether the folder's auto_map only stands for classes transformers now has itself, which it loads
    without trusting remote code."""
    from transformers import CONFIG_MAPPING

    return model_type in NATIVE_SINCE_TRANSFORMERS_5 and model_type in CONFIG_MAPPING


def inspect_source(
    folder: Path, task: TaskSpec, allow_pickle: bool = False, trust_remote_code: bool = False
) -> SourceModel:
    """Check that `folder` is a model hare can optimize for `task`, and read what the bundle needs.

    No family list: any model transformers' Auto classes load with the task's head goes on to export; a
    family is refused only when a stage fails (the pipeline names it).
    """
    if not folder.is_dir():
        what = "is a file; give the model's folder" if folder.is_file() else "does not exist"
        raise UnsupportedModel(f"model folder {folder} {what}")
    if not (folder / "config.json").is_file():
        raise UnsupportedModel(f"{folder} has no config.json; is it a Hugging Face model folder?")
    config = _read_json(folder / "config.json")
    if "auto_map" in config and not trust_remote_code and not _native(config.get("model_type", "")):
        raise UnsupportedModel(
            f"{folder} needs its own Python code (its config has auto_map); hare refuses to run a model's code "
            "unless you pass --trust-remote-code, which runs it at build time only (the bundle is plain ONNX)"
        )
    model_type = config.get("model_type", "")
    if not model_type:
        raise UnsupportedModel(f"{folder}/config.json has no model_type; transformers cannot pick its classes")
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures else f"{model_type} (base model)"
    # A sparse model is SPLADE (a masked LM) or bge-m3 (a base encoder with head files): its own check.
    # SparseEncoder folders declare prompts (and max_active_dims) as SentenceTransformer folders do
    st_config = _st_config(folder) if task.embeddings or task.sparse else {}
    sparse = sparse_source.inspect(folder, architectures, st_config) if task.sparse else None
    if task.architectures and sparse is None and not any(a.endswith(task.architectures) for a in architectures):
        raise UnsupportedModel(
            f"{folder} has no {task.name} head (architectures: {architectures or 'none'}; expected one ending "
            f"in {' or '.join(task.architectures)})"
        )
    weights = _weights(folder, allow_pickle)
    prompts, default_prompt = _prompts(folder, st_config)
    if task.embeddings:
        pooling, dense, normalize = _sentence_transformers(folder, allow_pickle)
        width = dense[-1].out_features if dense else config.get("hidden_size")
        truncate_dim = _truncate_dim(folder, st_config, width if isinstance(width, int) else None)
    else:
        pooling, dense, normalize, truncate_dim = None, [], False, None
    id2label = config.get("id2label") or {}
    scorer = _scorer(folder, architecture) if task.pairs and architecture.endswith("ForCausalLM") else None
    return SourceModel(
        path=folder,
        config=config,
        model_type=model_type,
        architecture=architecture,
        labels={int(k): str(v) for k, v in id2label.items()} if task.architectures and not (scorer or sparse) else {},
        multi_label=config.get("problem_type") == "multi_label_classification",
        regression=config.get("problem_type") == "regression",
        pooling=pooling or task.default_pooling,
        normalize=normalize,
        max_length=_max_length(folder, config),
        weights=weights,
        weights_sha256=_sha256([*weights, *(sparse.heads.values() if sparse else ())]),
        dense=dense,
        prompts=prompts,
        default_prompt_name=default_prompt,
        activation="sigmoid" if scorer else _cross_encoder_activation(config) if task.pairs else None,
        trust_remote_code=trust_remote_code,
        pad_id=_pad_id(folder, config),
        scorer=scorer,
        pair_template=dict(QWEN3_RERANKER) if scorer else {},
        sparse=sparse,
        lowercase=task.embeddings and _st_module_config(folder).get("do_lower_case") is True,
        truncate_dim=truncate_dim,
    )


def dense_weights(modules: list[DenseModule]) -> dict[str, Any]:
    """The Dense modules' weights as numpy arrays, named "{i}.weight" / "{i}.bias" (the bundle's dense.npz)."""
    arrays: dict[str, Any] = {}
    for i, module in enumerate(modules):
        if module.weights.suffix == ".safetensors":
            from safetensors.numpy import load_file

            tensors = load_file(str(module.weights))
        else:  # pickle, accepted with --allow-pickle; weights_only keeps torch from running arbitrary code
            import torch

            tensors = {k: v.numpy() for k, v in torch.load(str(module.weights), weights_only=True).items()}
        arrays[f"{i}.weight"] = tensors["linear.weight"].astype("float32")
        if module.bias:
            arrays[f"{i}.bias"] = tensors["linear.bias"].astype("float32")
    return arrays
