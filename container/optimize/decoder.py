"""Encoders as transformers 5 lets them be traced, and decoder families (Qwen2/3, Llama, Mistral, Gemma 1-3)
as graphs ONNX Runtime runs: no KV cache, the attention masks built inside the graph from the 2D padding mask,
and positions counted from that mask.

transformers builds a decoder's masks with `masking_utils.create_causal_mask`, whose vmap the TorchScript
exporter cannot trace ("unordered_map::at"). `DecoderGraph` hands the model finished 4D masks instead, which
transformers takes as they are. Positions are `cumsum(mask) - 1`, so a left-padded and a right-padded row
give their real tokens the same positions, hence the same states, as the row alone. Gated-delta-rule layers
(Qwen3.5's linear attention) take the 2D mask (they zero the padding's states, as transformers'
`create_recurrent_attention_mask` has them do) and run delta_rule.gated_delta_rule, which has no loop over the
sequence for the exporter to fix at the example's length. LFM2's short convolutions take the same 2D mask and
are one Conv1d. Other layers that carry a state along the sequence (Mamba, RWKV...) are found by
recurrent_layers and refused.

Imported by the optimizer only (it needs torch).
"""

from __future__ import annotations

import re
import sys
from typing import Any

import torch

from container.optimize import delta_rule


def is_decoder(model: Any) -> bool:
    """A model whose transformers module builds its masks with create_causal_mask. BERT-style encoders that
    can also be configured as decoders import it too (transformers 5) and say which they are with
    config.is_decoder; a decoder-only family's config has no is_decoder at all."""
    causal = hasattr(sys.modules[type(model).__module__], "create_causal_mask")
    return causal and getattr(model.config, "is_decoder", True) is not False


def attention_masks(attention_mask: torch.Tensor, config: Any) -> torch.Tensor | dict[str, torch.Tensor]:
    """The additive 4D masks [batch, 1, query, key] transformers would build: causal (or bidirectional where
    the config says so, EmbeddingGemma), each layer type's window, and the padding. Models that mix full and
    sliding-window layers (config.layer_types) take one mask per layer type, and their linear-attention
    layers the 2D padding mask. A multimodal config's text part says which (Qwen3.5's own checkpoints)."""
    config = config.get_text_config()
    n = attention_mask.shape[1]
    q = torch.arange(n, device=attention_mask.device)[:, None]
    k = torch.arange(n, device=attention_mask.device)[None, :]
    bidirectional = bool(getattr(config, "use_bidirectional_attention", False))
    full = torch.ones(n, n, dtype=torch.bool, device=attention_mask.device) if bidirectional else k <= q
    padding = attention_mask.bool()[:, None, None, :]
    window = getattr(config, "sliding_window", None)
    near = None
    if window:
        # transformers: kv > q - window (and causal); bidirectional Gemma3: |q - kv| < window.
        near = (q - k).abs() < window if bidirectional else (k > q - window) & (k <= q)

    def additive(keep: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros((), dtype=torch.float32)
        return torch.where(keep & padding, zero, torch.finfo(torch.float32).min)

    if getattr(config, "layer_types", None) is not None:
        masks = {"full_attention": additive(full)}
        if near is not None:
            masks["sliding_attention"] = additive(near)
        for kind in PADDING_MASKED_LAYER_TYPES:  # the layers transformers hands its 2D padding mask
            if kind in config.layer_types:
                masks[kind] = attention_mask.to(torch.float32)
        return masks
    # Mistral-style configs: one window for every layer when sliding_window is set.
    return additive(near if near is not None else full)


MASKED_LAYER_TYPES = ("full_attention", "sliding_attention")
# Layer types that take the 2D padding mask (transformers' create_recurrent_attention_mask): linear attention
# (exported where it is the gated delta rule) and LFM2's short convolutions, which zero the padding's states
# before their causal convolution, itself one Conv1d with no loop.
PADDING_MASKED_LAYER_TYPES = ("linear_attention", "conv")

# Layers that carry a state along the sequence, which transformers' PyTorch code computes with a Python loop
# over the tokens or chunks (or, for Mamba-2's chunked scan, chunks padded to a count worked out in Python):
# tracing fixes either at the example's length. Matched by class name, since transformers 5 calls most of
# them "linear_attention" in layer_types (and RWKV and xLSTM list no layer types); the state-space mixers
# also by their decay parameter A_log, so that a "Mixer" that is no state space is not caught.
RECURRENT_LAYERS = (
    (re.compile(r"Mamba|Mixer$"), "A_log", "Mamba (state-space)"),
    (re.compile(r"LightningAttention$"), None, "lightning attention (MiniMax's linear attention)"),
    (re.compile(r"DeltaAttention$"), None, "Kimi delta attention"),
    (re.compile(r"Rglru$"), None, "RG-LRU (Griffin's recurrence)"),
    (re.compile(r"^Rwkv\w*SelfAttention$"), None, "RWKV time mixing"),
    (re.compile(r"^xLSTMLayer$"), None, "mLSTM (xLSTM)"),
)


def recurrent_layers(model: Any) -> dict[str, list[str]]:
    """Each recurrent layer kind in `model` (a module skeleton is enough), with the classes that are it."""
    found: dict[str, set[str]] = {}
    for module in model.modules():
        name = type(module).__name__
        for pattern, parameter, kind in RECURRENT_LAYERS:
            if pattern.search(name) and (parameter is None or hasattr(module, parameter)):
                found.setdefault(kind, set()).add(name)
    return {kind: sorted(names) for kind, names in found.items()}


def unhandled_layer_types(model: Any) -> list[str]:
    """The layer types of `model` (a multimodal config's text part) that DecoderGraph cannot export: any but
    attention with a mask from attention_masks, short convolutions, and linear attention where it is the
    gated delta rule."""
    types = getattr(model.config.get_text_config(), "layer_types", None) or []
    handled = {*MASKED_LAYER_TYPES, "conv", *(["linear_attention"] if delta_rule.reference_modules(model) else [])}
    return sorted(set(types) - handled)


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class EncoderGraph(torch.nn.Module):  # type: ignore[misc]
    """An encoder fed by name. transformers 5 wraps forward() in decorators that take every argument as a
    keyword; the TorchScript tracer passes a traced module's inputs positionally, which collides with the
    defaults the decorators fill in ("got multiple values for argument 'use_cache'")."""

    def __init__(self, model: Any, output: str) -> None:
        super().__init__()
        self.model = model
        self.output = output

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            feeds["token_type_ids"] = token_type_ids
        return self.model(**feeds)[self.output]


class ShiftedDecoderHead(torch.nn.Module):  # type: ignore[misc]
    """An encoder-decoder's classification head (T5Gemma 2's) as transformers computes it for one unpadded text:
    the decoder fed the input shifted right (attending to the encoder's states), the head on its states, at its
    last position (`pooled`: sequence classification) or at each (token classification).

    The decoder gets the attention mask as its own: the shifted input has as many real positions as the input,
    and left out, transformers looks for packed sequences with an operator the exporter lacks (aten::diff).
    transformers pools at the last non-pad id of the shifted input, which in a right-padded batch is one
    position later than for the text alone (the shift keeps the last real token); pooled at each row's own
    length, every row answers as alone."""

    def __init__(self, model: Any, pooled: bool) -> None:
        super().__init__()
        self.model = model
        self.pooled = pooled

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=self.model.prepare_decoder_input_ids_from_labels(input_ids),
            decoder_attention_mask=attention_mask,
            use_cache=False,
        ).last_hidden_state
        logits = self.model.score(hidden)
        if not self.pooled:
            return logits
        last = attention_mask.long().sum(-1) - 1
        return logits[torch.arange(logits.shape[0], device=logits.device), last]


