"""Sizing from the machine: a container's CPU quota caps the cores hare plans its streams for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from container.machine import FULL_LEVELS, NARROW_LEVELS, cpu_quota, describe, int8_path, physical_cores, weight_levels


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("max 100000\n", None), ("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1)],
)
def test_a_cgroup_v2_quota_is_read_in_whole_cpus(tmp_path: Path, cpu_max: str, expected: int | None) -> None:
    (tmp_path / "cpu.max").write_text(cpu_max)
    assert cpu_quota(tmp_path) == expected


def test_a_cgroup_v1_quota_is_read_and_minus_one_means_no_limit(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    assert cpu_quota(tmp_path) == 4
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(tmp_path) is None


def test_no_cgroup_files_means_no_limit(tmp_path: Path) -> None:
    assert cpu_quota(tmp_path) is None
    assert physical_cores() >= 1


@pytest.mark.parametrize(
    ("flags", "path"),
    [
        (["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_int8"], "amx"),  # Intel Xeon (Sapphire Rapids)
        (["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"], "avx512-vnni"),  # AMD EPYC Zen 4
        (["avx2", "fma", "avx_vnni"], "avx-vnni"),  # Intel client cores (Alder Lake)
        (["avx2", "fma"], "avx2"),  # AMD EPYC Zen 2/3: u8 x s8 pairs add in saturating 16-bit registers
        (["asimddp", "i8mm"], "arm-i8mm"),
        ([], "generic"),
    ],
)
def test_the_int8_path_names_the_kernels_a_cpu_takes(flags: list[str], path: str) -> None:
    assert int8_path(flags) == path


def test_this_machine_records_its_int8_path() -> None:
    here = describe()
    assert here["int8_path"] == int8_path(here["flags"])


def _matmul_integer(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """u8 [M, K] x s8 [K, N] in int32 on this CPU's int8 kernel, as dynamic int8's MatMulInteger runs it."""
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "mmi",
        [
            helper.make_tensor_value_info("a", TensorProto.UINT8, list(a.shape)),
            helper.make_tensor_value_info("b", TensorProto.INT8, list(b.shape)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["y"], {"a": a, "b": b})[0])


@pytest.mark.parametrize("levels", [FULL_LEVELS, NARROW_LEVELS])
def test_int8_weights_of_the_levels_this_cpu_is_given_add_up_exactly(levels: int) -> None:
    """The worst case for a 16-bit pair sum (every activation 255, every weight at the top level) against
    exact integers: the levels weight_levels gives this CPU's int8 path are exact here, and narrow weights
    are exact on every path. Full-range weights overflow where the table says the kernel saturates (x86
    without VNNI): if this CPU's kernel did not, the table would narrow its weights for nothing."""
    rng = np.random.default_rng(0)
    a = np.full((8, 64), 255, np.uint8)
    a[1::2] = rng.integers(0, 256, (4, 64), dtype=np.uint8)
    b = np.full((64, 16), levels, np.int8)
    b[:, 8:] = rng.integers(-levels, levels + 1, (64, 8), dtype=np.int8)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    here = describe()["int8_path"]
    assert np.array_equal(_matmul_integer(a, b), exact) == (levels <= weight_levels(here))
