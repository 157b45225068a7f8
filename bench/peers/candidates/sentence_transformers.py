"""sentence-transformers' candidates: `torch` (the reference), `onnx` (Optimum's export) and `onnx-int8` (its
dynamic quantization with this CPU's configuration); also how every peer loads a SentenceTransformer and
where its exports are kept (the OpenVINO and fastembed candidates start from them too)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers.candidates.base import Encoder, Vectors, module, quiet
from bench.peers.candidates.workspace import Workspace


def sentence_transformer(path: Path, backend: str = "torch", **model_kwargs: Any) -> Any:
    """A SentenceTransformer on the CPU from a local folder, quietly."""
    st = module("sentence_transformers")
    with quiet():
        return st.SentenceTransformer(
            str(path), device="cpu", backend=backend, model_kwargs=model_kwargs or None, local_files_only=True
        )


def st_encoder(model: Any, enter: Callable[[], None] = lambda: None) -> Encoder:
    """The model's own encode call, a whole call's texts as one batch."""

    def encode(texts: list[str]) -> Vectors:
        vectors = model.encode(texts, batch_size=len(texts), convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    return Encoder(encode, enter, model=model)


def export_folder(space: Workspace, backend: str) -> Path:
    """`work/<backend>`: the model saved by sentence-transformers with its `backend` export inside."""
    folder = space.work / backend
    marker = folder / ("onnx/model.onnx" if backend == "onnx" else "openvino/openvino_model.xml")
    if marker.is_file():
        return folder
    tmp = space.work / f".{backend}-partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model = sentence_transformer(space.model_dir, backend=backend)
    with quiet():
        model.save_pretrained(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def load_torch(space: Workspace, threads: int) -> Encoder:
    import torch

    if space.torch_model is None:  # one model: torch's thread count is the process's, set before each slot
        space.torch_model = sentence_transformer(space.model_dir)
    return st_encoder(space.torch_model, lambda: torch.set_num_threads(threads))


def _session_options(threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return options


def load_onnx(space: Workspace, threads: int) -> Encoder:
    folder = export_folder(space, "onnx")
    model = sentence_transformer(
        folder, backend="onnx", provider="CPUExecutionProvider", session_options=_session_options(threads)
    )
    return st_encoder(model)


def onnx_int8_file(space: Workspace) -> str:
    """export_dynamic_quantized_onnx_model with this CPU's configuration; the file name it wrote."""
    folder = export_folder(space, "onnx")
    # Named here: its own name follows the weights' type, which differs by configuration (avx2's are u8).
    suffix = f"int8_{space.int8}"
    name = f"onnx/model_{suffix}.onnx"
    if not (folder / name).is_file():
        model = sentence_transformer(folder, backend="onnx")
        with quiet():
            module("sentence_transformers").export_dynamic_quantized_onnx_model(
                model, space.int8, str(folder), file_suffix=suffix
            )
    space.notes["onnx-int8"] = f"export_dynamic_quantized_onnx_model(config={space.int8!r})"
    return name


def load_onnx_int8(space: Workspace, threads: int) -> Encoder:
    name = onnx_int8_file(space)
    model = sentence_transformer(
        export_folder(space, "onnx"),
        backend="onnx",
        provider="CPUExecutionProvider",
        session_options=_session_options(threads),
        file_name=name,
    )
    return st_encoder(model)
