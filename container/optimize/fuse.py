"""Stage 2, fuse: ONNX Runtime's transformer optimizer rewrites subgraphs into fused kernels
(EmbedLayerNormalization, Attention, BiasGelu...; SkipLayerNormalization for GPUs only)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onnxruntime.transformers.fusion_options import FusionOptions
from onnxruntime.transformers.optimizer import optimize_model

from container.machine import available_bytes
from container.optimize import graphs

# Share of the memory available when fusion starts that its process may take. ORT's Python fusions can take
# far more than the graph: on a DeBERTa-v3-base geometry (128k vocabulary) they grew past 24 GiB, and the
# kernel's OOM killer then ended the whole `hare optimize`. In a process of its own with a cap, only the
# fused variants fail, and the gates choose among the others.
MEMORY_SHARE = 0.8


def attention_shape(config: Mapping[str, Any]) -> tuple[int, int]:
    """(heads, hidden size of the attention) from a transformers config; (0, 0) where it names none.

    The fusion needs them: transformers 5 reshapes q/k/v with `view(*input_shape, -1, head_dim)`, so the
    exported Reshape has -1 where the heads were, and ORT's detection from the graph fails ("Failed to detect
    num_heads and hidden_size"): no Attention and no EmbedLayerNormalization are fused. Measured on
    all-MiniLM-L6-v2: without them, 0 of 6 attention layers fused; with them, all 6 (parity 2.6e-6)."""
    heads = config.get("num_attention_heads") or config.get("n_heads") or config.get("num_heads") or 0
    head_dim = config.get("head_dim") or 0
    hidden = heads * head_dim if head_dim else config.get("hidden_size") or config.get("dim") or 0
    if not isinstance(heads, int) or not isinstance(hidden, int) or not heads or hidden % heads:
        return 0, 0
    return heads, hidden


def fuse(
    model: Path, out: Path, family: str = "bert", use_gpu: bool = False, attention: tuple[int, int] = (0, 0)
) -> dict[str, int]:
    """Write the fused graph of `model` to `out`; returns the count of each fused operator (zeros dropped).
    `attention`: (heads, hidden size) from `attention_shape` ((0, 0): ORT reads them from the graph).
    Runs in a child process under a memory cap; raises RuntimeError if it runs out or crashes."""
    limit = int(available_bytes() * MEMORY_SHARE)
    argv = [
        sys.executable,
        "-m",
        "container.optimize.fuse",
        str(model),
        str(out),
        family,
        str(int(use_gpu)),
        str(limit),
        *map(str, attention),
    ]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode == 0:
        counts: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
        return counts
    why = (done.stderr.strip().splitlines() or [f"its process exited with code {done.returncode}"])[-1]
    raise RuntimeError(
        f"ONNX Runtime's transformer optimizer failed on this graph ({why}; memory cap {limit / 2**30:.1f} GiB); "
        "the unfused variants go on"
    )


def _main(argv: list[str]) -> int:
    """The child: `python -m container.optimize.fuse MODEL OUT FAMILY USE_GPU LIMIT_BYTES HEADS HIDDEN`; prints
    the counts."""
    model, out, family, use_gpu, limit, heads, hidden = argv
    if int(limit) > 0:
        resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))
    try:
        counts = _fuse_here(Path(model), Path(out), family, use_gpu == "1", (int(heads), int(hidden)))
    except MemoryError:
        print("out of memory", file=sys.stderr)
        return 1
    print(json.dumps(counts))
    return 0


def _fuse_here(model: Path, out: Path, family: str, use_gpu: bool, attention: tuple[int, int]) -> dict[str, int]:
    options = FusionOptions(family)
    # On CPU, SkipLayerNormalization (and its simplified form, 2.5x slower than Add and SimplifiedLayerNormalization
    # at 128 x 1024) costs more than the ops it fuses: see CPU_DISABLED_OPTIMIZERS in container/runtime.py.
    options.enable_skip_layer_norm = use_gpu
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # num_heads/hidden_size 0: read them from the graph. opt_level 0: only the Python fusions, so the
        # saved graph stays portable across execution providers; ORT applies its own passes at load.
        optimized = optimize_model(
            str(model),
            model_type=family,
            num_heads=attention[0],
            hidden_size=attention[1],
            optimization_options=options,
            opt_level=0,
            use_gpu=use_gpu,
        )
    optimized.save_model_to_file(str(out), use_external_data_format=graphs.too_big(optimized.model))
    return {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}


def to_fp16(model: Path, out: Path) -> Path:
    """Convert a fused graph to fp16 for GPUs, keeping int64 inputs and fp32 outputs as they were."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    graph = OnnxModel(onnx.load(str(model)))
    graph.convert_float_to_float16(keep_io_types=True)
    graph.save_model_to_file(str(out), use_external_data_format=graphs.too_big(graph.model))
    return out


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
