"""A bundle opened for answering, as a server worker (api/web/app.py) and a bulk job (api/bulk/model.py) both
need it: the manifest read and checked, the settings completed from it, the task, the tokenizer as an
Encoder, and the served model's facts for post-processing. The ONNX Runtime sessions are left to each caller,
which makes the ones it runs (a worker's widths, a bulk job's one-thread sessions)."""

from __future__ import annotations

from dataclasses import dataclass

from api.config import Settings
from api.engine.encoder import Encoder, vocab
from api.engine.pipeline import model_info
from container.bundle import Manifest, checked_bundle
from container.cudagraphs import Shape, graph_shapes
from container.runtime import bound_malloc
from tasks.base import ModelInfo, TaskSpec, Vocab
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
