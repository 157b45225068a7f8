"""What every task declares: how the optimizer exports and checks it, and how the server answers it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from tasks.errors import InvalidRequest
from tasks.ops import Dense

if TYPE_CHECKING:  # annotations only: the console reads the task specs without tokenizers
    from tokenizers import Encoding

    from tasks.params import Spec

Array = NDArray[np.float32]


# The values a gate's metric takes (Gate.bounds), besides a share's 0 to 1: a correlation's or a cosine's, and a
# difference's.
CORRELATION = (-1.0, 1.0)
DIFFERENCE = (0.0, math.inf)


@dataclass(frozen=True)
class Gate:
    """A parity threshold a candidate variant must meet before it may ship. `bounds`: the values the metric
    takes (a share's 0 to 1 by default; a correlation's or a cosine's -1 to 1; a difference's 0 up), so that a
    threshold outside them, which no variant can meet or every one meets, is refused before the build."""

    metric: str
    threshold: float
    higher_is_better: bool
    help: str
    bounds: tuple[float, float] = (0.0, 1.0)

    def passes(self, value: float) -> bool:
        return value >= self.threshold if self.higher_is_better else value <= self.threshold


@dataclass(frozen=True)
class ParityInput:
    """Reference (PyTorch) and candidate (ONNX) outputs for the validation set, one array per example.

    Token-level outputs are trimmed to the example's real tokens, so padding never counts.
    `groups` gives each example's query for ranking (all zeros otherwise). `multi_label`: the checkpoint's
    problem_type is multi-label classification, so its labels are scored by sigmoid, not softmax;
    `regression`: it is regression, so its logits are its scores.
    """

    reference: Sequence[Array]
    candidate: Sequence[Array]
    groups: Sequence[int]
    pooling: str
    multi_label: bool = False
    regression: bool = False


@dataclass(frozen=True)
class Vocab:
    """What entity aggregation needs from the tokenizer, without the tokenizer.

    unk_id: the unknown token's id (None if the vocabulary has none).
    word_aware: the model marks word continuations (WordPiece's "##"), so subwords are exact;
      otherwise a whitespace heuristic decides, as transformers does.
    decode: token strings -> text (the tokenizer's decoder; transformers' convert_tokens_to_string).
    special_ids: the ids that carry no word: those the tokenizer puts around every text (CLS, SEP or EOS),
      padding's and the unknown token's, whether the template added them or the text typed them ("</s>").
    """

    unk_id: int | None
    word_aware: bool
    decode: Callable[[list[str]], str]
    special_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class ModelInfo:
    """The served model, as post-processing sees it (built by the server from the bundle's manifest).

    labels: label names in class-id order (empty for embeddings).
    dense: embeddings: sentence-transformers Dense modules applied after pooling, before normalizing.
    prompts/default_prompt_name: embeddings and sparse embeddings: named prompts prepended to the texts, and the
      default one.
    activation: ranking: the name (tasks.ops.ACTIVATIONS) of what turns a one-logit head's logit into a score.
    pair_template: ranking with a causal LM (Qwen3-Reranker): "format" (with {instruction}, {query} and
      {document}) and the default "instruction"; each pair is read as that one text (the tokenizer adds the
      chat template's fixed prefix and suffix). Empty for cross-encoders.
    heads: sparse embeddings from a bge-m3 bundle: the outputs its graph carries (dense, sparse, colbert);
      empty for SPLADE and every other task.
    regression: classification: the checkpoint's problem_type is regression (its logits are its scores).
    truncate_dim: embeddings: the dimensions a vector keeps when a request names none (sentence-transformers'
      truncate_dim, saved in the folder; None: every one).
    max_active_dims: sparse embeddings: the weights a vector keeps when a request names no top_k (the SPLADE
      folder's SparseEncoder setting; None: every non-zero weight).
    """

    labels: tuple[str, ...]
    multi_label: bool
    pooling: str
    normalize: bool
    max_length: int
    vocab: Vocab
    dense: tuple[Dense, ...] = ()
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    activation: str = "sigmoid"
    pair_template: Mapping[str, str] = field(default_factory=dict)
    heads: tuple[str, ...] = ()
    max_active_dims: int | None = None
    truncate_dim: int | None = None
    regression: bool = False


@dataclass(frozen=True, slots=True)
class Inputs:
    """What one request asks about.

    texts: the texts to encode; for pair tasks, the second member of each pair (the documents).
    single: the request sent one text, so the answer takes the single-input shape.
    query: pair tasks only: the first member of every pair.
    sent: the texts as the client sent them, where the task's prepare wrote `texts` around them (None: as in
      texts); each of `texts` ends with its sent text (a prompt before it; an LM reranker's template).
    pairs: text pairs of a classifier (natural language inference, paraphrase): each text's second member,
      transformers' `text_pair` (None: single texts).
    name: what the request calls its list of texts ("inputs", OpenAI's "input", Cohere's "texts" or
      "documents"), so that a refusal names a text as the client wrote it.
    lead: the name of a leading text outside that list (a similarity request's source sentence, before its
      sentences), or None.
    pair_name: where pairs came as two lists (KServe's "text" and "text_pair" tensors), the second's name, `name`
      the first's; None: each pair one object (/predict's {"text", "text_pair"}), its members named within it.
    """

    texts: list[str]
    single: bool
    query: str | None = None
    sent: list[str] | None = None
    pairs: list[str] | None = None
    name: str = "inputs"
    lead: str | None = None
    pair_name: str | None = None

    def named(self, i: int) -> str:
        """What the request calls its i-th text (the field itself where it sent one text)."""
        if self.lead is not None:
            return self.lead if i == 0 else f"{self.name}[{i - 1}]"
        return self.name if self.single else f"{self.name}[{i}]"

    def member_named(self, i: int, second: bool) -> str:
        """What the request calls pair i's first (text) or second (text_pair) member."""
        if self.pair_name is None:
            return f"{self.named(i)}.{'text_pair' if second else 'text'}"
        return f"{self.pair_name if second else self.name}[{i}]"

    def pair_named(self, i: int) -> str:
        """What the request calls pair i: its object, or its two members where they came as two lists."""
        if self.pair_name is None:
            return self.named(i)
        return f"{self.member_named(i, False)} with {self.member_named(i, True)}"

    @property
    def query_named(self) -> str:
        """What the request calls its query: the texts' neighbour ("inputs.documents" beside "inputs.query")."""
        parent, dot, _ = self.name.rpartition(".")
        return f"{parent}{dot}query"


Side = Literal["right", "left"]  # the end of a too-long text that is cut off
SIDES: dict[str, Side] = {"right": "right", "left": "left"}  # the sides by name, for readers of a request


@dataclass(frozen=True, slots=True)
class LongInput:
    """How a text longer than the model's maximum is read, resolved once (a request's in api/web/schemas.py, a
    bulk run's in api/bulk): "truncate" cuts it at the maximum, "refuse" answers 413 (InputTooLong), "window"
    reads all of it in windows of the model's content tokens, neighbours sharing `stride` of them. `side`: the
    end a cut text loses, "right" (its end: transformers' tokenizers' default) or "left" (its start, as TEI's
    truncation_direction Left and Cohere's truncate START ask). `text_tokens`: a request's own cap, below the
    model's maximum, on a text's own tokens (special tokens not counted): a single text, or a pair's second
    member (a ranking's document), is cut to it first (a single text over it is refused with "refuse")
    (Cohere's max_tokens and max_tokens_per_doc; None: only the model's maximum)."""

    mode: Literal["truncate", "refuse", "window"] = "truncate"
    stride: int = 0
    side: Side = "right"
    text_tokens: int | None = None

    @classmethod
    def window(cls, stride: int | None, window_tokens: int, name: str = "parameters.stride") -> LongInput:
        """Windows of `window_tokens` content tokens sharing `stride` (None: a quarter of a window); the one
        check of the stride's range, which names it `name` when it is out of it."""
        shared = window_tokens // 4 if stride is None else stride
        if not 0 <= shared <= max_stride(window_tokens):
            raise InvalidRequest(
                f"{name} must be from 0 to {max_stride(window_tokens)} (tokens shared by neighbouring windows of "
                f"{window_tokens}, at most half of one), got {shared}"
            )
        return cls("window", shared)


def max_stride(window_tokens: int) -> int:
    """The most tokens neighbouring windows may share: half a window, so that a text is read at most about
    twice. Nearer a whole window each window moved a token or two: 2.6 KB of text took 147,200 tokens (13 s of
    both cores of a 2-core EPYC) in one admitted request, a 1 MB text hours."""
    return max(window_tokens // 2, 0)


TRUNCATE = LongInput("truncate")


@dataclass(frozen=True, slots=True)
class Outputs:
    """The model's outputs for one request, regrouped per input.

    windows: per input, the encodings it was read as (one, or several overlapping ones for long_input=window).
    arrays: per input and window, the output row: [labels] for sequence heads, [tokens, dim] for token-level
      outputs (trimmed to the window's real tokens).
    truncated: per input, whether its text was cut to the model's maximum length.
    stride: tokens shared by consecutive windows (the request's LongInput).
    begins: for an input read by its end alone (a long text cut on the left), the character of its text where
      that end begins: its encodings' offsets are into the end.
    """

    inputs: Inputs
    windows: list[list[Encoding]]
    arrays: list[list[Array]]
    truncated: list[bool]
    stride: int = 0
    begins: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Answer:
    """A task's answer: the JSON body (numpy arrays allowed: the server serializes them with orjson) and the
    predicted labels, which the server counts for drift monitoring."""

    body: Any
    labels: Sequence[str] = ()


NUMBER: Mapping[str, Any] = {"type": "number"}
TRUNCATED: Mapping[str, Any] = {"type": "boolean", "const": True}


def json_object(properties: Mapping[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    """A JSON Schema object with exactly these properties (the answers' schemas are built from it)."""
    return {"type": "object", "properties": dict(properties), "required": list(required), "additionalProperties": False}


@dataclass(frozen=True, slots=True)
class Tensor:
    """A KServe v2 output tensor: data is a numpy array (numbers) or a list of strings (BYTES), row-major."""

    name: str
    datatype: str
    shape: list[int]
    data: Any


def tensor_io(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    """A tensor's metadata, as KServe's model metadata lists it."""
    return {"name": name, "datatype": datatype, "shape": shape}


TEXT_TENSOR = tensor_io("text", "BYTES", [-1])


@dataclass(frozen=True)
class Tensors:
    """The task under KServe's Open Inference Protocol v2 (api/web/protocols/kserve.py).

    inputs/outputs: the tensors' metadata; pair tasks take "query" and "documents", the others one BYTES
      tensor of texts under any name (a text_pairs task also two, "text" and "text_pair").
    convert: the task's /predict answer body (a list per input) -> its output tensors.
    parameters: task parameters narrowed to what the output tensors carry (feature extraction's FP32 tensor:
      float sentence vectors); the route states and checks these in place of the task's.
    """

    inputs: tuple[dict[str, Any], ...]
    outputs: tuple[dict[str, Any], ...]
    convert: Callable[[Any], list[Tensor]]
    parameters: Mapping[str, Spec] = field(default_factory=dict)


@dataclass(frozen=True)
class Playground:
    """The task in the console's Playground (admin_ui): what the form asks for and how the answer is drawn.

    form: "text" (one text), "text-pair" (one text, and a second one it is paired with where the user gives one),
      "sentences" (one per line, sent as a list when several) or "pairs" (a query and documents, one per line).
    view: "labels" (score bars), "entities" (highlighted in the text), "similarity" (a cosine heatmap) or
      "ranking" (documents by score).
    example/documents: what the form starts with; parameters: the request parameters it starts with (JSON).
    """

    form: str
    view: str
    example: str
    documents: str = ""
    parameters: str = "{}"


@dataclass(frozen=True)
class Baseline:
    """How the vanilla reference answers the task's /predict bodies (bench/baseline_app.py).

    pipeline: the transformers pipeline task, or the sentence-transformers class ("SentenceTransformer",
      "SparseEncoder") for tasks whose users run that library; options: the pipeline's keyword arguments.
    predict: (the pipeline or model, the request's `inputs`) -> the answer, truncating at the model's maximum
      as hare does by default (a pipeline fails on longer inputs otherwise).
    """

    pipeline: str
    predict: Callable[[Callable[..., Any], Any], Any]
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSpec:
    """One task's contract with the optimizer (export and parity) and with the server (parse and answer).

    head: the transformers Auto class the optimizer instantiates.
    architectures: suffixes a checkpoint's `architectures` must end with; empty means any checkpoint.
    output: the graph output the server reads.
    output_axes: that output's rank, where tasks share its name (three read "logits": a sequence's row, or a
      token's); a bundle whose graph's differs was built for another task (None: not checked).
    pairs: inputs are (query, document) pairs rather than single texts.
    text_pairs: parse_inputs also takes transformers' text pairs ({"text", "text_pair"}) beside single texts.
    parity: task metrics from reference vs candidate outputs.
    gates: the default thresholds (overridable from the CLI by metric name).
    default_pooling: pooling when the model folder declares none (embeddings only).

    Serving (pure functions; they raise tasks.errors.InputError subclasses naming the field):
    parameters: the task's request parameters, name -> spec (tasks/params.py: type, bounds, one-line help);
      parse_params reads each value through its spec and the API documentation is derived from them.
    parse_inputs: the request's `inputs` value -> Inputs.
    parse_params: the request's task parameters (already checked against `parameters`) -> a params object.
    prepare: (inputs, params) -> the inputs the model reads (embeddings prepend the prompt); None: as sent.
    pooling: params -> the pooling (tasks/ops.py) post-processing applies to every sequence's token states,
      so that a shared engine may apply it and send one vector per sequence (postprocess then takes a
      [dim] row as already pooled); None, or returning None: token states wanted as they are.
    postprocess: (outputs, params, model) -> Answer in the Hugging Face pipeline's shape.
    token_values: (the model's rows, params) -> the numbers the answer's token vectors will hold (embeddings'
      token_embeddings, bge-m3's ColBERT vectors), which the server caps before post-processing writes them
      (HARE_MAX_ANSWER_VALUES); None: the task answers none.
    windows: long inputs may be read as overlapping windows and merged (long_input="window").
    offsets: the answer names spans of the text, so its encodings carry each token's character offsets (a
      tokenizer tracks them at about a fifth of its time: 36 of 187 us for a 142-token text, AMD EPYC).
    embeddings: the task answers OpenAI's /v1/embeddings too.
    choosers: the request parameters that choose among a request's inputs (ranking's top_n) rather than say
      how each is answered: a bulk job answers every row of its corpus on its own, so it refuses them.
    sparse: the task answers sparse vectors (TEI's /embed_sparse), from a SPLADE or bge-m3 folder.

    What the rest of hare asks of the task, so that no table elsewhere is keyed by task name:
    answer: the JSON Schema of the /predict answer (its OpenAPI operation, api/web/protocols/hf.py).
    tensors: its KServe v2 tensors (api/web/protocols/kserve.py).
    playground: its form and drawing in the console (admin_ui).
    baseline: how the vanilla transformers pipeline serves it (bench/baseline_app.py).
    """

    name: str
    head: str
    architectures: tuple[str, ...]
    output: str
    pairs: bool
    parity: Callable[[ParityInput], dict[str, float]]
    gates: tuple[Gate, ...]
    default_pooling: str | None = None
    parameters: Mapping[str, Spec] = field(default_factory=dict, kw_only=True)
    parse_inputs: Callable[[object], Inputs] = field(kw_only=True)
    parse_params: Callable[[Mapping[str, object], ModelInfo], Any] = field(kw_only=True)
    postprocess: Callable[[Outputs, Any, ModelInfo], Answer] = field(kw_only=True)
    prepare: Callable[[Inputs, Any], Inputs] | None = field(default=None, kw_only=True)
    pooling: Callable[[Any], str | None] | None = field(default=None, kw_only=True)
    token_values: Callable[[Sequence[Array], Any], int] | None = field(default=None, kw_only=True)
    output_axes: int | None = field(default=None, kw_only=True)
    windows: bool = field(default=True, kw_only=True)
    text_pairs: bool = field(default=False, kw_only=True)
    offsets: bool = field(default=False, kw_only=True)
    embeddings: bool = field(default=False, kw_only=True)
    choosers: tuple[str, ...] = field(default=(), kw_only=True)
    sparse: bool = field(default=False, kw_only=True)
    answer: Mapping[str, Any] = field(kw_only=True)
    tensors: Tensors = field(kw_only=True)
    playground: Playground = field(kw_only=True)
    baseline: Baseline = field(kw_only=True)
