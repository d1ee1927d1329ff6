"""A failed `intellect-orchestrator serve` start says why and leaves nothing running (issue 19.8):
before, a start that failed after the embedded Redis came up left its redis-server behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

SERVE = [str(Path(sys.executable).parent / "intellect-orchestrator"), "serve", "--port", "0"]


def redis_servers_of(state_dir: Path) -> list[int]:
    """redis-server processes working in `state_dir` (redis rewrites its title, dropping its --dir:
    its working directory is the data dir)."""
    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            if "redis-server" in (proc.info["name"] or "") and str(state_dir) in proc.cwd():
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def serve(state_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_ORCH_")}
    return subprocess.run([*SERVE, "--state-dir", str(state_dir)], env=clean | env, capture_output=True,
                          text=True, timeout=120)


def test_no_manager_key_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    done = serve(tmp_path / "orch")
    assert done.returncode == 2
    assert "no pool manager key" in done.stderr and "INTELLECT_ORCH_MANAGER_KEY" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert redis_servers_of(tmp_path / "orch") == []


def test_a_start_failing_after_redis_came_up_stops_it(tmp_path: Path) -> None:
    """The chain cannot be read (no deployment there): the lifespan fails after starting Redis."""
    state_dir = tmp_path / "orch"
    done = serve(state_dir, INTELLECT_ORCH_MANAGER_KEY="0x" + "42" * 32,
                 INTELLECT_ORCH_DEPLOYMENT=str(tmp_path / "missing-deployment.json"),
                 INTELLECT_ORCH_RPC_URL="http://127.0.0.1:9")
    assert done.returncode != 0
    assert (state_dir / "redis").exists(), done.stderr[-2000:]  # Redis did start before the failure
    assert redis_servers_of(state_dir) == [], done.stderr[-2000:]
