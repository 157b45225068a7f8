"""What machine this is: recorded in bundles and benchmark runs so that figures name their hardware."""

from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

# The flags that decide which kernels ONNX Runtime can use for int8 and fp16/bf16 work.
INTERESTING_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_int8",
    "asimddp",  # ARM's int8 dot product (SDOT/UDOT)
    "i8mm",  # ARM's int8 matrix multiply (SMMLA)
)

# ONNX Runtime's int8 kernels by what the CPU offers, fastest first: each path rounds and accumulates in
# its own way, so a bundle's int8 error and speed belong to the path it was checked on. On "avx2" (x86
# without VNNI) u8 x s8 products are added in pairs in saturating 16-bit registers.
INT8_PATHS = (
    ("amx", ("amx_int8",)),
    ("avx512-vnni", ("avx512_vnni",)),
    ("avx-vnni", ("avx_vnni",)),
    ("avx512", ("avx512bw",)),
    ("avx2", ("avx2",)),
    ("arm-i8mm", ("i8mm",)),
    ("arm-dotprod", ("asimddp",)),
)
# The paths whose u8 x s8 kernel adds products in pairs in saturating 16-bit registers (vpmaddubsw): an
# activation of 255 against weights of 127 overflows 32767. Weights kept to 64 levels a side (ONNX Runtime's
# `reduce_range`) cannot overflow there (255 x 64 x 2 = 32640), and their integer sums are exact on every path.
SATURATING_PATHS = ("avx512", "avx2")
FULL_LEVELS, NARROW_LEVELS = 127, 64


def weight_levels(path: str) -> int:
    """The int8 weight levels a side that the int8 `path` computes exactly: narrow where products saturate."""
    return NARROW_LEVELS if path in SATURATING_PATHS else FULL_LEVELS


CGROUP = Path("/sys/fs/cgroup")


def cpu_quota(root: Path = CGROUP) -> int | None:
    """CPUs the cgroup lets this process use (`docker run --cpus`, a Kubernetes CPU limit), rounded up; None
    when there is no limit. Without this a 2-CPU pod on a 64-core node would size itself for 64 cores."""
    try:
        fields = (root / "cpu.max").read_text().split()  # cgroup v2: "max 100000" or "200000 100000"
    except OSError:
        try:  # cgroup v1
            fields = [(root / "cpu" / f"cpu.cfs_{k}_us").read_text().strip() for k in ("quota", "period")]
        except OSError:
            return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except (ValueError, IndexError):  # "max", or a format this code does not know: no limit
        return None
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None


def memory_room(root: Path = CGROUP) -> int:
    """Bytes this process's memory may still grow by: the machine's MemAvailable, and within a cgroup's memory
    limit (`docker run --memory`, a Kubernetes limit: /proc/meminfo shows the host's) what the cgroup has not
    used; 0 where neither is known."""
    room = available_bytes()
    for limit, used in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            cap, now = int((root / limit).read_text()), int((root / used).read_text())
        except (OSError, ValueError):  # "max" (no limit), or no such cgroup version here
            continue
        if cap < 2**60:  # cgroup v1 writes an unlimited cap as a huge number
            room = min(room, cap - now) if room else cap - now
        break
    return max(room, 0)


@cache
def usable_cpus() -> int:
    """Logical CPUs (hyper-threads too) this process may run on, within its cgroup's CPU quota."""
    usable = len(os.sched_getaffinity(0))
    quota = cpu_quota()
    return usable if quota is None else min(usable, quota)


@cache
def physical_cores() -> int:
    """Physical cores (not hyper-threads) this process may use, within its cgroup's CPU quota: the serving
    default is one model stream each."""
    usable = usable_cpus()
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return usable
    cores: set[tuple[str, str]] = set()
    phys = core = ""
    for line in cpuinfo.read_text().splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "physical id":
            phys = value
        elif key == "core id":
            core = value
            cores.add((phys, core))
    return max(1, min(usable, len(cores) or usable))


