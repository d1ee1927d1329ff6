"""The worker's throughput figure: measured in a child process, cached per worker version and hardware,
re-measured when either changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from intellect.wire.nodes import ComputeSpecs, NodeMetadata
from worker.benchmark import CACHE_FILE, _fingerprint, measured_throughput

SPECS = ComputeSpecs(cpu_model="test-cpu", cpu_cores=2, ram_mb=4000, disk_free_mb=1000)


@pytest.mark.slow
def test_the_figure_is_cached_per_version_and_hardware_and_measured_again_otherwise(tmp_path: Path) -> None:
    (tmp_path / CACHE_FILE).write_text(json.dumps({"fingerprint": _fingerprint(SPECS, "1.0"),
                                                   "tokens_per_second": 12345.0}))  # fmt: skip
    assert measured_throughput(tmp_path, SPECS, "1.0") == 12345.0  # cached: no run
    fresh = measured_throughput(tmp_path, SPECS, "2.0")  # another version: a real run of the tiny model
    assert fresh is not None and 0 < fresh != 12345.0
    saved = json.loads((tmp_path / CACHE_FILE).read_text())
    assert saved["fingerprint"] == _fingerprint(SPECS, "2.0") and saved["tokens_per_second"] == fresh


def test_metadata_carries_the_figure_and_bounds_it() -> None:
    base = {"node_address": "0x" + "11" * 20, "provider_address": "0x" + "22" * 20, "ip_address": "10.0.0.1",
            "port": 8000, "compute_specs": SPECS.model_dump()}  # fmt: skip
    assert NodeMetadata.model_validate(base | {"throughput": 812.5}).throughput == 812.5
    for bad in (-1, 1e12):
        with pytest.raises(ValueError):
            NodeMetadata.model_validate(base | {"throughput": bad})


@pytest.mark.slow
def test_a_stopping_daemon_kills_a_benchmark_still_running(tmp_path: Path) -> None:
    """Cancelled (the daemon stops), the child is killed at once: a stop never waits for a benchmark."""
    import asyncio
    import time

    import psutil

    from worker.benchmark import measure_async

    async def cancel_soon() -> float:
        task = asyncio.create_task(measure_async(tmp_path, SPECS, "3.0"))
        await asyncio.sleep(1.0)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    assert asyncio.run(cancel_soon()) < 5
    left = [p for p in psutil.process_iter(["cmdline"])
            if "worker.benchmark" in " ".join(p.info["cmdline"] or [])]
    assert left == [] and not (tmp_path / CACHE_FILE).exists()
