from __future__ import annotations

import os
import stat
from pathlib import Path

import psutil
import pytest

from intellect.wire.nodes import ComputeSpecs, GpuSpec
from intellect.wire.requirements import parse_pool_requirements
from worker import hardware
from worker.hardware import blocking_failures, detect, parse_nvidia_smi, run_checks


def test_detect_reports_this_machine(tmp_path: Path) -> None:
    specs = detect(tmp_path / "data")
    assert specs.cpu_cores == os.cpu_count()
    assert abs(specs.ram_mb - psutil.virtual_memory().total // 2**20) <= 1
    assert 0 < specs.disk_free_mb <= psutil.disk_usage(str(tmp_path)).total // 2**20
    assert isinstance(specs.docker_available, bool)
    assert (tmp_path / "data").is_dir()


def test_parse_nvidia_smi_groups_identical_gpus() -> None:
    out = "NVIDIA H100 80GB HBM3, 81559\nNVIDIA H100 80GB HBM3, 81559\nNVIDIA A10, 23028\n\ngarbage line\n"
    gpus = parse_nvidia_smi(out)
    assert gpus == [
        GpuSpec(model="NVIDIA H100 80GB HBM3", count=2, memory_mb=81559),
        GpuSpec(model="NVIDIA A10", count=1, memory_mb=23028),
    ]


def test_nvidia_smi_fallback_runs_the_binary_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU can exist here: a stand-in nvidia-smi on PATH is the one boundary we fake.
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA A100-SXM4-80GB, 81920'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(hardware, "_gpus_nvml", lambda: None)
    assert hardware.detect_gpus() == [GpuSpec(model="NVIDIA A100-SXM4-80GB", count=1, memory_mb=81920)]


def test_no_gpu_tooling_means_no_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(hardware, "_gpus_nvml", lambda: None)
    assert hardware.detect_gpus() == []


def _specs(**kw: object) -> ComputeSpecs:
    base = {"cpu_cores": 2, "ram_mb": 24000, "disk_free_mb": 50000, "docker_available": False}
    return ComputeSpecs(**(base | kw))


def test_checks_explain_pool_mismatch() -> None:
    reqs = parse_pool_requirements(
        '{"requirements": {"gpu": {"count": 2, "memory_mb": 40000}, "ram_mb": 32000}}'
    )
    checks = run_checks(_specs(), reqs, min_disk_mb=1024)
    failed = blocking_failures(checks)
    assert [c.name for c in failed] == ["gpu", "ram"]  # each row names its own mismatch
    assert "GPU" in failed[0].detail and "RAM" in failed[1].detail and "RAM" not in failed[0].detail


def test_checks_pass_and_docker_is_only_a_warning() -> None:
    checks = run_checks(_specs(), parse_pool_requirements('{"cpu_cores": 1}'), min_disk_mb=1024)
    assert blocking_failures(checks) == []
    docker = next(c for c in checks if c.name == "docker")
    assert not docker.ok and not docker.blocking and "process runtime" in docker.detail


def test_low_disk_blocks() -> None:
    failed = blocking_failures(run_checks(_specs(disk_free_mb=10), None, min_disk_mb=1024))
    assert [c.name for c in failed] == ["disk"]
