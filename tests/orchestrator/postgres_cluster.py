"""A throw-away PostgreSQL cluster for tests: initdb into a temp dir, one `postgres` process, stopped by pid.

Root may not run postgres, so under root the cluster directory is handed to the `postgres` system user
and the server process runs as that user (Popen(user=...), so the pid we stop is the server's own).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from intellect.net import free_port

DATABASE = "intellect"


def postgres_bin() -> Path | None:
    """Directory of `initdb`/`postgres`: on PATH, else the newest Debian /usr/lib/postgresql/<v>/bin."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(candidates[-1]).parent if candidates else None


def _run_as() -> str | None:
    """The OS user the server runs as: `postgres` when we are root, ourselves otherwise."""
    return "postgres" if os.geteuid() == 0 else None


@dataclass
class PostgresCluster:
    directory: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://intellect@127.0.0.1:{self.port}/{DATABASE}"

    def fresh_database(self, name: str) -> str:
        """Create an empty database and return its SQLAlchemy URL (one per test keeps tests apart)."""
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=intellect dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://intellect@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # "fast" shutdown: roll back clients, exit cleanly
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_cluster(timeout: float = 30.0) -> PostgresCluster:
    bindir = postgres_bin()
    if bindir is None:
        raise FileNotFoundError("no initdb found (apt-get install -y postgresql, or scripts/ci-services.sh)")
    user = _run_as()
    directory = Path(tempfile.mkdtemp(prefix="intellect-pg-"))
    if user:
        shutil.chown(directory, user=user, group=None)
    data = directory / "data"
    subprocess.run(
        [str(bindir / "initdb"), "-D", str(data), "-U", "intellect", "-A", "trust", "--no-sync",
         "-E", "UTF8"],
        check=True, capture_output=True, user=user, cwd=directory,
    )
    port = free_port()
    log = open(directory / "postgres.log", "wb")  # noqa: SIM115 - the server writes it until stopped
    process = subprocess.Popen(
        [str(bindir / "postgres"), "-D", str(data), "-k", str(directory), "-p", str(port),
         "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
         "-c", "full_page_writes=off", "-c", "max_connections=100"],
        stdout=log, stderr=subprocess.STDOUT, user=user, cwd=directory,
    )
    log.close()
    cluster = PostgresCluster(directory, port, process)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(f"host=127.0.0.1 port={port} user=intellect dbname=postgres",
                                 autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {DATABASE}")
            return cluster
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                output = (directory / "postgres.log").read_text(errors="replace")[-2000:]
                cluster.stop()
                raise RuntimeError(f"postgres did not start on port {port}:\n{output}") from None
            time.sleep(0.1)
        except BaseException:
            cluster.stop()
            raise
