"""Sizing from the machine: a container's CPU quota caps the cores hare plans its streams for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from container import machine
from container.machine import (
    FULL_LEVELS,
    NARROW_LEVELS,
    cpu_quota,
    int8_path,
    memory_room,
    physical_cores,
    weight_levels,
)


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


def test_the_memory_left_is_the_cgroups_where_it_has_a_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a container /proc/meminfo shows the host's memory: the cgroup's limit less its use is what is left."""
    monkeypatch.setattr(machine, "available_bytes", lambda: 64 * 2**30)
    assert memory_room(tmp_path) == 64 * 2**30  # no cgroup files: the machine's
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text(f"{2**30}\n")
    assert memory_room(tmp_path) == 64 * 2**30  # no limit
    (tmp_path / "memory.max").write_text(f"{4 * 2**30}\n")
    assert memory_room(tmp_path) == 3 * 2**30
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")  # v1's "no limit"
    (v1 / "memory.usage_in_bytes").write_text(f"{2**30}\n")
    assert memory_room(tmp_path / "v1") == 64 * 2**30
    (v1 / "memory.limit_in_bytes").write_text(f"{2 * 2**30}\n")
    assert memory_room(tmp_path / "v1") == 2**30
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


# /proc/cpuinfo as two CPUs of the pool write it (one logical CPU each, flags cut to a realistic few).
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7763 64-Core Processor
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx avx2 bmi2 sha_ni vaes vpclmulqdq
"""
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""


@pytest.mark.parametrize(
    ("cpuinfo", "cpu", "path", "levels"),
    [
        (ZEN3, "AMD EPYC 7763 64-Core Processor", "avx2", NARROW_LEVELS),
        (SAPPHIRE_RAPIDS, "Intel(R) Xeon(R) Platinum 8480+", "amx", FULL_LEVELS),
    ],
)
def test_the_int8_path_and_its_weight_levels_come_from_proc_cpuinfo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpuinfo: str, cpu: str, path: str, levels: int
) -> None:
    """What a bundle built on that CPU records (its int8 path, hence the weight levels it is built with),
    read from the text the kernel gives, not from this machine."""
    fake = tmp_path / "cpuinfo"
    fake.write_text(cpuinfo)
    monkeypatch.setattr(machine, "Path", lambda p: fake if str(p) == "/proc/cpuinfo" else Path(p))
    here = machine.cpu_record.__wrapped__()  # cpu_record() (describe()'s CPU part) is cached for this machine
    assert (here["cpu"], here["int8_path"]) == (cpu, path)
    assert weight_levels(here["int8_path"]) == levels
    assert set(here["flags"]) <= set(cpuinfo.split()) and "avx2" in here["flags"]


def test_reading_the_cpu_runs_no_other_program() -> None:
    """Every worker reads its CPU at start (same_cpu): platform.processor() ran `uname -p` there, a process more
    in the server's group while it started (a test counting a two-worker server's processes found three)."""
    code = (
        "import sys; runs = []; sys.addaudithook(lambda event, args: runs.append(event) if event in "
        "('subprocess.Popen', 'os.fork', 'os.posix_spawn') else None); from container import machine; "
        "machine.cpu_record(); print(runs)"
    )
    root = Path(__file__).resolve().parents[1]
    ran = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "[]", ran.stdout


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
    here = machine.describe()["int8_path"]
    assert np.array_equal(_matmul_integer(a, b), exact) == (levels <= weight_levels(here))


def test_a_run_names_its_gpus_with_their_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "NVIDIA H200, 580.95.05, 143771 MiB"\necho "NVIDIA H200, 580.95.05, 143771 MiB"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert machine.gpus() == ["NVIDIA H200 (driver 580.95.05, 143771 MiB)"] * 2
    line = machine.machine_line({"cpu": "Xeon", "physical_cores": 16, "logical_cores": 32, "gpus": machine.gpus()})
    assert line.endswith(
        "; GPU NVIDIA H200 (driver 580.95.05, 143771 MiB); GPU NVIDIA H200 (driver 580.95.05, 143771 MiB)"
    )
    smi.write_text("#!/bin/sh\nexit 9\n")  # a driver that fails: no GPU named, no crash
    assert machine.gpus() == []
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert machine.gpus() == []
