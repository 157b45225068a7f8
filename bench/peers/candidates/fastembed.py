"""The `fastembed` candidate: fastembed's TextEmbedding, fp32, on Optimum's ONNX export (what fastembed
downloads for this model is such an export; offline it is pointed at ours with specific_model_path)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from bench.peers.candidates.base import Encoder, Skip, Vectors, module, quiet
from bench.peers.candidates.sentence_transformers import export_folder
from bench.peers.candidates.workspace import Workspace, weights_id


def load_fastembed(space: Workspace, threads: int) -> Encoder:
    TextEmbedding = module("fastembed").TextEmbedding
    description = module("fastembed.common.model_description")
    ModelSource, PoolingType = description.ModelSource, description.PoolingType

    folder, name = fastembed_folder(space)
    pooling, normalize, dim = st_head(space.model_dir)
    poolings = {"mean": PoolingType.MEAN, "cls": PoolingType.CLS}
    if pooling not in poolings:
        raise Skip(f"fastembed pools by mean or CLS only, this model by {pooling}")
    with quiet():
        if not any(m.get("model") == name for m in TextEmbedding.list_supported_models()):
            TextEmbedding.add_custom_model(
                model=name,
                pooling=poolings[pooling],
                normalization=normalize,
                sources=ModelSource(hf=name),
                dim=dim,
                model_file="model.onnx",
            )
        model = TextEmbedding(model_name=name, threads=threads, specific_model_path=str(folder))

    def encode(texts: list[str]) -> Vectors:
        return np.stack(list(model.embed(texts, batch_size=len(texts)))).astype(np.float32)

    return Encoder(encode, model=model)


def fastembed_folder(space: Workspace) -> tuple[Path, str]:
    """A folder fastembed loads offline: Optimum's fp32 export and the tokenizer files; the custom name.

    fastembed truncates at the smaller of tokenizer_config.json's model_max_length and max_length; the
    tokenizer files sentence-transformers saves can say less than the model's max_seq_length (128 against
    256 for all-MiniLM-L6-v2), so the folder's config says max_seq_length, as sentence-transformers reads
    it (and as fastembed describes its own copy of all-MiniLM-L6-v2: 256 tokens)."""
    source = export_folder(space, "onnx")
    folder = space.work / "fastembed"
    if not (folder / "model.onnx").is_file():
        tmp = space.work / ".fastembed-partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (source / name).is_file():
                shutil.copyfile(source / name, tmp / name)
        longest = max_seq_length(space.model_dir)
        config_file = tmp / "tokenizer_config.json"
        if config_file.is_file():
            config = json.loads(config_file.read_text())
            config.pop("max_length", None)  # the tokenizer's own truncation, not the model's
            if longest is not None:
                config["model_max_length"] = longest
            config_file.write_text(json.dumps(config, indent=2))
        shutil.copyfile(source / "onnx" / "model.onnx", tmp / "model.onnx")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    return folder, f"hare-bench/{space.model_dir.name}-{weights_id(space.model_dir)}"


def max_seq_length(model_dir: Path) -> int | None:
    """sentence-transformers' truncation length for the folder (sentence_bert_config.json), if it says one."""
    config = model_dir / "sentence_bert_config.json"
    value = json.loads(config.read_text()).get("max_seq_length") if config.is_file() else None
    return int(value) if value else None


def st_head(model_dir: Path) -> tuple[str, bool, int]:
    """The sentence-transformers folder's pooling mode, whether it normalizes, and the vector size."""
    modules = json.loads((model_dir / "modules.json").read_text()) if (model_dir / "modules.json").is_file() else []
    normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
    pooling_dir = next((m.get("path", "") for m in modules if m.get("type", "").endswith("Pooling")), "1_Pooling")
    config_file = model_dir / pooling_dir / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    modes = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max"}
    pooling = next((mode for k, mode in modes.items() if config.get(k)), "mean")
    dim = int(
        config.get("word_embedding_dimension") or json.loads((model_dir / "config.json").read_text())["hidden_size"]
    )
    return pooling, normalize, dim