@cache
def describe() -> dict[str, Any]:
    """The record a build or a bench run keeps of its machine: the CPU (cpu_record) and the GPUs."""
    return cpu_record() | {"gpus": gpus()}


@cache
def cpu_record() -> dict[str, Any]:
    """CPU model, core counts and the instruction-set flags that matter for inference: what a worker compares
    with its bundle's record at start (same_cpu, int8_check), without asking for the GPUs. The model is
    /proc/cpuinfo's, else the architecture: never platform.processor() or platform.platform(), which run
    `uname -p` on Linux, a process more in every worker's start (a test counting a two-worker server's processes
    saw three)."""
    model, flags = platform.machine(), set[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    kept = [f for f in INTERESTING_FLAGS if f in flags]
    return {
        "cpu": model,
        "logical_cores": len(os.sched_getaffinity(0)),
        "physical_cores": physical_cores(),
        "flags": kept,
        "int8_path": int8_path(kept),
        "platform": os_name(),
    }


def gpus() -> list[str]:
    """Each NVIDIA GPU as nvidia-smi names it, with its driver and memory ([] where there is none)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        listed = subprocess.run([smi, *query], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    named = []
    for line in listed.splitlines():
        name, driver, memory = ([*map(str.strip, line.split(",")), "", ""])[:3]
        if name:
            named.append(f"{name} (driver {driver}, {memory})")
    return named


def machine_line(machine: dict[str, Any]) -> str:
    """A stored run's machine (describe()'s record) in one line, as every report shows it."""
    m = machine
    line = (
        f"{m.get('cpu', '?')}, {m.get('physical_cores', '?')} physical / {m.get('logical_cores', '?')} logical "
        f"cores, int8 path {m.get('int8_path', '?')}, flags {' '.join(m.get('flags', [])) or '-'}"
    )
    return line + "".join(f"; GPU {g}" for g in m.get("gpus", []))


def os_name() -> str:
    """The system as platform.platform() names it on Linux ("Linux-6.8.0-x86_64-with-glibc2.36"), less the
    processor, which it asks `uname -p` for (cpu_record)."""
    system, _, release, _, arch = os.uname()
    libc = "".join(platform.libc_ver())
    return "-".join((system, release, arch, *(("with", libc) if libc else ())))


def int8_path(flags: list[str]) -> str:
    """The int8 kernel path a CPU with these flags takes (INT8_PATHS), or "generic"."""
    return next((name for name, needs in INT8_PATHS if all(f in flags for f in needs)), "generic")


def same_cpu(record: dict[str, Any]) -> bool:
    """Whether `record` (a describe() kept in a bundle) names this machine's CPU model and physical cores:
    what a measurement made there, such as a batch budget, depends on."""
    here = cpu_record()
    return record.get("cpu") == here["cpu"] and record.get("physical_cores") == here["physical_cores"]


def int8_check(record: dict[str, Any], levels: int = FULL_LEVELS) -> dict[str, Any]:
    """Where a bundle's variants were checked and timed (`record`: its manifest's machine) against this CPU:
    both int8 paths, whether they are the same, and whether this CPU adds the bundle's int8 weights (`levels`
    a side) without saturating. A bundle's int8 speed belongs to the path its autotune ran on; its error too,
    unless both paths add its products exactly (x86 int8 sums are integers: then the answers are the same).
    A bundle built before hare recorded the path reads it from the flags kept."""
    built = record.get("int8_path") or int8_path(list(record.get("flags", [])))
    here = cpu_record()["int8_path"]
    exact = levels <= weight_levels(built) and levels <= weight_levels(here)
    return {"checked_on": built, "serving_on": here, "same": built == here, "levels": levels, "exact": exact}


def versions(packages: Sequence[str]) -> dict[str, str]:
    """Python's version and each of `packages` that is installed, with its version: recorded beside the
    machine in bundles, benchmark runs and /info, so that figures name their software too."""
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (0 where there is none: no cap)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
