"""Massive activations, injected into a saved random decoder the way trained LLMs carry them.

Trained decoders (Llama, Qwen, Mistral...) carry a few fixed residual-stream channels with huge values (Sun et
al. 2024, "Massive activations in large language models"): an early layer's MLP writes them, on a few tokens
(the first one, delimiters such as "." and ",") thousands of times the other channels, and on every token
tens of times; the later layers leave them alone, and the RMSNorm weights of those channels carry large
gains (Dettmers et al. 2022, LLM.int8's outlier features). Random weights have none, so int8 looks safer on
the test models than on the real ones. `inject_massive_activations` builds the same mechanism into a
Llama-style decoder's weights (nothing at run time):

- two marker channels in the embeddings: one on every token, one on the delimiter tokens only, which layer
  0's attention does not write to (their rows of its o_proj are zero);
- two units of layer 0's MLP that read one marker each (their gate/up rows are zero elsewhere) and whose
  down_proj columns write into the outlier channels: `typical` times the residual's median |value| on every
  token, `massive` times on the delimiters (so layer 0's down_proj input carries a massive unit too);
- the outlier channels' RMSNorm weights multiplied by `gain` in every layer, and divided by `typical` in the
  final norm, so the pooled embedding is not ruled by them (it stays a function of the text).

`activation_ratios` measures what a quantizer then meets at each projection's input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from container.optimize.textset import SENTENCES
from tests.tiny_models import make_model

# Texts for the measurements: every sentence, and a few of them run together (longer inputs, more delimiters).
TEXTS = [*SENTENCES, " ".join(SENTENCES[:8]), " ".join(SENTENCES[8:20])]
# The projections a quantizer meets, by the input they read (q/k/v read one, gate/up another).
PROJECTIONS = {"q_proj": "q/k/v", "gate_proj": "gate/up", "o_proj": "o", "down_proj": "down"}
# Qwen3-Embedding-0.6B's layer (hidden 1024, 16 query and 8 key/value heads of 128, MLP 3072), 4 layers of its
# 28, 512 positions: the mid-size geometry of docs/optimizer.md's outlier measurements.
MID = dict(
    hidden_size=1024,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    max_position_embeddings=512,
)


@dataclass(frozen=True)
class Injected:
    """What was injected: the outlier channels, the marker channels and layer 0's units, the delimiter token
    ids, and the residual's median |value| the sizes were set against."""

    channels: list[int]
    markers: list[int]
    units: list[int]
    delimiters: list[int]
    median: float


def make_outlier_decoder(
    folder: Path, seed: int = 0, injection: Mapping[str, Any] | None = None, **config: Any
) -> Injected:
    """A Qwen3 embedder (make_model's sentence-transformers folder, `config` over the tiny geometry) with
    massive activations injected by inject_massive_activations (`injection` over its defaults); its maximum
    length is its positions."""
    make_model(folder, "feature-extraction", "qwen3", seed, **config)
    if "max_position_embeddings" in config:
        for name, key in (
            ("sentence_bert_config.json", "max_seq_length"),
            ("tokenizer_config.json", "model_max_length"),
        ):
            declared = json.loads((folder / name).read_text())
            (folder / name).write_text(json.dumps(declared | {key: config["max_position_embeddings"]}))
    return inject_massive_activations(folder, **(injection or {}))


