"""Sizing from the machine: a container's CPU quota caps the cores hare plans its streams for."""

from __future__ import annotations

from pathlib import Path

import pytest

from container.machine import cpu_quota, physical_cores


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
