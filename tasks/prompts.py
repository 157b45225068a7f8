"""sentence-transformers' prompts: a text prepended to every input before tokenizing. Embedding and sparse
embedding models declare them by name in config_sentence_transformers.json (ModelInfo.prompts), with the
default one their encode uses when the caller names none."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tasks import params
from tasks.base import Inputs, ModelInfo
from tasks.errors import InvalidRequest

PARAMETERS: dict[str, params.Spec] = {
    "prompt_name": params.ModelChoice(
        "a prompt the model declares (config_sentence_transformers.json), prepended to every text "
        "(default: the model's default_prompt_name, if any)",
        among="prompts",
    ),
    "prompt": params.Text("a literal text prepended to every text; wins over prompt_name, as in sentence-transformers"),
}


def read(raw: Mapping[str, object], model: ModelInfo) -> str:
    """The prompt as sentence-transformers picks it: a literal prompt (which makes it ignore prompt_name), else
    the named one, else the default."""
    if "prompt" in raw:
        literal: str = PARAMETERS["prompt"].read(raw, "prompt", "")
        return literal
    name = raw.get("prompt_name", model.default_prompt_name)
    if name is None:
        return ""
    if not isinstance(name, str) or name not in model.prompts:
        known = ", ".join(model.prompts) or "none (this model declares no prompts)"
        shown = repr(name) if isinstance(name, str) and len(name) <= 40 else params.kind(name)
        raise InvalidRequest(
            f"{params.named(raw, 'prompt_name')} must be one of the model's prompts: {known}; got {shown}"
        )
    return model.prompts[name]


def prepend(inputs: Inputs, prompt: str) -> Inputs:
    """`prompt` before every text, as sentence-transformers writes it before tokenizing."""
    if not prompt:
        return inputs
    return replace(inputs, texts=[prompt + t for t in inputs.texts], sent=inputs.sent or inputs.texts)
