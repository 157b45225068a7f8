"""Where a GPU bundle's batch-1 time goes (run by scripts/gpu-check on the device machine, after a build).

For each bundle given: which execution provider each graph node ran on (ORT's profiler), and the model-only
median of 200 calls after 20 warm-ups at (batch, tokens) = (1, 16), (1, 128), (8, 128), three ways:
- `run`: what hare does (numpy in, numpy out, a host-device copy each way);
- `iobinding`: inputs copied to the GPU once, output left on the GPU (the copies' share);
- `cuda-graph`: ORT's CUDA graph capture, one session per shape (the kernel launches' share).

    python scripts/gpu-probe.py /tmp/bundle-minilm [/tmp/bundle-distilbert ...]
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.stats import median_call_seconds

SHAPES = [(1, 16), (1, 128), (8, 128), (32, 128)]
CUDA = "CUDAExecutionProvider"


def feeds(session: ort.InferenceSession, batch: int, tokens: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(0).integers(1000, 2000, (batch, tokens), dtype=np.int64)
    values = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    return {i.name: values[i.name] for i in session.get_inputs()}


def placement(model: Path) -> dict[str, int]:
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = "/tmp/probe"
    session = ort.InferenceSession(str(model), options, providers=[(CUDA, {"use_tf32": "0"}), "CPUExecutionProvider"])
    session.run(None, feeds(session, 1, 128))
    events = json.loads(Path(session.end_profiling()).read_text())
    count: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            count[f"{e['args'].get('provider', '?')}:{e['args'].get('op_name', '?')}"] += 1
    return dict(sorted(count.items()))


def probe(bundle: Path) -> None:
    manifest = json.loads((bundle / "hare.json").read_text())
    model = bundle / "model.onnx"
    print(f"\n## {bundle.name}: {manifest['variant']} ({manifest['architecture']})")
    print("nodes per provider:op at (1, 128):", placement(model))
    cuda = [(CUDA, {"use_tf32": "0"}), "CPUExecutionProvider"]
    plain = ort.InferenceSession(str(model), providers=cuda)
    output = plain.get_outputs()[0].name
    for batch, tokens in SHAPES:
        row = shape_row(model, plain, output, batch, tokens)
        print(f"  ({batch}, {tokens}) median ms: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))


def shape_row(model: Path, plain: ort.InferenceSession, output: str, batch: int, tokens: int) -> dict[str, float]:
    x = feeds(plain, batch, tokens)
    row = {"run": median_call_seconds(lambda: plain.run([output], x)) * 1000}
    binding = plain.io_binding()
    for name, value in x.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    binding.bind_output(output, "cuda")
    row["iobinding"] = median_call_seconds(lambda: plain.run_with_iobinding(binding)) * 1000
    try:
        graph = ort.InferenceSession(str(model), providers=[(CUDA, {"use_tf32": "0", "enable_cuda_graph": "1"})])
        gbinding = graph.io_binding()
        for name, value in x.items():
            gbinding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
        # hare's GPU graphs keep fp32 outputs (the fp16 chain casts back)
        shape = plain.run([output], x)[0].shape
        gbinding.bind_ortvalue_output(output, ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, "cuda", 0))
        row["cuda-graph"] = median_call_seconds(lambda: graph.run_with_iobinding(gbinding)) * 1000
    except Exception as exc:  # the capture refuses graphs with CPU nodes or dynamic allocations
        print(f"  cuda graph at ({batch}, {tokens}): {type(exc).__name__}: {str(exc)[:300]}")
    return row


if __name__ == "__main__":
    print("onnxruntime", ort.__version__, ort.get_device())
    for arg in sys.argv[1:]:
        probe(Path(arg))
