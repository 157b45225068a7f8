"""Mixture-of-experts layers as hare exports them: each expert multiplies the tokens routed to it.

transformers 5 runs a model's experts through an interface (`ExpertsInterface`, picked by
`experts_implementation`). None of its implementations suits a traced ONNX graph:

- `grouped_mm` (the default) sorts the tokens by expert and splits them by counts (histc), which the
  TorchScript exporter fixes at the dummy's routing: the graph answers wrongly for any other input;
- `batched_mm` gathers each token's top-k experts' *weights* (`gate_up_proj[expert_ids]`) and multiplies: the
  same graph for any routing, but a call's memory grows with tokens x top-k x an expert's weights (400 MB per
  token per layer at Mistral Small 4's width), and the routed experts' weights reach the graph through a
  Gather, not a MatMul, so ONNX Runtime's int8 quantizer leaves them fp32.

`routed_experts_forward` (registered as `hare_routed`) routes the *tokens*: a Python loop over the
`num_experts` experts (a static count: the trace unrolls it) selects the (token, slot) pairs routed to expert
e (NonZero on `top_k_index == e`), gathers those tokens' hidden rows only, and multiplies them by expert e's
own weight slice, a constant that the exporter's constant folding turns into an initializer read by a MatMul
(which every int8 variant quantizes). Gating, activation, biases and the post-expert norm are applied as
`batched_mm_experts_forward` applies them, then the routing weight. The experts' outputs, concatenated in
expert order, are put back in (token, slot) order by one Gather through the inverse of that order, and summed
over the slots as batched_mm sums them. Memory: the call's rows once more (tokens x top-k x hidden), not the
weights per token.

An expert that no token picked runs on zero rows. ONNX Runtime 1.32 computes every operator of the graph on
an empty tensor, DynamicQuantizeLinear and MatMulInteger included, in fp32 and in every int8 variant
(tests/test_experts.py runs each variant at a routing that leaves experts empty), so nothing is padded.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "hare_routed"
# split_weights' per-expert parameters: f"{PREFIX}{projection}_{expert}", f"{PREFIX}{projection}_bias_{expert}".
PREFIX = "hare_"
PROJECTIONS = ("gate_up_proj", "up_proj", "down_proj")


def _linear(experts: Any, x: torch.Tensor, name: str, expert: int) -> torch.Tensor:
    """`x` through expert `expert`'s slice of the projection `name` (and its bias), as transformers'
    `_batched_linear` computes it. A plain MatMul on a constant 2-D weight (not F.linear, which a 2-D input
    would export as Gemm, a node the dynamic quantizer is not asked to quantize): the slice split_weights
    registered ([in, out]), else one taken here."""
    weight = getattr(experts, f"{PREFIX}{name}_{expert}", None)
    if weight is None:
        stacked = getattr(experts, name)[expert]
        weight = stacked if experts.is_transposed else stacked.transpose(0, 1)
    out = torch.matmul(x, weight)
    if experts.has_bias:
        bias = getattr(experts, f"{PREFIX}{name}_bias_{expert}", None)
        out = out + (getattr(experts, f"{name}_bias")[expert] if bias is None else bias)
    return out


def expert_forward(experts: Any, expert: int, rows: torch.Tensor) -> torch.Tensor:
    """One expert on the hidden rows routed to it: up (and gate), activation, down, post-expert norm. The
    whole gate_up projection goes to the module's own `_apply_gate`, as batched_mm hands it over, so the
    layout of its halves (`is_concatenated`, or GPT-OSS's interleaving) is the module's to read."""
    if experts.has_gate:
        out = experts._apply_gate(_linear(experts, rows, "gate_up_proj", expert))
    else:
        out = experts.act_fn(_linear(experts, rows, "up_proj", expert))
    out = _linear(experts, out, "down_proj", expert)
    if experts.has_post_expert_norm:
        out = experts.post_expert_norm(out)
    return out


def routed_experts_forward(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' experts forward (`hidden_states` [tokens, hidden], `top_k_index` and `top_k_weights`
    [tokens, top_k]) with each expert run on its own tokens only (module docstring)."""
    from transformers.integrations.moe import batched_mm_experts_forward

    if getattr(self, "_is_expert_parallel", False):  # sentinel ids past num_experts: never the case at export
        return batched_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    hidden_dim = hidden_states.shape[-1]
    top_k = top_k_index.shape[-1]
    slots = top_k_index.reshape(-1)  # (S,) = tokens x top_k, in token order
    tokens = torch.arange(hidden_states.shape[0], device=slots.device)
    slot_tokens = tokens.unsqueeze(-1).expand_as(top_k_index).reshape(-1)  # the token of each slot
    slot_weights = top_k_weights.reshape(-1, 1)
    order: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    for expert in range(self.num_experts):
        picked = torch.nonzero(slots == expert).reshape(-1)  # the slots routed to this expert, maybe none
        out = expert_forward(self, expert, hidden_states[slot_tokens[picked]])
        outputs.append(out * slot_weights[picked])
        order.append(picked)
    # Every slot went to exactly one expert: `order` is a permutation of the slots, and its inverse puts each
    # expert's output back at its slot.
    expert_order = torch.cat(order)
    inverse = torch.empty_like(expert_order).scatter_(
        0, expert_order, torch.arange(expert_order.shape[0], device=expert_order.device)
    )
    by_slot = torch.cat(outputs)[inverse]
    return by_slot.reshape(-1, top_k, hidden_dim).sum(dim=1).to(hidden_states.dtype)


def register() -> str:
    """Make `hare_routed` an experts implementation transformers accepts (`from_pretrained(...,
    experts_implementation=NAME)`); returns the name."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(NAME, routed_experts_forward)
    return NAME


def split_weights(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each experts module's stacked weights also registered one expert at a time, as views
    ([in, out], no copy): the traced graph then reads expert e's weights as an initializer of its own.
    Taken from the stack inside the graph instead (a Gather of the [experts, ...] parameter at e, folded at
    export), the exporter's shape inference, which reads a node's constant inputs whole, went quadratic in
    the experts: 8 s for a layer of 32 experts at hidden 4096, 55 s for 64, minutes for Mistral 4's 128."""
    for module in model.modules():
        if not (hasattr(module, "has_gate") and hasattr(module, "is_transposed") and hasattr(module, "num_experts")):
            continue
        for name in PROJECTIONS:
            stacked = getattr(module, name, None)
            if not isinstance(stacked, torch.Tensor) or stacked.dim() != 3:
                continue
            bias = getattr(module, f"{name}_bias", None) if module.has_bias else None
            for expert in range(stacked.shape[0]):  # the module's num_experts
                weight = stacked.data[expert] if module.is_transposed else stacked.data[expert].transpose(0, 1)
                module.register_parameter(f"{PREFIX}{name}_{expert}", torch.nn.Parameter(weight, requires_grad=False))
                if isinstance(bias, torch.Tensor):
                    module.register_parameter(
                        f"{PREFIX}{name}_bias_{expert}", torch.nn.Parameter(bias.data[expert], requires_grad=False)
                    )
    return model
