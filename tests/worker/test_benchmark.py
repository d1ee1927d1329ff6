"""The worker's throughput figure: measured in a child process, cached per worker version and hardware,
re-measured when either changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from intellect.wire.nodes import ComputeSpecs, NodeMetadata
from worker.benchmark import CACHE_FILE, _fingerprint, cached_throughput, measured_throughput, save_throughput

# The measuring child runs at nice 19, so on a machine the suite's other workers keep busy it may take
# longer than the daemon's 180 s: the tests give it room (they check the caching, not the speed).
LOADED = 480.0
SPECS = ComputeSpecs(cpu_model="test-cpu", cpu_cores=2, ram_mb=4000, disk_free_mb=1000)


@pytest.fixture(autouse=True)
def machine_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own machine-wide cache: the user's (or the suite's) figures never leak in."""
    folder = tmp_path / "machine-cache"
    monkeypatch.setenv("INTELLECT_CACHE_DIR", str(folder))
    return folder


def test_workers_of_one_machine_share_the_figure(tmp_path: Path, machine_cache: Path) -> None:
    assert save_throughput(tmp_path / "a", SPECS, "1.0", 500.04) == 500.0
    assert json.loads((machine_cache / CACHE_FILE).read_text())["tokens_per_second"] == 500.0
    assert cached_throughput(tmp_path / "b", SPECS, "1.0") == 500.0  # another worker, nothing measured
    assert json.loads((tmp_path / "b" / CACHE_FILE).read_text())["tokens_per_second"] == 500.0
    assert cached_throughput(tmp_path / "c", SPECS, "1.1") is None  # another version measures again
    other = SPECS.model_copy(update={"cpu_cores": 64})
    assert cached_throughput(tmp_path / "d", other, "1.0") is None  # so does other hardware


@pytest.mark.slow
def test_workers_starting_at_once_measure_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three daemons of one machine start together: one child measures, the others wait and read it."""
    import asyncio

    spawned: list[tuple[str, ...]] = []
    real_exec = asyncio.create_subprocess_exec

    async def counting_exec(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - a spy, the real child runs
        spawned.append(args)
        return await real_exec(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", counting_exec)
    from worker.benchmark import measure_async

    async def three() -> list[float | None]:
        runs = (measure_async(tmp_path / f"w{i}", SPECS, "4.0", timeout=LOADED) for i in range(3))
        return list(await asyncio.gather(*runs))

    values = asyncio.run(three())
    assert len(spawned) == 1, spawned
    assert values[0] is not None and values[0] > 0 and values == [values[0]] * 3


@pytest.mark.slow
def test_the_figure_is_cached_per_version_and_hardware_and_measured_again_otherwise(tmp_path: Path) -> None:
    (tmp_path / CACHE_FILE).write_text(json.dumps({"fingerprint": _fingerprint(SPECS, "1.0"),
                                                   "tokens_per_second": 12345.0}))  # fmt: skip
    assert measured_throughput(tmp_path, SPECS, "1.0") == 12345.0  # cached: no run
    fresh = measured_throughput(tmp_path, SPECS, "2.0", timeout=LOADED)  # another version: a real run
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

    def running_benchmark(p: psutil.Process) -> bool:
        try:  # a child another test of this worker process left exited (a zombie) runs nothing
            return p.status() != psutil.STATUS_ZOMBIE and "worker.benchmark" in " ".join(p.cmdline())
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            return False

    left = [p for p in psutil.Process().children(recursive=True) if running_benchmark(p)]  # ours only
    assert left == [] and not (tmp_path / CACHE_FILE).exists()