class DecoderGraph(torch.nn.Module):  # type: ignore[misc]
    """`model` (a base decoder or one with a sequence-classification head) fed as the exported graph runs
    it: input_ids and attention_mask in, the task's output out, for sequences of up to `max_length` tokens
    (what the gated delta rule's scan is sized for)."""

    def __init__(self, model: Any, output: str, max_length: int) -> None:
        super().__init__()
        self.model = model
        self.output = output
        self.max_length = max_length

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        with delta_rule.loop_free(self.model, self.max_length):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_masks(attention_mask, self.model.config),
                position_ids=positions(attention_mask),
                use_cache=False,
            )
        return out[self.output]


def last_token(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Each row's state at its last real token, under left or right padding."""
    index = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last = (index[None, :] * attention_mask.long()).argmax(-1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


class LastTokenClassifier(torch.nn.Module):  # type: ignore[misc]
    """A decoder's sequence-classification head (`score`, linear) read at each row's last real token, found by
    the attention mask: transformers' head on one text whose config names no pad id."""

    def __init__(self, model: Any, max_length: int) -> None:
        super().__init__()
        self.body = DecoderGraph(model.base_model, "last_hidden_state", max_length)
        self.score = model.score

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.score(last_token(self.body(input_ids, attention_mask), attention_mask))


class YesNoScorer(torch.nn.Module):  # type: ignore[misc]
    """A causal LM read as a reranker (Qwen3-Reranker): the relevance logit is logit("yes") - logit("no") at
    the last token, so its sigmoid is the model card's softmax probability of "yes". Only the two rows of the
    LM head are kept: nothing vocabulary-sized is computed at serve time."""

    def __init__(self, lm: Any, no_id: int, yes_id: int, max_length: int) -> None:
        super().__init__()
        self.body = DecoderGraph(lm.base_model, "last_hidden_state", max_length)
        head = lm.get_output_embeddings()
        self.rows = torch.nn.Parameter(head.weight[[no_id, yes_id]].detach().clone(), requires_grad=False)
        bias = getattr(head, "bias", None)
        self.bias = None if bias is None else torch.nn.Parameter(bias[[no_id, yes_id]].detach().clone())
        self.softcap = getattr(lm.config, "final_logit_softcapping", None)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = last_token(self.body(input_ids, attention_mask), attention_mask)
        logits = hidden @ self.rows.T
        if self.bias is not None:
            logits = logits + self.bias
        if self.softcap:  # Gemma 2: the LM's logits pass through tanh(x / cap) * cap
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return (logits[:, 1] - logits[:, 0])[:, None]


def yes_no_reference(lm: Any, feeds: dict[str, torch.Tensor], no_id: int, yes_id: int) -> torch.Tensor:
    """The model card's computation on one unpadded sequence: the full LM's logits at the last position."""
    logits = lm(**feeds).logits[:, -1]
    return (logits[:, yes_id] - logits[:, no_id])[:, None]
