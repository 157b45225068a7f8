"""Stage 2, fuse: ONNX Runtime's transformer optimizer rewrites subgraphs into fused kernels
(EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu...)."""

from __future__ import annotations

import warnings
from pathlib import Path

from onnxruntime.transformers.fusion_options import FusionOptions
from onnxruntime.transformers.optimizer import optimize_model


def fuse(model: Path, out: Path, family: str = "bert", use_gpu: bool = False) -> dict[str, int]:
    """Write the fused graph of `model` to `out`; returns the count of each fused operator (zeros dropped)."""
    options = FusionOptions(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # num_heads/hidden_size 0: read them from the graph. opt_level 0: only the Python fusions, so the
        # saved graph stays portable across execution providers; ORT applies its own passes at load.
        optimized = optimize_model(
            str(model),
            model_type=family,
            num_heads=0,
            hidden_size=0,
            optimization_options=options,
            opt_level=0,
            use_gpu=use_gpu,
        )
    optimized.save_model_to_file(str(out))
    return {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}


def to_fp16(model: Path, out: Path) -> Path:
    """Convert a fused graph to fp16 for GPUs, keeping int64 inputs and fp32 outputs as they were."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    graph = OnnxModel(onnx.load(str(model)))
    graph.convert_float_to_float16(keep_io_types=True)
    graph.save_model_to_file(str(out))
    return out
