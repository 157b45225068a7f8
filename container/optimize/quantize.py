"""Stage 3, quantize: int8 for CPUs, two ways.

Dynamic (MatMulInteger): weights signed int8, activations unsigned with one scale per tensor (U8S8, the
layout VNNI's dot-product instructions take). Fastest, but a per-tensor activation scale loses accuracy on
models with activation outliers (all-MiniLM-L6-v2's short inputs fall to cosine ~0.97 against PyTorch).
`reduce_range` (7-bit weights) only helps CPUs without VNNI, where 16-bit accumulation can saturate.

Blockwise (MatMulNBits, accuracy level 4): int8 weights with one scale per block of `block` input
channels, and activations quantized per block at run time, so an outlier only costs its own block.
Slower than dynamic, faster than fp32, and close to fp32 in accuracy. Its lookup tables (the word embedding,
which dynamic int8 stores with one scale for the whole table) are stored as int8 rows with one scale per row
(int8.int8_tables): for all but the widest rows finer than dynamic int8's, and a quarter of the bytes
(all-MiniLM-L6-v2: 47 of its 56 MB are that table).

A third way, per-channel dynamic int8 that keeps the gates (smoothing the outliers into the weights, one
activation scale per token where one per call is not enough, and the MatMuls that still break a gate kept
fp32), is chosen on the validation samples after the reference: `int8-mixed`, container/optimize/mixed.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from onnxruntime.quantization import QuantType, matmul_nbits_quantizer, quantize_dynamic

from container.optimize import graphs, int8

# The quantizers log every skipped node and a pre-processing hint at INFO/WARNING; the stage
# reports its own outcome through validation instead.
logging.getLogger().setLevel(logging.ERROR)


def quantize_int8(model: Path, out: Path, per_channel: bool = False, reduce_range: bool = False) -> Path:
    """Write a dynamically quantized copy of `model` to `out` (MatMuls with constant weights, fused Attention)."""
    quantize_dynamic(
        str(model),
        str(out),
        per_channel=per_channel,
        reduce_range=reduce_range,
        weight_type=QuantType.QInt8,
        # Shape inference cannot type the outputs of some exported MatMuls; they are all float32.
        extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    return out


def quantize_blockwise(model: Path, out: Path, block: int = 32) -> Path:
    """Write a copy of `model` whose MatMul weights are int8 in blocks of `block` (MatMulNBits), and whose
    lookup tables are int8 rows, to `out`."""
    config = matmul_nbits_quantizer.DefaultWeightOnlyQuantConfig(
        block_size=block, is_symmetric=True, accuracy_level=4, bits=8
    )
    quantizer = matmul_nbits_quantizer.MatMulNBitsQuantizer(
        onnx.load(str(model)),
        bits=8,
        block_size=block,
        is_symmetric=True,
        accuracy_level=4,
        algo_config=config,
    )
    quantizer.process()
    quantized = quantizer.model.model
    int8.int8_tables(quantized, int8.tables(quantized))  # in place
    quantizer.model.save_model_to_file(str(out), use_external_data_format=graphs.too_big(quantized))
    return out
