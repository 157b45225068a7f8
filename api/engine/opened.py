"""A bundle opened for answering, as a server worker (api/web/app.py) and a bulk job (api/bulk/model.py) both
need it: the manifest read and checked, the settings completed from it, the task, the tokenizer as an
Encoder, and the served model's facts for post-processing. The ONNX Runtime sessions are left to each caller,
which makes the ones it runs (a worker's widths, a bulk job's one-thread sessions)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from api.config import Settings
from api.engine.encoder import Encoder, vocab
from api.engine.pipeline import model_info
from container.bundle import MODEL_FILE, TOKENIZER_FILE, Manifest, read_manifest
from container.cudagraphs import Shape, graph_shapes
from container.onnx_wire import output_ranks
from container.openvino_runtime import VARIANTS as OPENVINO_VARIANTS
from container.runtime import bound_malloc
from tasks.base import ModelInfo, TaskSpec, Vocab
from tasks.errors import InputError
from tasks.registry import TASKS


@dataclass(frozen=True, slots=True)
class OpenBundle:
    """settings: the caller's, with what they left to the bundle filled from its manifest (Settings.for_bundle)."""

    settings: Settings
    manifest: Manifest
    task: TaskSpec
    words: Vocab
    model: ModelInfo
    encoder: Encoder

    @property
    def graph_shapes(self) -> list[Shape]:
        """The padded batch shapes a GPU session captures as CUDA graphs (none when HARE_CUDA_GRAPHS is off)."""
        if not self.settings.cuda_graphs:
            return []
        return graph_shapes(self.settings.max_batch_size, self.settings.max_batch_tokens, self.manifest.max_length)


def checked_bundle(bundle: Path) -> tuple[Manifest, Tokenizer]:
    """The bundle's manifest and tokenizer, or InputError naming what is wrong with them: `hare serve` calls it
    before any worker starts, so a broken bundle is one sentence rather than a traceback from every worker."""
    manifest = read_manifest(bundle)
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
    """InputError when the graph is no ONNX model (each worker failed to load it, with a traceback), or its
    output has another rank than the task reads (`axes`): among the tasks that read "logits", a hare.json's task
    edited to another failed in every worker with a traceback."""
    try:
        rank = output_ranks(bundle / MODEL_FILE).get(manifest.output)
    except ValueError as exc:
        raise InputError(f"{bundle / MODEL_FILE} is not an ONNX graph ({exc}); rebuild the bundle") from None
    if axes is not None and rank is not None and rank != axes:
        per = {2: "one row a text", 3: "one row a token"}
        raise InputError(
            f"{bundle} serves task {manifest.task!r}, which reads {per[axes]}, but its graph answers "
            f"{per.get(rank, f'{rank} axes')} (hare.json's task was edited?); build the model again with "
            f"hare optimize --task {manifest.task}"
        )


def open_bundle(settings: Settings, throughput: bool = False) -> OpenBundle:
    """Open `settings.bundle` (`throughput`: for a bulk job, container/bundle.py resolve_max_batch_tokens);
    InputError names what is wrong with it."""
    manifest, tokenizer = checked_bundle(settings.bundle)
    settings = settings.for_bundle(manifest, throughput)
    task = TASKS[manifest.task]
    words = vocab(tokenizer, manifest.pad_id)
    bound_malloc()  # before the sessions are made: their buffers then go back to the system when freed
    return OpenBundle(
        settings=settings,
        manifest=manifest,
        task=task,
        words=words,
        model=model_info(settings.bundle, manifest, task, words),
        encoder=Encoder(tokenizer, manifest.max_length, task.windows, task.offsets),
    )
