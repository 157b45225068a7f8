"""Sizing from the machine: a container's CPU quota caps the cores hare plans its streams for."""

from __future__ import annotations

from pathlib import Path

import pytest

from container.machine import cpu_quota, describe, int8_path, physical_cores


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
