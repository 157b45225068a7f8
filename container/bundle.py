"""The bundle format `hare optimize` writes and `hare serve` reads: model.onnx and its weights in
model.onnx.data (container/optimize/graphs.py says why apart), tokenizer.json, hare.json, parity.npz (the
validation set and PyTorch's answers, for `hare tune --check`), and dense.npz when a sentence-transformers model
has Dense modules after pooling. A bundle from before the data file, its weights
inline in model.onnx, loads the same.

Loading a bundle needs onnxruntime, tokenizers and numpy only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from container.machine import FULL_LEVELS
from container.onnx_wire import output_shapes
from tasks.errors import InputError
from tasks.ops import POOLINGS, Dense
from tasks.params import kind

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
MANIFEST_FILE = "hare.json"
DENSE_FILE = "dense.npz"
# The validation set and PyTorch's answers to it, so that `hare tune --check` re-runs the gate on another CPU.
PARITY_FILE = "parity.npz"
FORMAT_VERSION = 1
# How a server batches a bundle unless told otherwise (api/config.py's HARE_MAX_BATCH_SIZE and
# HARE_MAX_BATCH_TOKENS defaults), here so that the optimizer's gate and the bench batch as it does: sequences
# per model call at most, and padded tokens per call where the bundle carries no measured max_batch_tokens.
MAX_BATCH_SIZE = 32
MAX_BATCH_TOKENS = 8192
BATCH_TOKENS = MAX_BATCH_TOKENS  # the old name, while bench/bulk.py (being written) still imports it


@dataclass
class Manifest:
    """hare.json: what the server needs to answer, and the evidence of how the model was chosen.

    task: one of tasks.registry.TASKS.
    labels: id -> label for classification heads (empty for embeddings).
    multi_label: the checkpoint's problem_type is multi_label_classification (sigmoid, not softmax).
    regression: the checkpoint's problem_type is regression (its logits are the scores, no function applied).
    pooling/normalize: how token states become an embedding (from sentence-transformers' modules).
    max_length: tokens per sequence, special tokens included; the tokenizer truncates there.
    inputs/output: the graph's input names and the output the task reads.
    target: cpu or gpu; variant: the chosen variant's name; variants: every candidate's metrics and timings.
    dense: sentence-transformers Dense modules after pooling, in order ({in_features, out_features, bias,
      activation}); their weights are dense.npz's "{i}.weight" / "{i}.bias".
    prompts/default_prompt_name: sentence-transformers' named prompts (prepended to the text) and the one used
      when a request names none.
    activation: ranking only: what turns the relevance logit into a score (CrossEncoder's activation_fn).
    pad_id: the id batches are padded with (the model's pad token).
    pair_template: ranking with a causal LM: how a (query, document) pair is written (tasks.base.ModelInfo).
    heads: sparse-embedding from a bge-m3 folder: the outputs its graph carries (dense, sparse, colbert).
    max_active_dims: sparse-embedding from a SparseEncoder folder that sets it: the weights a vector keeps when
      a request names no top_k (None: every non-zero weight).
    truncate_dim: embeddings from a sentence-transformers folder saved with truncate_dim: the dimensions a vector
      keeps when a request names none (None: every one).
    source: where the model came from; fused_operators: what ONNX Runtime's fusion found in its graph;
      additive_masks: the attention masks the export made additive (container/optimize/masks.py).
    max_batch_tokens: the padded tokens per model call the server batches up to by default: the smallest batch
      within 5% of the best token rate measured with every core busy (None: not measured, as for a GPU).
    token_rates: that measurement, tokens a second by padded tokens per call.
    budget_machine: the machine it was measured on and its model calls at once (`streams`); `hare tune`
      measures it again on the machine at hand.
    int8_levels: the shipped dynamic int8 graph's weights' levels a side (64 where the build's CPU adds int8
      products in saturating 16-bit pairs: container/machine.py, weight_levels); 127 otherwise (full-range
      weights, fp32 and blockwise int8 graphs, bundles from before it was recorded).
    files: the size in bytes of each binary file a server reads (the graph, its data file, the Dense weights),
      as the build wrote them: a bundle copied or downloaded in part is refused by its first short
      file before any worker loads it; empty in a bundle from before it was recorded (not checked).
    sha256: the SHA-256 of each of those files (hex), as the build wrote them: `hare serve` reads them whole
      before its workers start (which then read them from the page cache) and refuses one changed in place;
      empty in a bundle from before it was recorded (not checked).
    name: what clients call the model (OpenAI's `model`, KServe's model name): the bundle folder's name when it
      was built (`hare optimize --out`), kept when the folder is moved or mounted elsewhere (a container's
      /bundle); empty in a bundle from before it was recorded (the folder's name is served then).
    pick: how autotune chose `variant` (container/optimize/autotune.py, Pick): winner, fastest, runner_up,
      margin (the runner-up's score over the fastest's, less 1), tie and tied, rounds, statistic, clear_margin;
      empty in a bundle from before it was recorded.
    """

    task: str
    architecture: str
    model_type: str
    labels: dict[int, str]
    multi_label: bool
    pooling: str | None
    normalize: bool
    max_length: int
    inputs: list[str]
    output: str
    target: str
    variant: str
    precision: str
    variants: list[dict[str, Any]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    dense: list[dict[str, Any]] = field(default_factory=list)
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    activation: str | None = None
    pad_id: int = 0
    pair_template: dict[str, str] = field(default_factory=dict)
    heads: list[str] = field(default_factory=list)
    max_active_dims: int | None = None
    truncate_dim: int | None = None
    regression: bool = False
    max_batch_tokens: int | None = None
    token_rates: dict[str, float] = field(default_factory=dict)
    budget_machine: dict[str, Any] = field(default_factory=dict)
    pick: dict[str, Any] = field(default_factory=dict)
    int8_levels: int = FULL_LEVELS
    files: dict[str, int] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)
    name: str = ""
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """The manifest `data` holds; ValueError naming what it lacks (a hand-edited or truncated hare.json)."""
        if not isinstance(data, dict):
            raise ValueError(f"it holds {kind(data)}, not an object")
        required = [f.name for f in dataclasses.fields(cls) if f.default is f.default_factory is dataclasses.MISSING]
        if lacking := [name for name in required if name not in data]:
            raise ValueError(f"it lacks {', '.join(lacking)}")
        hints = typing.get_type_hints(cls)
        for name in hints.keys() & data.keys():
            if not _fits(data[name], hints[name]):
                raise ValueError(f"its {name} is {kind(data[name])}, where the build writes {_json_type(hints[name])}")
        if data["max_length"] < 1 or data["target"] not in TARGETS or data["pooling"] not in (None, *POOLINGS):
            said = f"max_length {data['max_length']}, target {data['target']!r}, pooling {data['pooling']!r}"
            raise ValueError(f"one of its {said} is no build's")
        for name in ("max_active_dims", "truncate_dim"):
            if data.get(name) is not None and data[name] < 1:
                raise ValueError(f"its {name} {data[name]} is no build's (at least 1, or null)")
        data = dict(data)
        data["labels"] = {int(k): v for k, v in data.get("labels", {}).items()}
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


TARGETS = ("cpu", "gpu")


def _fits(value: object, hint: Any) -> bool:
    """Whether a JSON value is of a manifest field's type: a hand-edited hare.json ("max_length": "256") failed
    in every worker with a traceback, or as a request's error."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, int | float if hint is float else int) and not isinstance(value, bool)
    if origin is dict:  # JSON keys are strings: labels' ids are checked as they are converted
        return isinstance(value, dict) and all(_fits(v, args[1]) for v in value.values())
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin is Literal:
        return value in args
    return isinstance(value, hint)


def _json_type(hint: Any) -> str:
    """A field's type as JSON names it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_json_type(arg) for arg in args)
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", type(None): "null"}
    return names.get(hint) or {dict: "an object", list: "a list"}.get(origin, str(hint))


def read_manifest(bundle: Path) -> Manifest:
    """Read and check a bundle folder; the error names what is missing."""
    if bundle.is_file():
        raise InputError(f"{bundle} is a file; give the bundle's folder (the one `hare optimize` wrote)")
    if not bundle.is_dir():
        raise InputError(f"bundle folder {bundle} does not exist; build one with `hare optimize`")
    missing = [f for f in (MODEL_FILE, TOKENIZER_FILE, MANIFEST_FILE) if not (bundle / f).is_file()]
    if missing:
        # A model folder given where its bundle belongs: say how to make the bundle.
        model = (bundle / "config.json").is_file() and MANIFEST_FILE in missing
        how = f"`hare optimize {bundle} --task TASK --out BUNDLE`"
        build = f"; it holds a model: build its bundle with {how}" if model else ""
        raise InputError(f"{bundle} is not a hare bundle: missing {', '.join(missing)}{build}")
    try:
        manifest = Manifest.from_dict(json.loads((bundle / MANIFEST_FILE).read_text()))
    except (ValueError, TypeError) as exc:
        raise InputError(f"{bundle / MANIFEST_FILE} is unreadable: {exc}") from exc
    if manifest.format_version != FORMAT_VERSION:
        raise InputError(
            f"{bundle} has bundle format {manifest.format_version}, this hare reads {FORMAT_VERSION}; "
            "rebuild it with `hare optimize`"
        )
    check_sizes(bundle, manifest)
    return manifest


def checked_bundle(bundle: Path, whole: bool = False) -> tuple[Manifest, Tokenizer]:
    """The bundle's manifest and tokenizer, or InputError naming what is wrong with them: `hare serve` calls it
    before any worker starts, so a broken bundle is one sentence rather than a traceback from every worker, and
    `hare run` and `hare tune` open a bundle through it, so that all three refuse one alike. `whole`: the served
    files are also read whole against their SHA-256 (hare serve, once, before its workers open the bundle)."""
    # Here, not at the top: the images' health check imports this module (through api/config.py) for its
    # constants, and needs neither the tokenizer nor the tasks.
    from tokenizers import Tokenizer

    from container.openvino_runtime import VARIANTS as OPENVINO_VARIANTS
    from tasks.registry import TASKS

    manifest = read_manifest(bundle)
    if whole:
        check_digests(bundle, manifest)
    if manifest.task not in TASKS:
        raise InputError(f"{bundle} serves task {manifest.task!r}, which this hare does not know")
    if manifest.output != TASKS[manifest.task].output:  # a build writes its task's: the task was edited
        raise InputError(
            f"{bundle} serves task {manifest.task!r}, which reads a graph's {TASKS[manifest.task].output!r}, but "
            f"its graph answers {manifest.output!r} (hare.json's task was edited?); build the model again with "
            f"hare optimize --task {manifest.task}"
        )
    _check_graph(bundle, manifest, TASKS[manifest.task].output_axes)
    data = bundle / (MODEL_FILE + ".data")
    if manifest.variant in OPENVINO_VARIANTS and data.is_file() and data.resolve().parent != bundle.resolve():
        # OpenVINO reads a graph's weights only from inside its folder (ONNX Runtime follows the link): a bundle
        # of links (`cp -rs`, a store of blobs) failed in every worker, saying to rebuild it.
        raise InputError(
            f"{data} is a link to {data.resolve()}, outside the bundle's folder, and OpenVINO reads the weights of "
            f"a {manifest.variant} graph only from inside it: copy the bundle with its files (cp -rL), not as links"
        )
    try:
        tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    except Exception as exc:  # tokenizers raises a bare Exception with its parser's message
        raise InputError(f"{bundle / TOKENIZER_FILE} is unreadable ({exc}); rebuild the bundle") from None
    return manifest, tokenizer


def _check_graph(bundle: Path, manifest: Manifest, axes: int | None) -> None:
    """InputError when the graph is no ONNX model (each worker failed to load it, with a traceback), its output
    has another rank than the task reads (`axes`): among the tasks that read "logits", a hare.json's task edited
    to another failed in every worker with a traceback; or, where the graph states it (a token classifier's; a
    sequence classifier's export leaves it named), another number of scores a row than hare.json has labels (an
    edit that added or dropped one answered scores under other labels' names)."""
    try:
        shape = output_shapes(bundle / MODEL_FILE).get(manifest.output)
    except ValueError as exc:
        raise InputError(f"{bundle / MODEL_FILE} is not an ONNX graph ({exc}); rebuild the bundle") from None
    rank = None if shape is None else len(shape)
    if manifest.labels and shape and shape[-1] is not None and shape[-1] != len(manifest.labels):
        raise InputError(
            f"{bundle / MANIFEST_FILE} names {len(manifest.labels)} labels, but its graph answers {shape[-1]} scores "
            "a row (its labels were edited?); give one label for each score, or build the model again"
        )
    if axes is not None and rank is not None and rank != axes:
        per = {2: "one row a text", 3: "one row a token"}
        raise InputError(
            f"{bundle} serves task {manifest.task!r}, which reads {per[axes]}, but its graph answers "
            f"{per.get(rank, f'{rank} axes')} (hare.json's task was edited?); build the model again with "
            f"hare optimize --task {manifest.task}"
        )


# The binary files a server reads, whose sizes the build records: their parsers' errors say nothing of a short
# copy. Not tokenizer.json, which people edit (its own parser names what is wrong), nor parity.npz, which is
# `hare tune --check`'s alone (a bundle shipped without it still serves).
SERVED_FILES = (MODEL_FILE, MODEL_FILE + ".data", DENSE_FILE)


def file_sizes(bundle: Path) -> dict[str, int]:
    """The sizes of the served files `bundle` holds, for its manifest's `files`."""
    return {name: (bundle / name).stat().st_size for name in SERVED_FILES if (bundle / name).is_file()}


def check_sizes(bundle: Path, manifest: Manifest) -> None:
    """InputError naming the first file whose size is not the one the build recorded: an interrupted copy,
    download or `docker cp` otherwise fails in every worker, inside the runtime's parser, with a traceback."""
    for name, size in manifest.files.items():
        path = bundle / name
        found = path.stat().st_size if path.is_file() else None
        if found != size:
            what = "is missing" if found is None else f"is {found:,} bytes"
            raise InputError(
                f"{path} {what} where `hare optimize` wrote {size:,}: the bundle was copied or written only in "
                "part; copy it again whole, or rebuild it"
            )


def file_digests(bundle: Path) -> dict[str, str]:
    """The SHA-256 of the served files `bundle` holds, for its manifest's `sha256`."""
    return {name: _sha256(bundle / name) for name in SERVED_FILES if (bundle / name).is_file()}


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_digests(bundle: Path, manifest: Manifest) -> None:
    """InputError naming the first file whose SHA-256 is not the one the build recorded: a file changed in place
    at its own size (a damaged disk or copy, an edit) loads and answers, wrongly (the parity gates checked the
    graph the build wrote). Reading a 2 GB graph takes about a second, and leaves it in the page cache for the
    workers' loads."""
    for name, digest in manifest.sha256.items():
        path = bundle / name
        if path.is_file() and _sha256(path) != digest:
            raise InputError(
                f"{path} is not the file `hare optimize` wrote: its SHA-256 differs from hare.json's (at the same "
                "size): the bundle was damaged or edited; copy it again whole, or rebuild it"
            )


def model_bytes(bundle: Path) -> int:
    """The graph's size on disk, its data file included."""
    return sum(p.stat().st_size for p in (bundle / MODEL_FILE, bundle / (MODEL_FILE + ".data")) if p.is_file())


def read_dense(bundle: Path, manifest: Manifest) -> tuple[Dense, ...]:
    """The Dense modules the embedding passes through after pooling (none for most models)."""
    if not manifest.dense:
        return ()
    with np.load(bundle / DENSE_FILE, allow_pickle=False) as arrays:
        return tuple(
            Dense(arrays[f"{i}.weight"], arrays[f"{i}.bias"] if d["bias"] else None, d["activation"])
            for i, d in enumerate(manifest.dense)
        )


def model_head(bundle: Path, manifest: Manifest) -> dict[str, Any]:
    """What post-processing needs beyond the graph, as ModelInfo's keyword arguments."""
    return {
        "dense": read_dense(bundle, manifest),
        "prompts": dict(manifest.prompts),
        "default_prompt_name": manifest.default_prompt_name,
        "activation": manifest.activation or "sigmoid",
        "pair_template": {k: v for k, v in manifest.pair_template.items() if k in ("format", "instruction")},
        "heads": tuple(manifest.heads),
        "max_active_dims": manifest.max_active_dims,
        "truncate_dim": manifest.truncate_dim,
    }


class Resolved(NamedTuple):
    """max_batch_tokens as resolved, and where it came from: "setting" (HARE_MAX_BATCH_TOKENS), "bundle" (what
    `hare optimize` or `hare tune` measured, on the bundle's own target) or "default" (MAX_BATCH_TOKENS)."""

    max_batch_tokens: int
    source: Literal["setting", "bundle", "default"]


def resolve_max_batch_tokens(
    manifest: Manifest, setting: int = 0, target: str | None = None, throughput: bool = False
) -> Resolved:
    """The padded tokens per model call a server of `manifest` batches up to: `setting` when set (not 0), else
    the bundle's measured value when served on its own target (`target`; None: the bundle's: a CPU's value
    served on a GPU would starve the device), else MAX_BATCH_TOKENS. The server, its bulk job and the peers
    bench all resolve it here.

    `throughput` (a bulk job, where no answer waits on a batch): the measured budget of the best token rate
    rather than the smallest within 5% of it. On OpenVINO's int8-grouped all-MiniLM-L6-v2 the two are 512 and
    128, and `hare run` over 2,000 texts of 10-300 tokens took 18.2 CPU s per 1,000 rows at 512 against
    19.9-20.9 at 128 (AMD EPYC, 2026-11-29); an ONNX Runtime bundle's rate is flat there (int8-mixed: 256
    against 128, level)."""
    if setting:
        return Resolved(setting, "setting")
    if manifest.max_batch_tokens and (target or manifest.target) == manifest.target:
        rates = {int(budget): rate for budget, rate in manifest.token_rates.items()}
        if throughput and rates:
            return Resolved(max(rates, key=rates.__getitem__), "bundle")
        return Resolved(manifest.max_batch_tokens, "bundle")
    return Resolved(MAX_BATCH_TOKENS, "default")
