"""Hardware and software detection: GPUs (NVML, then nvidia-smi), CPU, RAM, free disk, Docker engine."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil

from intellect.wire.nodes import ComputeSpecs, GpuSpec
from intellect.wire.requirements import PoolRequirements


def _gpus_nvml() -> list[GpuSpec] | None:
    """GPUs through NVML, or None when the library or driver is absent."""
    try:
        import pynvml  # type: ignore[import-not-found]  # optional: the `gpu` extra (nvidia-ml-py)
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            memory_mb = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024))
            found.append((name, memory_mb))
        return group_gpus(found)
    finally:
        pynvml.nvmlShutdown()


def parse_nvidia_smi(output: str) -> list[GpuSpec]:
    """Parse `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`."""
    found = []
    for line in output.splitlines():
        if not line.strip():
            continue
        name, _, memory = line.rpartition(",")
        try:
            found.append((name.strip(), int(float(memory.strip()))))
        except ValueError:
            continue
    return group_gpus(found)


def group_gpus(found: list[tuple[str, int]]) -> list[GpuSpec]:
    """One GpuSpec per (model, memory) with its count, in first-seen order."""
    counts = Counter(found)
    return [GpuSpec(model=name, count=n, memory_mb=mem) for (name, mem), n in counts.items()]


def _gpus_nvidia_smi(binary: str = "nvidia-smi") -> list[GpuSpec]:
    path = shutil.which(binary)
    if not path:
        return []
    try:
        out = subprocess.run(
            [path, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return parse_nvidia_smi(out)


def detect_gpus() -> list[GpuSpec]:
    nvml = _gpus_nvml()
    return nvml if nvml is not None else _gpus_nvidia_smi()


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def docker_reachable(timeout: float = 2.0) -> bool:
    """True when a Docker engine answers a ping (DOCKER_HOST or the default socket): what the machine
    check reports, and how `auto` picks the Docker runtime."""
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def detect(storage_path: Path) -> ComputeSpecs:
    """What this machine offers; `storage_path` is where task data goes (its filesystem's free space)."""
    storage_path.mkdir(parents=True, exist_ok=True)
    return ComputeSpecs(
        gpus=detect_gpus(),
        cpu_model=cpu_model(),
        cpu_cores=os.cpu_count() or 1,
        ram_mb=int(psutil.virtual_memory().total // (1024 * 1024)),
        disk_free_mb=int(shutil.disk_usage(storage_path).free // (1024 * 1024)),
        docker_available=docker_reachable(),
    )


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    blocking: bool = True


def run_checks(specs: ComputeSpecs, requirements: PoolRequirements | None, min_disk_mb: int) -> list[Check]:
    """Hardware/software checks; a failed blocking check stops `start` and fails `check`. With a pool's
    requirements, each row (gpu, cpu, ram, disk, docker) is judged against its own part of them."""
    req = requirements or PoolRequirements()
    gpus = ", ".join(f"{g.count}x {g.model} ({g.memory_mb} MB)" for g in specs.gpus) or "none"

    def row(name: str, have: str, part: PoolRequirements, ok: bool = True, blocking: bool = True) -> Check:
        problems = part.mismatches(specs)  # only `part`'s own field is set: this row's mismatch
        detail = "; ".join([have, *problems])
        return Check(name, ok and not problems, detail, blocking=blocking or bool(problems))

    disk_need = max(min_disk_mb, req.disk_free_mb)
    return [
        row("gpu", gpus, PoolRequirements(gpu=req.gpu), blocking=False),
        row("cpu", f"{specs.cpu_cores} cores, {specs.cpu_model or 'unknown model'}",
            PoolRequirements(cpu_cores=req.cpu_cores), ok=specs.cpu_cores >= 1),
        row("ram", f"{specs.ram_mb} MB", PoolRequirements(ram_mb=req.ram_mb), ok=specs.ram_mb > 0),
        row("disk", f"{specs.disk_free_mb} MB free (need >= {disk_need} MB)",
            PoolRequirements(disk_free_mb=req.disk_free_mb), ok=specs.disk_free_mb >= min_disk_mb),
        row("docker", "engine reachable" if specs.docker_available
            else "no engine answered: tasks run with the process runtime",
            PoolRequirements(docker=req.docker), ok=specs.docker_available, blocking=False),
    ]


def blocking_failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.blocking and not c.ok]
