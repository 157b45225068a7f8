"""Stage 1, export: a Hugging Face folder becomes an fp32 ONNX graph with dynamic batch and sequence axes.

We call torch.onnx's TorchScript exporter directly rather than optimum's: it is one function, needs no
extra package, and its graphs are the ones ONNX Runtime's transformer optimizer knows how to fuse.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

from container.optimize.errors import UnsupportedModel
from container.optimize.source import SourceModel
from tasks.base import TaskSpec

OPSET = 17


def graph_inputs(source: SourceModel, forward_params: list[str]) -> list[str]:
    """The inputs the graph takes: token_type_ids only where forward() takes them and the model has more than
    one segment type. With one type (RoBERTa, CamemBERT) or none (DeBERTa-v3: type_vocab_size 0) every id is
    0, which is what the model uses when the input is left out; feeding it would only cost a copy."""
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in forward_params and source.config.get("type_vocab_size", 0) > 1:
        names.append("token_type_ids")
    return names


def load_torch_model(source: SourceModel, task: TaskSpec):  # type: ignore[no-untyped-def]
    """The PyTorch reference through transformers' Auto class for the task's head (a causal LM's own class
    when it is read as a yes/no scorer), in eval mode with eager attention: SDPA and flash kernels trace into
    graphs ORT cannot fuse (or cannot run), eager is plain ops. A model's own code (trust_remote_code) runs
    here, at build time only."""
    import transformers

    if source.sparse is not None:  # SPLADE's pooling or bge-m3's heads belong to the model's computation
        from container.optimize.sparse_graph import load

        return load(source)
    auto = getattr(transformers, "AutoModelForCausalLM" if source.scorer else task.head)
    # Mixture-of-experts layers (Mistral 4, OpenAI's privacy filter): transformers 5's default grouped_mm
    # sorts tokens by expert (histc, data-dependent splits) and traces into a graph fixed to the dummy's
    # routing; batched_mm gathers each token's experts' weights and multiplies, the same for every input.
    return auto.from_pretrained(
        str(source.path),
        attn_implementation="eager",
        experts_implementation="batched_mm",
        trust_remote_code=source.trust_remote_code,
    ).eval()


def graph_module(model, source: SourceModel, task: TaskSpec):  # type: ignore[no-untyped-def]
    """What is exported: an encoder behind EncoderGraph (its inputs by name, the task's output); a decoder
    behind DecoderGraph (masks and positions from the 2D mask, no cache, the gated delta rule without its
    loop); a causal LM read as a reranker as its yes/no scorer; a sparse model's graph (load_torch_model's)
    as it is. A decoder with a layer type DecoderGraph cannot export is refused."""
    from container.optimize import decoder

    if source.sparse is not None:
        return model

    if source.scorer or decoder.is_decoder(model):
        unhandled = decoder.unhandled_layer_types(model)
        if unhandled:
            raise UnsupportedModel(
                f"stage export: {source.model_type} has {', '.join(unhandled)} layers; hare exports decoders "
                "without a cache, with masks for full and sliding-window attention and the gated delta rule "
                "(Qwen3.5's linear attention) rewritten without its loop over the sequence. Another recurrent "
                "or linear layer (Mamba, lightning attention...) runs a loop that the TorchScript exporter fixes "
                "at the example's length, so the graph would answer wrongly for any other length. Use a family "
                "whose layers are attention or gated delta rule, e.g. Qwen3 or Qwen3.5"
            )
    if source.scorer:
        return decoder.YesNoScorer(model, *source.scorer, source.max_length)
    if decoder.is_decoder(model):
        if source.pad_id is None:
            raise UnsupportedModel(
                f"stage export: {source.model_type} is a decoder and {source.path} names no pad token (neither "
                "config.json's pad_token_id nor the tokenizer's pad_token); batches need one to pad with and, for "
                "classification heads, to find each row's last token as transformers does. Set pad_token in "
                "tokenizer_config.json and pad_token_id in config.json (decoders usually pad with their EOS)"
            )
        return decoder.DecoderGraph(model, task.output, source.max_length)
    return decoder.EncoderGraph(model, task.output)


def reference_row(model, source: SourceModel, task: TaskSpec, feeds: dict[str, Any]) -> Any:  # type: ignore[no-untyped-def]
    """The PyTorch model's output for one unpadded sequence, computed as transformers computes it."""
    if source.scorer:
        from container.optimize.decoder import yes_no_reference

        return yes_no_reference(model, feeds, *source.scorer)[0]
    if source.sparse is not None:  # load_torch_model's graph: its output is the task's
        return model(**feeds)[0]
    return getattr(model(**feeds), task.output)[0]


def export_onnx(source: SourceModel, task: TaskSpec, out: Path) -> list[str]:
    """Export `source` for `task` to `out`; returns the graph's input names."""
    import torch

    model = load_torch_model(source, task)
    inputs = graph_inputs(source, list(inspect.signature(model.forward).parameters))
    graph = graph_module(model, source, task)
    dummy = {name: torch.ones((2, 8), dtype=torch.long) for name in inputs}
    dynamic = {name: {0: "batch", 1: "sequence"} for name in [*inputs, task.output]}
    if source.sparse is not None and not source.sparse.heads:
        dynamic[task.output] = {0: "batch"}  # SPLADE's [batch, vocab]: pooled over the sequence in the graph
    with warnings.catch_warnings(), torch.no_grad():
        # Tracing warns about Python control flow on shapes that the dynamic axes make safe.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph,
            (),
            str(out),
            kwargs=dummy,
            input_names=inputs,
            output_names=[task.output],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    return inputs