def inject_massive_activations(
    folder: Path,
    channels: int = 4,
    typical: float = 20.0,
    massive: float = 5e3,
    gain: float = 4.0,
    reads: float = 4.0,
    delimiters: Sequence[str] = (".", ","),
) -> Injected:
    """Rewrite the decoder saved in `folder` (Llama-style: Qwen2/3, Llama, Mistral) so that `channels` fixed
    residual channels carry `typical` x the residual's median |value| on every token and `massive` x on the
    `delimiters` tokens, with RMSNorm gains of `gain` on them (module docstring). The projections' inputs
    then show about typical x gain and massive x gain against their median channel (activation_ratios). The
    weights that read those channels are scaled so that, on a typical token, each weighs `reads` times an
    ordinary channel (a trained model reads them with small weights, or they would rule every output)."""
    import torch
    from tokenizers import Tokenizer

    model = _load(folder)
    base = model.base_model
    layer0, mlp = base.layers[0], base.layers[0].mlp
    hidden, inner = base.config.hidden_size, base.config.intermediate_size
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [i for t in delimiters if (i := tok.token_to_id(t)) is not None]
    if not ids:
        raise ValueError(f"none of {list(delimiters)} is a token of {folder}'s tokenizer")
    spread = np.linspace(0, hidden, channels + 3, endpoint=False).astype(int)[1:]
    outliers, markers = [int(c) for c in spread[:channels]], [int(c) for c in spread[channels:]]
    units = [inner // 3, 2 * inner // 3]
    median = float(np.median(np.abs(_residual(model, tok, len(base.layers) - 1))))
    signs = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(channels)])
    with torch.no_grad():
        embed = base.embed_tokens.weight
        scale = float(embed.abs().median())
        # A random model's padding row (Qwen's EOS, the pooled token) is zero: left so, without markers, as a
        # marker alone would make its layer-0 input one spike (a trained model's EOS row is no such thing).
        live = embed.abs().sum(dim=1) > 0
        # every token, by a factor of its own: the outlier channels carry the text, not a constant
        factor = 0.5 + torch.rand(embed.shape[0], generator=torch.Generator().manual_seed(0))
        embed[:, markers[0]] = 4 * scale * factor * live
        embed[:, markers[1]] = 0.0
        embed[ids, markers[1]] = 4 * scale  # the delimiters
        layer0.self_attn.o_proj.weight[markers] = 0.0
        for layer in base.layers:  # the markers are read by their units only
            for proj in _inputs(layer):
                proj.weight[:, markers] = 0.0
        for unit, marker in zip(units, markers, strict=True):
            for proj in (mlp.gate_proj, mlp.up_proj):
                proj.weight[unit] = 0.0
                proj.weight[unit, marker] = 1.0
            mlp.down_proj.weight[:, unit] = 0.0
        # Each unit's size at the down_proj input: 3x the median unit on every token, typical / massive more
        # on the delimiters; then its down_proj column writes the sizes asked for into the residual.
        marked, every, _ = _layer0(model, tok, markers, units, ids)
        for unit, marker, x, want in zip(units, markers, (every, marked), (3.0, 3.0 * massive / typical), strict=True):
            k = _gain_for(want * _layer0(model, tok, markers, units, ids)[2], x)
            mlp.gate_proj.weight[unit, marker] = k
            mlp.up_proj.weight[unit, marker] = k
        out_every, out_marked = _layer0(model, tok, markers, units, ids, outputs=True)[:2]
        for unit, size, out in zip(units, (typical, massive), (out_every, out_marked), strict=True):
            mlp.down_proj.weight[outliers, unit] = signs * size * median / out
        for i, layer in enumerate(base.layers):
            layer.input_layernorm.weight[outliers] *= gain
            layer.post_attention_layernorm.weight[outliers] *= gain
            for proj in _inputs(layer) if i > 0 else ():
                proj.weight[:, outliers] *= reads / (typical * gain)
        base.norm.weight[outliers + markers] = 0.0  # constants on every token: no part of the embedding
    model.save_pretrained(str(folder), safe_serialization=True)
    return Injected(outliers, markers, units, ids, median)


def _inputs(layer: Any) -> list[Any]:
    """The projections that read a layer's normalized residual: q, k, v, gate and up."""
    attention, mlp = layer.self_attn, layer.mlp
    return [attention.q_proj, attention.k_proj, attention.v_proj, mlp.gate_proj, mlp.up_proj]


def _gain_for(target: float, x: float) -> float:
    """k such that silu(k x) * k x (a unit whose gate and up weights are k on an input x) equals `target`."""
    low, high = 0.0, 1.0
    while high * high * x * x / 2 < target or _swiglu(high * x) < target:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _swiglu(mid * x) < target else (low, mid)
    return (low + high) / 2


def _swiglu(y: float) -> float:
    return y * y / (1 + float(np.exp(-y)))


def _layer0(
    model: Any, tok: Any, markers: Sequence[int], units: Sequence[int], delimiters: Sequence[int], outputs: bool = False
) -> tuple[float, float, float]:
    """In layer 0's MLP over TEXTS: the mean input of markers[1] on the delimiters and of markers[0] on every
    token (with `outputs`: the mean output of units[0] on every token and of units[1] on the delimiters), and
    the median |output| of its other units."""
    mlp = model.base_model.layers[0].mlp
    inputs: list[NDArray[np.float32]] = []
    acts: list[NDArray[np.float32]] = []
    hooks = [
        mlp.gate_proj.register_forward_pre_hook(lambda _m, args: inputs.append(_first(args, {}, ""))),
        mlp.down_proj.register_forward_pre_hook(lambda _m, args: acts.append(_first(args, {}, ""))),
    ]
    try:
        _run(model, tok, None)
    finally:
        for hook in hooks:
            hook.remove()
    marked = np.isin(np.concatenate([tok.encode(t).ids for t in TEXTS]), delimiters)
    x, a = np.concatenate(inputs), np.concatenate(acts)
    others = np.delete(np.abs(a), list(units), axis=1)
    if outputs:
        return float(a[:, units[0]].mean()), float(a[marked, units[1]].mean()), float(np.median(others))
    return float(x[marked, markers[1]].mean()), float(x[:, markers[0]].mean()), float(np.median(others))


