"""Token states pooled where they are, on the device: small ONNX graphs run after the model on its bound
output, so that a GPU batch of embeddings sends back one vector per sequence (384 floats for MiniLM) instead
of its token states (128 x 384 at 128 tokens), and the host does not pool them.

    states [B, L, H] (the model's output dtype) ──┐
    attention_mask [B, L] (int64) ────────────────┴─> pooled [B, H] float32

One file per pooling and output dtype (`path`), built by `build` with the `onnx` package (the optimizer's
extra) and kept in container/poolers/, since serving does not install `onnx`; tests/test_cudagraphs.py checks the
files equal what `build` makes and their answers equal tasks/ops.py pool_tokens. Poolings without a file
here are pooled on the host, as before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FOLDER = Path(__file__).resolve().parent / "poolers"
POOLINGS = ("mean", "cls")  # the ones with a device graph
DTYPES = ("float32", "float16")  # the model output's


def path(pooling: str, dtype: str) -> Path | None:
    """The pooler file for a pooling of token states of `dtype` (numpy's name), or None where there is none."""
    if pooling not in POOLINGS or dtype not in DTYPES:
        return None
    return FOLDER / f"{pooling}-{dtype}.onnx"


def build(pooling: str, dtype: str) -> bytes:
    """The pooler graph's bytes (opset 17): masked mean (the mask's sum as the count, as pool_tokens over
    the sequence's own tokens) or the first token's state, in float32."""
    from onnx import TensorProto, helper, numpy_helper  # the optimizer's extra; serving reads the files

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    states = helper.make_tensor_value_info("states", elem, ["batch", "tokens", "hidden"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])
    pooled = helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", "hidden"])
    nodes = [helper.make_node("Cast", ["states"], ["states_f"], to=TensorProto.FLOAT)]
    consts = []
    if pooling == "mean":
        consts = [
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
            numpy_helper.from_array(np.array([2], np.int64), "axis2"),
        ]
        nodes += [
            helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["mask_f", "axis2"], ["mask_3d"]),
            helper.make_node("Mul", ["states_f", "mask_3d"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
            helper.make_node("ReduceSum", ["mask_f", "axis1"], ["count"], keepdims=1),
            helper.make_node("Div", ["summed", "count"], ["pooled"]),
        ]
    elif pooling == "cls":
        consts = [numpy_helper.from_array(np.array(0, np.int64), "first")]
        nodes += [helper.make_node("Gather", ["states_f", "first"], ["pooled"], axis=1)]
    else:
        raise ValueError(f"no device pooler for {pooling!r}; there are {', '.join(POOLINGS)}")
    graph = helper.make_graph(nodes, f"hare-pool-{pooling}", [states, mask], [pooled], initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="hare")
    model.ir_version = 8
    return bytes(model.SerializeToString())


def main() -> None:
    """Write every pooler file (python -m container.pooling, after a change to `build`)."""
    for pooling in POOLINGS:
        for dtype in DTYPES:
            target = path(pooling, dtype)
            assert target is not None
            target.write_bytes(build(pooling, dtype))
            print(target)


if __name__ == "__main__":
    main()
