"""Stage 1, export: a Hugging Face folder becomes an fp32 ONNX graph with dynamic batch and sequence axes.

We call torch.onnx's TorchScript exporter directly rather than optimum's: it is one function, needs no
extra package, and its graphs are the ones ONNX Runtime's transformer optimizer knows how to fuse.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
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
    if is_encoder_decoder(source) and task.name == "feature-extraction":
        return encoder_of(source)
    from container.optimize import experts

    auto = getattr(transformers, "AutoModelForCausalLM" if source.scorer else task.head)
    # Mixture-of-experts layers (Mistral 4, OpenAI's privacy filter): transformers 5's default grouped_mm
    # sorts tokens by expert (histc, data-dependent splits) and traces into a graph fixed to the dummy's
    # routing, and its batched_mm gathers each token's experts' weights (memory per token, fp32 experts in
    # every int8 variant); hare's own routes each expert's tokens to a MatMul on its constant weights, the
    # same graph for every input (container/optimize/experts.py).
    model = with_missing(
        auto.from_pretrained(
            str(source.path),
            attn_implementation="eager",
            experts_implementation=experts.register(),
            trust_remote_code=source.trust_remote_code,
            output_loading_info=True,
        )
    )
    return experts.split_weights(model.eval())


def with_missing(loaded: tuple[Any, dict[str, Any]]) -> Any:
    """from_pretrained's model, with the weights its checkpoint lacked (`hare_missing`, which transformers
    filled in) for refuse_missing_weights."""
    model, info = loaded
    model.hare_missing = frozenset(info.get("missing_keys", ()))
    return model


def refuse_missing_weights(model, graph, dummy: dict[str, Any], source: SourceModel) -> None:  # type: ignore[no-untyped-def]
    """Refuse a checkpoint that lacks weights the output reads: transformers makes them up (random values, or
    a default such as a LayerNorm's zero bias) for the export and the reference alike, so every gate passed on
    a model that is not the one saved, or the fp32 gate failed on two draws of the random ones, blaming the
    export. A missing weight the output does not read (a pooler under token embeddings) is let go. Which it
    reads: those a backward pass from `graph`'s outputs reaches, run only when some are missing."""
    import torch

    missing: frozenset[str] = getattr(model, "hare_missing", frozenset())
    if not missing:
        return
    with torch.enable_grad():
        out = graph(**dummy)
        outputs = out.values() if isinstance(out, dict) else out if isinstance(out, tuple | list) else [out]
        sums = [t.float().sum() for t in outputs if torch.is_tensor(t) and t.requires_grad]
        if sums:  # none: the graph computes without gradients, and nothing can be told
            torch.stack(sums).sum().backward()
    read = sorted(name for name, p in model.named_parameters() if name in missing and p.grad is not None)
    model.zero_grad(set_to_none=True)
    if read:
        shown = ", ".join(read[:5]) + (f" and {len(read) - 5} more" if len(read) > 5 else "")
        raise UnsupportedModel(
            f"{source.path}'s weights lack {len(read)} that its output reads ({shown}): transformers would fill "
            "them with made-up values, and the bundle would serve those; save the whole model into the folder "
            "(a classifier with its trained head)"
        )


# Encoder-only classes, where transformers has one: they read the encoder-only checkpoints sentence-transformers
# saves (sentence-t5, GTR) without reporting a decoder missing, and a full checkpoint without loading its decoder.
ENCODER_CLASSES = {"t5": "T5EncoderModel", "mt5": "MT5EncoderModel", "umt5": "UMT5EncoderModel"}


def is_encoder_decoder(source: SourceModel) -> bool:
    """config.json says so, or the family is one: sentence-transformers saves T5's encoder alone with
    is_encoder_decoder false, and transformers' Auto class would still build the whole T5 from it."""
    return bool(source.config.get("is_encoder_decoder")) or source.model_type in ENCODER_CLASSES


def encoder_of(source: SourceModel):  # type: ignore[no-untyped-def]
    """An encoder-decoder's encoder alone, which is what sentence-transformers embeds with: the family's
    encoder-only class (ENCODER_CLASSES), or else the base model loaded whole and its get_encoder()
    (T5Gemma 2, whose checkpoints hold the encoder under the LM's prefix; its decoder is read and freed)."""
    import transformers

    # Any: transformers 5.25 types from_pretrained's keywords, which a dict of mixed values cannot name one by one.
    kwargs: dict[str, Any] = dict(
        attn_implementation="eager", trust_remote_code=source.trust_remote_code, output_loading_info=True
    )
    if name := ENCODER_CLASSES.get(source.model_type):
        return with_missing(getattr(transformers, name).from_pretrained(str(source.path), **kwargs)).eval()
    return transformers.AutoModel.from_pretrained(str(source.path), **kwargs)[0].get_encoder().eval()


def graph_module(model, source: SourceModel, task: TaskSpec):  # type: ignore[no-untyped-def]
    """What is exported: an encoder behind EncoderGraph (its inputs by name, the task's output); a decoder
    behind DecoderGraph (masks and positions from the 2D mask, no cache, the gated delta rule without its
    loop); an encoder-decoder's encoder (embeddings) or its head over the decoder fed the input shifted right
    (ShiftedDecoderHead); a causal LM read as a reranker as its yes/no scorer; a sparse model's graph
    (load_torch_model's) as it is. A model with layers no graph here exports is refused
    (refuse_unexportable_layers)."""
    from container.optimize import decoder

    if source.sparse is not None:
        return model

    refuse_unexportable_layers(model, source)
    if is_encoder_decoder(source):  # its encoder (encoder_of), or a head over its decoder's states
        if task.name == "feature-extraction":
            return decoder.EncoderGraph(model, task.output)
        return decoder.ShiftedDecoderHead(model, pooled=task.head == "AutoModelForSequenceClassification")
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
        if task.head == "AutoModelForSequenceClassification" and model.config.get_text_config().pad_token_id is None:
            return _last_token_classifier(model, source)
        return decoder.DecoderGraph(model, task.output, source.max_length)
    return decoder.EncoderGraph(model, task.output)


def _last_token_classifier(model, source: SourceModel):  # type: ignore[no-untyped-def]
    """A decoder classifier whose config.json names no pad id (null; the tokenizer's pad_token pads the
    bundle's batches): transformers' head then refuses batches and reads a text alone at its last token, so
    the graph reads each row there by its mask (finding it by the pad id would skip a trailing EOS that is
    the pad token too)."""
    import torch

    from container.optimize import decoder

    if not isinstance(getattr(model, "score", None), torch.nn.Linear):
        raise UnsupportedModel(
            f"stage export: {source.model_type}'s classification head has no `score` layer hare reads, and "
            "config.json's pad_token_id is null, so transformers finds no row's last token in a batch; set "
            "pad_token_id in config.json to the tokenizer's pad token id"
        )
    return decoder.LastTokenClassifier(model, source.max_length)


def skeleton(source: SourceModel):  # type: ignore[no-untyped-def]
    """The base model's modules built from config.json on the meta device (no weights read, no memory), so
    its layers can be checked in a second before a checkpoint of many gigabytes is loaded; None where
    transformers cannot build one that way (the full load then says why, or the check runs on it)."""
    import torch
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(str(source.path), trust_remote_code=source.trust_remote_code)
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return transformers.AutoModel.from_config(config, trust_remote_code=source.trust_remote_code)
    except Exception:  # an early answer, not the only one: graph_module checks the loaded model too
        return None


def refuse_unexportable_layers(model, source: SourceModel) -> None:  # type: ignore[no-untyped-def]
    """Refuse, naming the stage, the layers and what to use, a model whose layers carry a state along the
    sequence (Mamba, lightning attention, RWKV...; decoder.recurrent_layers) or, in a decoder, a layer type
    DecoderGraph has no mask for: their graph would be fixed at the example's length and answer wrongly at
    any other."""
    from container.optimize import decoder

    recurrent = decoder.recurrent_layers(model)
    if recurrent:
        found = "; ".join(f"{kind} layers ({', '.join(names)})" for kind, names in recurrent.items())
        cause = (
            "transformers computes their state along the sequence with a loop over its tokens or chunks written "
            "in Python"
        )
    elif (source.scorer or decoder.is_decoder(model)) and (unhandled := decoder.unhandled_layer_types(model)):
        found = f"{', '.join(unhandled)} layers"
        cause = "hare builds no mask for them, and a recurrent or linear layer runs a loop over the sequence"
    else:
        return
    raise UnsupportedModel(
        f"stage export: {source.model_type} has {found}; {cause}, which the TorchScript exporter fixes at the "
        "example's length, so the graph would answer wrongly for any other length. hare exports attention "
        "(full and sliding-window), the gated delta rule (Qwen3.5's linear attention, rewritten without its "
        "loop) and short convolutions (LFM2). Use a family built of those, e.g. Qwen3, Qwen3.5 or LFM2"
    )


# Encoder-decoders whose heads hare exports: the decoder fed the input shifted right, the head on its states
# (decoder.ShiftedDecoderHead). Others (T5's heads read the states at its EOS tokens) are refused.
SHIFTED_HEADS = ("t5gemma2",)


def refuse_encoder_decoder(source: SourceModel, task: TaskSpec) -> None:
    """Refuse, from its config.json alone, an encoder-decoder's head that hare does not export (any but
    T5Gemma 2's): embeddings are its encoder's (encoder_of), as sentence-transformers computes them."""
    if is_encoder_decoder(source) and task.name != "feature-extraction" and source.model_type not in SHIFTED_HEADS:
        raise UnsupportedModel(
            f"stage export: {source.model_type} is an encoder-decoder; hare exports the {task.name} heads of "
            f"{', '.join(SHIFTED_HEADS)} only (the decoder fed the input shifted right), and this one reads its "
            "decoder's states its own way. hare serves its encoder for embeddings (--task feature-extraction, as "
            "sentence-transformers does); for this task use an encoder or a decoder-only family"
        )


def reference_row(model, source: SourceModel, task: TaskSpec, feeds: dict[str, Any]) -> Any:  # type: ignore[no-untyped-def]
    """The PyTorch model's output for one unpadded sequence, computed as transformers computes it."""
    if source.scorer:
        from container.optimize.decoder import yes_no_reference

        return yes_no_reference(model, feeds, *source.scorer)[0]
    if source.sparse is not None:  # load_torch_model's graph: its output is the task's
        return model(**feeds)[0]
    return getattr(model(**feeds), task.output)[0]


@contextlib.contextmanager
def index_based_masks() -> Iterator[None]:
    """While exporting: transformers builds an eager mask with a custom window (T5Gemma 2's encoder: its own
    bidirectional sliding window) through torch.vmap, which the TorchScript tracer cannot follow
    ("unordered_map::at"). Its mask functions are index arithmetic, so broadcasting them over the query and
    key positions builds the same mask, with the sequence length left dynamic; this is transformers' own
    non-vmap path, forced (as optimum-onnx's exporter does)."""
    from transformers import masking_utils

    masks = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS
    eager = masks["eager"]

    def index_based(*args: Any, **kwargs: Any) -> Any:
        return eager(*args, **{**kwargs, "use_vmap": False})  # the caller's use_vmap=True overridden

    masks.register("eager", index_based)
    try:
        yield
    finally:
        masks.register("eager", eager)


def export_onnx(source: SourceModel, task: TaskSpec, out: Path) -> list[str]:
    """Export `source` for `task` to `out`; returns the graph's input names."""
    import torch

    refuse_encoder_decoder(source, task)
    if source.sparse is None and (layers := skeleton(source)) is not None:
        refuse_unexportable_layers(layers, source)  # before the weights load: a refusal in seconds
    model = load_torch_model(source, task)
    inputs = graph_inputs(source, list(inspect.signature(model.forward).parameters))
    graph = graph_module(model, source, task)
    dummy = {name: torch.ones((2, 8), dtype=torch.long) for name in inputs}
    refuse_missing_weights(model, graph, dummy, source)
    dynamic = {name: {0: "batch", 1: "sequence"} for name in [*inputs, task.output]}
    if source.sparse is not None and not source.sparse.heads:
        dynamic[task.output] = {0: "batch"}  # SPLADE's [batch, vocab]: pooled over the sequence in the graph
    with warnings.catch_warnings(), torch.no_grad(), index_based_masks():
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