def _load(folder: Path) -> Any:
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(folder))
    cls = getattr(transformers, (config.architectures or ["AutoModel"])[0])
    return cls.from_pretrained(str(folder)).eval()


def _encode(tok: Any, text: str) -> Any:
    import torch

    return torch.tensor([tok.encode(text).ids])


def _residual(model: Any, tok: Any, layer: int) -> NDArray[np.float32]:
    """The residual stream entering `layer`, every token of TEXTS, as rows."""
    rows: list[NDArray[np.float32]] = []
    hook = model.base_model.layers[layer].register_forward_pre_hook(
        lambda _m, args, kwargs: rows.append(_first(args, kwargs, "hidden_states")), with_kwargs=True
    )
    _run(model, tok, hook)
    return np.concatenate(rows)


def _first(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> NDArray[np.float32]:
    value = args[0] if args else kwargs[name]
    return value.detach().reshape(-1, value.shape[-1]).numpy().copy()


def _run(model: Any, tok: Any, hook: Any) -> list[NDArray[np.float32]]:
    """The pooled (last-token, normalized) embedding of each of TEXTS, with `hook` removed afterwards."""
    import torch

    out = []
    try:
        with torch.no_grad():
            for text in TEXTS:
                hidden = model.base_model(input_ids=_encode(tok, text)).last_hidden_state[0, -1].numpy()
                out.append(hidden / np.linalg.norm(hidden))
    finally:
        if hook is not None:
            hook.remove()
    return out


@dataclass(frozen=True)
class Ratios:
    """At one kind of projection input, over the layers and TEXTS' tokens: the largest channel against the
    token's median channel, on the median token and on the largest; the same for the delimiter tokens alone,
    and for the other tokens alone (their largest)."""

    typical: float
    largest: float
    others_largest: float


def activation_ratios(folder: Path, delimiters: Sequence[int] = ()) -> dict[str, list[Ratios]]:
    """Per projection kind (PROJECTIONS), per layer: max |x_j| / median |x_j| of its input, token by token
    (Ratios), measured with forward hooks on the PyTorch model in `folder`."""
    from tokenizers import Tokenizer

    model = _load(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokens = np.concatenate([tok.encode(t).ids for t in TEXTS])
    seen: dict[tuple[str, int], list[NDArray[np.float32]]] = {}
    hooks = []
    for i, layer in enumerate(model.base_model.layers):
        for name in PROJECTIONS:
            module = getattr(layer.self_attn, name, None) or getattr(layer.mlp, name)
            rows = seen.setdefault((name, i), [])
            hooks.append(
                module.register_forward_pre_hook(lambda _m, args, rows=rows: rows.append(_first(args, {}, "")))
            )
    try:
        _run(model, tok, None)
    finally:
        for hook in hooks:
            hook.remove()
    found: dict[str, list[Ratios]] = {}
    marked = np.isin(tokens, list(delimiters))
    for (name, _layer), rows in seen.items():
        x = np.abs(np.concatenate(rows))
        live = np.median(x, axis=1) > 0  # the padding row's embedding is zero but for the marker
        ratio = x.max(axis=1)[live] / np.median(x, axis=1)[live]
        others = ratio[~marked[live]] if marked[live].any() else ratio
        found.setdefault(PROJECTIONS[name], []).append(
            Ratios(float(np.median(ratio)), float(ratio.max()), float(others.max()))
        )
    return found


def embeddings(folder: Path) -> NDArray[np.float32]:
    """The pooled, normalized embeddings of TEXTS from the PyTorch model in `folder` (last token, as
    Qwen3-Embedding pools)."""
    from tokenizers import Tokenizer

    model = _load(folder)
    return np.stack(_run(model, Tokenizer.from_file(str(folder / "tokenizer.json")), None))
