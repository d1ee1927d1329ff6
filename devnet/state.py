"""What a running devnet is made of, recorded in `<dir>/devnet.json` so `down` can stop it by pid."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
from pydantic import BaseModel, Field

from devnet.hosts import WorldRecord
from intellect.keyfiles import write_key_file

STATE_FILE = "devnet.json"


class ManagedProcess(BaseModel):
    name: str
    pid: int
    create_time: float = Field(description="guards against a recycled pid")
    cmd: list[str]
    env: dict[str, str] = Field(default_factory=dict, description="its own settings, reused by a restart")
    log: str | None = None
    url: str | None = None

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.create_time) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _signal_and_wait(self, sig: signal.Signals, timeout: float) -> bool:
        """Send `sig` to the process and whatever it forked in its session (spawned processes lead
        their own: a redis-server's AOF-rewrite child would otherwise keep its port and the restarted
        one would fail with "Address already in use"), and wait up to `timeout` for it to go; True if
        it is gone. Processes that started sessions of their own (a worker's task supervisors) are
        not touched."""
        try:
            leads_group = os.getpgid(self.pid) == self.pid
        except ProcessLookupError:
            return True
        if leads_group:
            os.killpg(self.pid, sig)
        else:
            os.kill(self.pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.05)
        return not self.alive()

    def kill(self, timeout: float = 10.0) -> bool:
        """SIGKILL, as a crash would, and wait until it is gone; True if it was running."""
        if not self.alive():
            return False
        self._signal_and_wait(signal.SIGKILL, timeout)
        return True

    def stop(self, timeout: float = 10.0) -> bool:
        """SIGTERM, then SIGKILL after `timeout`; True if it was running."""
        if not self.alive():
            return False
        if not self._signal_and_wait(signal.SIGTERM, timeout):
            self._signal_and_wait(signal.SIGKILL, timeout)
        return True


class DevAccount(BaseModel):
    role: str
    address: str
    # anvil's well-known dev keys: public test keys, kept in a 0600 file and never printed by default.
    private_key: str


class DevnetState(BaseModel):
    directory: str
    rpc_url: str
    chain_id: int
    deployment_path: str
    domain_id: int
    pool_id: int
    accounts: list[DevAccount]
    processes: list[ManagedProcess] = Field(default_factory=list)
    started_at: float = Field(default_factory=time.time)
    world: WorldRecord | None = Field(None, description="the multi-host world of `up --hosts`")

    def account(self, role: str) -> DevAccount:
        return next(a for a in self.accounts if a.role == role)

    def key_ref(self, role: str) -> str:
        """`file:PATH` of the role's key in `<devnet>/keys` (0600): services get the path, never the key,
        in their environment, where a task could read it from /proc."""
        return write_key_file(Path(self.directory) / "keys" / f"{role}.key", self.account(role).private_key)

    def process(self, name: str) -> ManagedProcess | None:
        return next((p for p in self.processes if p.name == name), None)

    def save(self) -> Path:
        path = Path(self.directory) / STATE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.model_dump_json(indent=2))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, directory: Path) -> DevnetState | None:
        path = directory / STATE_FILE
        if not path.exists():
            return None
        return cls.model_validate_json(path.read_text())
