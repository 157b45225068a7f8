"""CUDA graphs for a GPU bundle: one graph captured per padded batch shape, then replayed.

On a GPU a small batch's time is mostly the host launching a hundred-odd kernels, one by one: MiniLM at
(1, 128) took 0.55-0.77 ms in a plain ORT run on an H200 and 0.19 ms replayed from a CUDA graph (issue 47,
scripts/gpu-probe.py). A graph fixes its shapes and the addresses of its inputs and output, so each shape
gets its own buffers on the device, bound once; a call pads its batch up to the smallest shape that holds
it (rows with a copy of its first sequence, columns with padding masked out), copies its ids in, replays
and reads the rows it asked for back. ONNX Runtime keeps one graph per `gpu_graph_id` in one session
(captured on that id's first runs); runs with id -1 are plain runs, for batches no shape holds.

Shapes stop at GRAPH_TOKENS padded tokens: a captured graph keeps its activations' memory for good, and a
batch that big spends its time in the kernels, not in launching them. A call for token states at a shape
whose output passes GRAPH_OUTPUT_BYTES runs plainly: reading a graph's bound output back is slower than a
plain run's copy for big outputs (measured on an H200, MiniLM's token states: graphed 0.35 against 0.61 ms
at (1, 128), 0.90 against 1.00 at (8, 128), 1.6 MB, but 6.4 against 2.1 ms at (32, 128), 6.3 MB).

A call for pooled embeddings (`run(feeds, pooling)`, a pooling container/pooling.py has a graph for) reads
nothing of the token states back: a small pooler session runs on the graph's bound output where it lies,
and only [sequences, dim] floats come back, at every shape.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from container.pooling import path as pooler_file
from container.runtime import InferenceFailed, OnnxModel

if TYPE_CHECKING:  # imported where a CUDA graph is made: a worker serving OpenVINO never loads ONNX Runtime
    import onnxruntime as ort

Shape = tuple[int, int]  # (sequences, tokens)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
LENGTHS = (16, 32, 64, 128, 256, 512)
GRAPH_TOKENS = 4096
GRAPH_OUTPUT_BYTES = 2 << 20
_NUMPY = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}  # the inputs' types
_FLOATS = {"tensor(float)": "float32", "tensor(float16)": "float16"}  # the output's, as container/pooling names them


def graph_shapes(max_batch_size: int, max_batch_tokens: int, max_length: int) -> list[Shape]:
    """The padded shapes worth a graph: batches of at most `max_batch_size` sequences, at most `max_length`
    tokens (the longest one is always there), at most min(max_batch_tokens, GRAPH_TOKENS) padded tokens."""
    lengths = sorted({n for n in LENGTHS if n < max_length} | {max_length})
    budget = min(max_batch_tokens, GRAPH_TOKENS)
    return [(b, n) for b in BATCHES if b <= max_batch_size for n in lengths if b * n <= budget]


def pick(shapes: Sequence[Shape], sequences: int, tokens: int) -> Shape | None:
    """The smallest shape (fewest padded tokens) that holds a batch, or None."""
    fits = [s for s in shapes if s[0] >= sequences and s[1] >= tokens]
    return min(fits, key=lambda s: (s[0] * s[1], s[1]), default=None)


def pad_to(feeds: Mapping[str, NDArray[np.int64]], shape: Shape, pad_id: int) -> dict[str, NDArray[np.int64]]:
    """`feeds` (n x length) grown to `shape`: new columns are padding (pad id, masked out); new rows repeat the
    first sequence, a real one, so no row is all padding (a fully masked row can divide by zero in pooling)."""
    out = {}
    for name, value in feeds.items():
        n, length = value.shape
        grown = np.full(shape, pad_id if name == "input_ids" else 0, dtype=value.dtype)
        grown[:n, :length] = value
        grown[n:, :length] = value[0]
        out[name] = grown
    return out


@dataclass(slots=True)
class _Bound:
    inputs: dict[str, ort.OrtValue]
    output: ort.OrtValue
    binding: ort.IOBinding
    options: ort.RunOptions
    slow: bool  # token states read back slower than a plain run's (above GRAPH_OUTPUT_BYTES)
    pooled: dict[str, ort.IOBinding]  # a pooler's binding on this shape's buffers, by pooling


class CudaGraphs:
    """Runs a model's batches through fixed, bound buffers of `shapes` on `device` ("cuda": the model's session
    was made with cuda_graph, and each shape is a captured graph; "cpu": the same path without graphs, for
    tests). One call at a time: a shape's buffers are shared, and a capture must not see other work."""

    def __init__(self, model: OnnxModel, shapes: Sequence[Shape], pad_id: int, device: str = "cuda") -> None:
        self.model = model
        self.session = session = model.session
        self.shapes = list(shapes)
        self._output = model.output
        self._pad_id = pad_id
        self._device = device
        self._types = {i.name: _NUMPY[i.type] for i in session.get_inputs()}
        self._bound: dict[Shape, _Bound] = {}
        import onnxruntime as ort

        self._poolers: dict[str, ort.InferenceSession | None] = {}
        self._plain = ort.RunOptions()
        self._plain.add_run_config_entry("gpu_graph_id", "-1")
        self.lock = threading.Lock()

    @property
    def captured(self) -> list[Shape]:
        return list(self._bound)

    @property
    def states_plainly(self) -> list[Shape]:
        """The captured shapes whose token states are read by a plain run (their output is big)."""
        return [shape for shape, bound in self._bound.items() if bound.slow]

    def capture(self) -> None:
        """Capture every shape now (at start), so no user waits for one."""
        for shape in self.shapes:
            feeds = {n: np.ones(shape, dtype=t) for n, t in self._types.items()}
            with self.lock:
                bound = self._bound.get(shape) or self._bind(shape)
                for _ in range(2):  # ONNX Runtime captures on a shape's first runs and replays from then on
                    self._replay(bound, feeds, shape)

    def run(self, feeds: Mapping[str, NDArray[np.int64]], pooling: str | None = None) -> NDArray[np.float32]:
        """The output for `feeds` (n x length, the session's inputs), through the smallest shape that holds
        them, or a plain run when none does. With `pooling`, token states come back pooled, [n, dim], where a
        pooler graph does it on the shape's buffers (container/pooling.py); otherwise as token states, for
        the caller to pool."""
        n, length = next(iter(feeds.values())).shape
        shape = pick(self.shapes, n, length)
        try:
            feeds = {name: feeds[name] for name in self._types}
            with self.lock:
                bound = None if shape is None else self._bound.get(shape) or self._bind(shape)
                pooler = self._pooler(pooling) if pooling is not None and bound is not None else None
                if bound is None or (bound.slow and pooler is None):
                    (rows,) = self.session.run([self._output], feeds, self._plain)
                    return np.asarray(rows, dtype=np.float32)
                assert shape is not None
                self._replay(bound, feeds, shape)
                if pooler is not None and pooling is not None:
                    return self._pooled(bound, pooler, pooling)[:n]
                rows = bound.output.numpy()  # a copy off a GPU; on a CPU a view of the shared buffer:
                rows = np.array(rows[:n, :length] if rows.ndim > 2 else rows[:n], dtype=np.float32)  # so copy
        except KeyError as exc:
            raise InferenceFailed(f"the graph needs input {exc} that the caller did not build") from exc
        except Exception as exc:  # ORT raises its own untyped errors; keep the message for the operator.
            raise InferenceFailed(f"inference failed: {exc}") from exc
        return rows

    def _replay(self, bound: _Bound, feeds: Mapping[str, NDArray[np.int64]], shape: Shape) -> None:
        """Copy `feeds`, padded to `shape`, into its bound inputs and run (or capture) its graph."""
        for name, value in pad_to(feeds, shape, self._pad_id).items():
            bound.inputs[name].update_inplace(np.ascontiguousarray(value, dtype=self._types[name]))
        self.session.run_with_iobinding(bound.binding, bound.options)

    def _pooler(self, kind: str) -> ort.InferenceSession | None:
        """The session pooling this model's token states by `kind` on its device (None: none can; made once)."""
        if kind not in self._poolers:
            import onnxruntime as ort

            output = next(o for o in self.session.get_outputs() if o.name == self._output)
            found = pooler_file(kind, _FLOATS.get(output.type, ""))
            usable = len(output.shape) == 3 and self._types.get("attention_mask") is np.int64
            device = "CUDAExecutionProvider"
            providers = [device if device in self.session.get_providers() else "CPUExecutionProvider"]
            made = found is not None and usable
            self._poolers[kind] = ort.InferenceSession(str(found), providers=providers) if made else None
        return self._poolers[kind]

    def _pooled(self, bound: _Bound, pooler: ort.InferenceSession, kind: str) -> NDArray[np.float32]:
        """The pooler run on a shape's bound output and mask, where they lie: [shape's rows, dim] back."""
        binding = bound.pooled.get(kind)
        if binding is None:
            binding = bound.pooled[kind] = pooler.io_binding()
            binding.bind_ortvalue_input("states", bound.output)
            binding.bind_ortvalue_input("attention_mask", bound.inputs["attention_mask"])
            binding.bind_output("pooled", "cpu")  # small: straight to the host
        pooler.run_with_iobinding(binding)
        return np.asarray(binding.copy_outputs_to_cpu()[0], dtype=np.float32)

    def _bind(self, shape: Shape) -> _Bound:
        """The buffers of one shape, on the device, bound under their own graph id; the output's shape comes
        from one plain run at that shape."""
        import onnxruntime as ort

        ones = {n: np.ones(shape, dtype=t) for n, t in self._types.items()}
        (probe,) = self.session.run([self._output], ones, self._plain)
        inputs = {n: ort.OrtValue.ortvalue_from_numpy(v, self._device, 0) for n, v in ones.items()}
        output = ort.OrtValue.ortvalue_from_shape_and_type(probe.shape, probe.dtype, self._device, 0)
        binding = self.session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(self._output, output)
        options = ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(len(self._bound) + 1))
        bound = _Bound(inputs, output, binding, options, probe.nbytes > GRAPH_OUTPUT_BYTES, {})
        self._bound[shape] = bound
        return bound
