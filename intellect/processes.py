"""Stopping a child process that this process started (Redis, anvil, HAProxy, a test's service)."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(process: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM the child if it still runs, SIGKILL it if it has not exited `grace` seconds later, and
    reap it either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
