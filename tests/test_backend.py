"""The model backend on a real session of a tiny model: one row per sequence, token-level rows trimmed back to
each sequence, unknown tokens counted, every width answering the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from api.engine.backend import Backend
from container.bundle import MODEL_FILE, TOKENIZER_FILE, read_manifest
from tasks.ops import pool_tokens
from tests.conftest import ModelFactory


def test_rows_come_back_per_sequence_trimmed_and_the_same_at_every_width(tiny_bundle: ModelFactory) -> None:
    bundle = tiny_bundle("feature-extraction")
    manifest = read_manifest(bundle)
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    unknown: list[int] = []
    unk_id = tokenizer.token_to_id("[UNK]")
    backend = Backend(
        bundle / MODEL_FILE, "cpu", (1, 2), manifest.output, unk_id, unknown.append, max_length=manifest.max_length
    )
    batch = tokenizer.encode_batch(["a short one", "a somewhat longer sentence than the first", "\u2603"])
    narrow, wide = backend.run(batch, 1), backend.run(batch, 2)
    assert backend.widths == (1, 2)
    assert [r.shape[0] for r in narrow] == [len(e) for e in batch]  # padding trimmed off each sequence
    for a, b in zip(narrow, wide, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)
    # Alone, a sequence gives the rows it gave inside the padded batch (up to dynamic int8's batch-wide scale).
    np.testing.assert_allclose(backend.run(batch[:1])[0], narrow[0], atol=2e-3)
    assert unknown == [1, 1]  # the snowman is one [UNK] in each run that carried it


def test_a_pooled_batch_comes_back_as_one_vector_per_sequence_as_post_processing_pools_it(
    tiny_bundle: ModelFactory,
) -> None:
    bundle = tiny_bundle("feature-extraction")
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    manifest = read_manifest(bundle)
    backend = Backend(bundle / MODEL_FILE, "cpu", (1,), manifest.output, max_length=manifest.max_length)
    batch = tokenizer.encode_batch(["a short one", "a somewhat longer sentence than the first"])
    states = backend.run(batch)
    for pooling in ("mean", "cls", "max", "lasttoken"):
        pooled = backend.run(batch, pooling=pooling)
        assert [v.shape for v in pooled] == [(states[0].shape[1],)] * 2
        for vector, rows in zip(pooled, states, strict=True):  # padding left out, as pool_tokens is given it
            np.testing.assert_array_equal(vector, pool_tokens(rows, pooling))


def test_cpu_sessions_keep_the_residual_add_apart_from_its_layer_norm(tmp_path: Path) -> None:
    """ORT would fuse Add + LayerNormalization into SkipLayerNormalization at load, whose CPU kernel is several
    times slower than the pair (container/runtime.py): a CPU session runs the pair, with the same answer."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from container.runtime import session_options

    width = 64
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "skip"], ["sum"]),
            helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
        ],
        "residual",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 8, width]) for name in ("x", "skip")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, width])],
        [
            numpy_helper.from_array(np.linspace(0.5, 1.5, width, dtype=np.float32), "gamma"),
            numpy_helper.from_array(np.linspace(-0.1, 0.1, width, dtype=np.float32), "beta"),
        ],
    )
    path = tmp_path / "residual.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal((1, 8, width)).astype(np.float32) for name in ("x", "skip")}

    def kernels(options: ort.SessionOptions) -> tuple[list[str], np.ndarray]:
        options.enable_profiling = True
        options.profile_file_prefix = str(tmp_path / "profile")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        (out,) = session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
        ops = [e["args"]["op_name"] for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
        return ops, out

    ours, answer = kernels(session_options(1))
    plain, fused = kernels(ort.SessionOptions())
    assert plain == ["SkipLayerNormalization"]  # what ORT does by itself, so the test can tell the two apart
    assert sorted(ours) == ["Add", "LayerNormalization"]
    assert np.abs(answer - fused).max() < 1e-5


def test_trim_malloc_gives_back_the_free_pages_in_the_middle_of_the_heap() -> None:
    """A worker trims malloc's heaps once its model is compiled and warmed (api/web/app.py): what that freed sits
    under blocks still in use, where glibc's own trim (the heap's top only) never reaches, and stayed in the
    worker's RSS for good (10 MB of the default MiniLM's worker). In a fresh process, 50 MB of such pages."""
    script = """
import ctypes
from container.runtime import trim_malloc
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
blocks = [libc.malloc(64 * 1024) for _ in range(800)]  # under glibc's mmap threshold: in the heap
for block in blocks:
    ctypes.memset(block, 1, 64 * 1024)
for block in blocks[:-1]:  # the last one in use keeps the heap's top
    libc.free(block)
before = rss()
trim_malloc()
print(before - rss())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout) > 30, done.stdout
