"""What a server's workers may need of the machine's memory: each holds its own copies of the model, and past
the memory the kernel kills workers as they load, gunicorn starts them again, and the server never gets ready.
`hare serve` warns before the start; a SIGHUP whose new workers may not fit beside the old stops the old first."""

from __future__ import annotations

from api.config import Settings
from container.bundle import Manifest
from container.openvino_runtime import VARIANTS as OPENVINO_VARIANTS

# A worker's memory besides its model's copies: Python, the runtimes, the app (MiniLM int8-grouped on OpenVINO, two
# streams: 161 MB of anonymous memory, three compiled copies of its 25 MB graph among them; AMD EPYC).
WORKER_BASE_BYTES = 100 * 2**20


def memory_need(settings: Settings, manifest: Manifest, graph_bytes: int) -> tuple[int, int]:
    """The memory the workers may need (bytes), and the copies of the graph each holds: an ONNX Runtime
    session's repacked weights for each thread count it runs with (HARE_LONE_THREADS), an OpenVINO compiled copy
    for each model stream and the lone one, and WORKER_BASE_BYTES. A GPU bundle's copies are on the device: 0."""
    if (settings.target or manifest.target) == "gpu":
        return 0, 0
    lone = len(settings.widths) - 1
    copies = settings.streams + lone if manifest.variant in OPENVINO_VARIANTS else 1 + lone
    return settings.workers * (WORKER_BASE_BYTES + copies * graph_bytes), copies


def memory_warning(settings: Settings, manifest: Manifest, graph_bytes: int, room: int) -> str | None:
    """What to say when the workers may not fit in the memory left (`room` bytes; 0: unknown), or None: past
    it, the kernel kills workers as they load, gunicorn starts them again, and the server never gets ready."""
    need, copies = memory_need(settings, manifest, graph_bytes)
    if not room or need <= room:
        return None
    gb = 2**30
    return (
        f"{settings.workers} worker(s) may need about {need / gb:.1f} GB ({copies} copies of the "
        f"{graph_bytes / 2**20:,.0f} MB graph each, and about {WORKER_BASE_BYTES // 2**20} MB), and "
        f"{room / gb:.1f} GB is free here: a worker the kernel kills for memory is started again, and the server may "
        "never get ready; set fewer HARE_WORKERS (--workers), or HARE_STREAMS, or HARE_LONE_THREADS=1"
    )
