"""The worker's throughput figure: decode tokens per second of the shipped tiny model on this machine.

Groups run at their slowest member's pace, so the orchestrator puts nodes of similar speed together
(`orchestrator/groups/formation.py`). The figure is measured, not configured: a fixed workload (the
tiny model, a batch of 8 rows, 32 decode steps with its KV cache, one torch thread per core the
worker may use) timed after a warm-up. It runs once in a child process (`python -m worker.benchmark`,
niced, bounded in time) so the daemon never imports torch, and is cached for the same worker version
and hardware in the worker's state folder and in a cache shared by every worker of the machine
(`INTELLECT_CACHE_DIR`, default `~/.cache/intellect`): the figure describes the machine, and several
workers starting at once on one host (a devnet, a test suite) measure it once, under a file lock,
instead of each spending ten seconds of CPU the others need. Where torch is missing or the run fails,
the node reports no figure and is grouped after the nodes that did.

A modified worker can still report any number. What a high figure buys is a place in a fast group,
where it is then the slowest member; pay is per validated token, so no figure changes what a node
earns (docs/storage-and-groups.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from intellect.wire.nodes import ComputeSpecs

CACHE_FILE = "benchmark.json"
BATCH, PROMPT, STEPS = 8, 16, 32


def run_benchmark(threads: int | None = None) -> float:
    """Decode tokens/s (rows × steps / seconds) of the tiny model, best of two timed runs."""
    import torch

    from workloads.model.loading import load_model

    torch.set_num_threads(max(1, threads or (os.cpu_count() or 1)))
    model = load_model("tiny", dtype=torch.bfloat16)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))

    def decode(steps: int) -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(steps):
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        return time.perf_counter() - started

    decode(4)  # warm-up: kernels, allocator
    best = min(decode(STEPS) for _ in range(2))
    return BATCH * STEPS / best


def _fingerprint(specs: ComputeSpecs, version: str) -> str:
    gpus = ",".join(f"{g.count}x{g.model}" for g in specs.gpus)
    return f"{version}|{specs.cpu_model}|{specs.cpu_cores}|{gpus}"


def machine_cache_dir() -> Path:
    """The cache every worker of this machine shares (`INTELLECT_CACHE_DIR`, else the XDG cache)."""
    explicit = os.environ.get("INTELLECT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "intellect"


def _read(folder: Path, specs: ComputeSpecs, version: str) -> float | None:
    try:
        saved = json.loads((folder / CACHE_FILE).read_text())
        if saved.get("fingerprint") == _fingerprint(specs, version) and float(saved["tokens_per_second"]) > 0:
            return float(saved["tokens_per_second"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _write(folder: Path, specs: ComputeSpecs, version: str, value: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{CACHE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"fingerprint": _fingerprint(specs, version), "tokens_per_second": value,
                               "measured_at": int(time.time())}))  # fmt: skip
    tmp.replace(folder / CACHE_FILE)  # readers never see half a file


def cached_throughput(state_dir: Path, specs: ComputeSpecs, version: str) -> float | None:
    """The figure measured before for this worker version and hardware, by this worker or by another
    worker of the machine (then kept in this worker's folder too), if any."""
    value = _read(state_dir, specs, version)
    if value is not None:
        return value
    value = _read(machine_cache_dir(), specs, version)
    if value is not None:
        with contextlib.suppress(OSError):
            _write(state_dir, specs, version, value)
    return value


def save_throughput(state_dir: Path, specs: ComputeSpecs, version: str, value: float) -> float:
    value = round(value, 1)
    _write(state_dir, specs, version, value)
    with contextlib.suppress(OSError):  # an unwritable home cache only costs the next worker a run
        _write(machine_cache_dir(), specs, version, value)
    return value


@contextlib.asynccontextmanager
async def machine_lock(poll: float = 0.25) -> AsyncIterator[None]:
    """One measurement at a time on this machine: the others wait, then read its figure. Polls a
    non-blocking flock so the daemon's event loop never blocks; the kernel drops the lock if the
    holder dies."""
    folder = machine_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = (folder / f"{CACHE_FILE}.lock").open("a")
    except OSError:  # no shared cache here: measure unguarded
        yield
        return
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(poll)
        yield
    finally:
        handle.close()  # closing releases the lock


def parse_output(returncode: int | None, stdout: str) -> float | None:
    try:
        value = float(stdout.strip().splitlines()[-1]) if returncode == 0 else None
    except (ValueError, IndexError):
        return None
    return value if value is not None and value > 0 else None


async def measure_async(state_dir: Path, specs: ComputeSpecs, version: str,
                        timeout: float = 180.0) -> float | None:  # fmt: skip
    """What the daemon awaits: the cached figure, else a run in a niced child process that is killed
    when the daemon stops (cancellation) or the run takes longer than `timeout`."""
    cached = cached_throughput(state_dir, specs, version)
    if cached is not None:
        return cached
    async with machine_lock():
        cached = cached_throughput(state_dir, specs, version)  # measured while this one waited
        if cached is not None:
            return cached
        return await _measure_child(state_dir, specs, version, timeout)


async def _measure_child(state_dir: Path, specs: ComputeSpecs, version: str, timeout: float) -> float | None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker.benchmark", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, preexec_fn=lambda: os.nice(19),
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    value = parse_output(proc.returncode, out.decode(errors="replace"))
    return save_throughput(state_dir, specs, version, value) if value is not None else None


def measured_throughput(state_dir: Path, specs: ComputeSpecs, version: str,
                        timeout: float = 180.0) -> float | None:  # fmt: skip
    """Blocking form (CLI, tests): the cached figure, else a fresh run (None if it fails)."""
    cached = cached_throughput(state_dir, specs, version)
    if cached is not None:
        return cached
    try:
        done = subprocess.run([sys.executable, "-m", "worker.benchmark"], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=lambda: os.nice(19))  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    value = parse_output(done.returncode, done.stdout)
    return save_throughput(state_dir, specs, version, value) if value is not None else None


if __name__ == "__main__":
    print(f"{run_benchmark():.1f}")
