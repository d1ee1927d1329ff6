"""Process runtime: the task spec run as a local process tree, for hosts without a Docker engine.

`entrypoint + cmd` runs under a small supervisor (`supervise.py`) in its own session, so the whole
tree is killed by process group, restarts on failure are capped, and the exit code is recorded in
a file that a restarted worker reads when it adopts the run. `image` is not used (no container);
it is kept in the run record as a hint. Container paths in the spec (`/data`, `/shared`, the
`volume_mounts` container paths) are rewritten to the host directories wherever an argument names
them (alone, after `=` or `:`, or inside a shell string after a space or a quote), which the task also
finds in `INTELLECT_DATA_DIR` and `INTELLECT_SHARED_DIR`. The process runtime's stand-in for an
image's Python is the worker's own interpreter: `python` and `python3` (as the command, or inside a
shell string: small launchers first on the task's PATH) run `sys.executable`, the environment the
worker, and so the project's workloads, are installed in. The task gets a clean environment (a few safe
variables such as PATH, plus its own): never the worker's keys or passphrases.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
from pydantic import BaseModel

from intellect.wire.heartbeat import TaskStatus
from intellect.wire.tasks import AssignedTask, TaskState
from worker.runtime.base import (
    CONTAINER_DATA,
    CONTAINER_SHARED,
    PreparedTask,
    RuntimeBase,
    RuntimeConfig,
    TaskSetupError,
    make_dirs,
    prepare,
    resolve_mounts,
    tail_lines,
)
from worker.runtime.bridge import TaskBridge
from worker.runtime.confinement import Jail, hand_over, size_bytes, unavailable_reason
from worker.runtime.supervise import write_owner

SUPERVISOR = Path(__file__).with_name("supervise.py")
INHERITED_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH")
IMAGE_PYTHONS = ("python", "python3")  # what an image's command calls its Python
STATES = {
    "running": TaskState.RUNNING,
    "restarting": TaskState.RESTARTING,
    "completed": TaskState.COMPLETED,
    "failed": TaskState.FAILED,
    "stopped": TaskState.FAILED,
}


class RunRecord(BaseModel):
    """run.json: written once when the supervisor starts; identifies it across worker restarts."""

    name: str
    task_id: str
    config_hash: str
    effective_hash: str
    image_hint: str
    supervisor_pid: int
    supervisor_started: float
    assigned: AssignedTask


class ProcessRuntime(RuntimeBase[RunRecord]):
    kind = "process"

    def __init__(self, config: RuntimeConfig, bridge: TaskBridge | None = None) -> None:
        super().__init__(config, bridge)
        # This worker process owns the runs from now on: supervisors of runs a previous (dead) worker
        # started see the new owner and keep their task; without one they stop it after orphan_ttl.
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        write_owner(self.owner_file, os.getpid())

    @property
    def runs_dir(self) -> Path:
        return self.config.state_dir / "processes"

    @property
    def owner_file(self) -> Path:
        return self.config.state_dir / "owner.json"

    # ---- the backend of RuntimeBase: a run is a supervisor process and its run dir --------------
    def _find(self, name: str) -> RunRecord | None:
        return self._load(name)

    def _launch(self, prepared: PreparedTask, desired: AssignedTask, fresh: bool) -> RunRecord:
        return self._spawn(prepared, desired, fresh)

    def _stop_run(self, run: RunRecord) -> None:
        self._stop(run)

    def _status_of(self, run: RunRecord) -> TaskStatus:
        return self._status(run)

    def _remove_except(self, keep: str | None) -> list[str]:
        removed = []
        for run_dir in sorted(self.runs_dir.glob("*")) if self.runs_dir.exists() else []:
            if run_dir.name == keep or not run_dir.is_dir():
                continue
            record = self._load(run_dir.name)
            if record is not None:
                self._stop(record)
            shutil.rmtree(run_dir, ignore_errors=True)
            removed.append(run_dir.name)
        return removed

    def _newest_run(self) -> tuple[AssignedTask, RunRecord] | None:
        records = (
            [r for r in (self._load(d.name) for d in self.runs_dir.glob("*")) if r is not None]
            if self.runs_dir.exists()
            else []
        )
        if not records:
            return None
        newest = max(records, key=lambda r: r.supervisor_started)
        return newest.assigned, newest

    def _tail(self, run: RunRecord, tail: int) -> list[str]:
        return tail_lines(self.runs_dir / run.name / "output.log", tail)

    def _follow(self, run: RunRecord, tail: int) -> Iterator[str]:
        path = self.runs_dir / run.name / "output.log"
        yield from tail_lines(path, tail)
        if not path.exists():
            return
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            pending = b""
            while True:
                chunk = handle.read()
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    yield from (line.decode(errors="replace") for line in lines)
                elif not self._alive(run):
                    if pending:
                        yield pending.decode(errors="replace")
                    return
                else:
                    time.sleep(0.2)

    # ---- internals -------------------------------------------------------------------------
    def _python_launchers(self) -> Path:
        """`python`/`python3` launchers for the worker's interpreter (a symlink would lose its venv)."""
        folder = self.config.state_dir / "bin"
        folder.mkdir(parents=True, exist_ok=True)
        body = f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'
        for name in IMAGE_PYTHONS:
            launcher = folder / name
            if not launcher.exists() or launcher.read_text() != body:
                tmp = folder / f".{name}.tmp"
                tmp.write_text(body)
                tmp.chmod(0o755)
                tmp.replace(launcher)
        return folder

    def _path_map(self, desired: AssignedTask) -> list[tuple[str, str]]:
        mapping = [
            (CONTAINER_DATA, str(self.config.data_dir(desired.task.id))),
            (CONTAINER_SHARED, str(self.config.shared_dir)),
        ]
        mapping += [
            (container.rstrip("/"), str(host)) for host, container in resolve_mounts(desired, self.config)
        ]
        return sorted(mapping, key=lambda pair: len(pair[0]), reverse=True)

    def _prepare(self, desired: AssignedTask) -> PreparedTask:
        mapping = self._path_map(desired)
        pattern = re.compile(
            r"(^|(?<=[=:\s'\"]))(" + "|".join(re.escape(c) for c, _ in mapping) + r")(?=/|$|:|\s|'|\")"
        )
        hosts = dict(mapping)

        def translate(text: str) -> str:
            # "/data/x", "--out=/data/x", "a:/data/x" (PATH-like) and "sh -c 'cat /data/x'" point into
            # the task's dirs.
            return pattern.sub(lambda m: m.group(1) + hosts[m.group(2)], text)

        socket_path = str(self.config.socket_path) if self.config.socket_path else None
        prepared = prepare(
            desired, self.config, socket_path, str(self.config.data_dir(desired.task.id)), translate
        )
        prepared.env["INTELLECT_SHARED_DIR"] = str(self.config.shared_dir)
        if self.config.task_isolation == "require" and (reason := unavailable_reason()):
            raise TaskSetupError(
                f"this worker cannot confine the task: {reason} (INTELLECT_WORKER_TASK_ISOLATION=require)"
            )
        return prepared

    def _confine(self, prepared: PreparedTask, desired: AssignedTask, run_dir: Path) -> Jail | None:
        """The task's jail, or None (isolation off, or `auto` on a host that cannot confine: said in
        the task's log)."""
        if self.config.task_isolation == "off":
            return None
        reason = unavailable_reason()
        if reason is not None:
            with (run_dir / "output.log").open("a") as log:
                log.write(f"[worker] WARNING: the task runs unconfined, as the worker's user: {reason}\n")
            return None
        uid, gid = self.config.task_uid, self.config.task_gid
        writable = [prepared.data_dir, self.config.shared_dir,
                    *(host for host, _ in resolve_mounts(desired, self.config))]
        hand_over(writable, uid, gid)
        if self.config.socket_path is not None:
            writable.append(self.config.socket_path.parent)
        return Jail.for_task(uid, gid, run_dir, prepared.data_dir, writable,
                             [self._python_launchers(), *self.config.task_software],
                             size_bytes(self.config.shm_size))

    def _run_dir(self, prepared: PreparedTask, fresh: bool) -> Path:
        """The run's folder (emptied for a fresh start), without the state of an earlier run."""
        run_dir = self.runs_dir / prepared.name
        if fresh and run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "state.json").unlink(missing_ok=True)
        return run_dir

    @staticmethod
    def _argv(prepared: PreparedTask, run_dir: Path) -> list[str]:
        """What the task runs, the image's Python names bound to the worker's interpreter; none
        (recorded as a failed run) when the spec names nothing to run."""
        argv = (prepared.entrypoint or []) + prepared.cmd
        if argv and argv[0] in IMAGE_PYTHONS:
            argv = [sys.executable, *argv[1:]]
        if not argv:
            # A container falls back to the image's CMD; a process has nothing to run.
            detail = "the process runtime needs `entrypoint` or `cmd` (an image's defaults do not apply)"
            (run_dir / "state.json").write_text(json.dumps(
                {"state": "failed", "exit_code": None, "restart_count": 0, "detail": detail}))  # fmt: skip
        return argv

    def _environment(self, prepared: PreparedTask) -> dict[str, str]:
        """The task's environment: a few of the worker's variables, the task's own, the launchers first
        on PATH and the worker's GPUs."""
        env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
        env |= prepared.env
        env["PATH"] = os.pathsep.join([str(self._python_launchers()), env.get("PATH", os.defpath)])
        if self.config.gpu_ids:
            env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(self.config.gpu_ids))
        return env

    def _supervisor_command(self, prepared: PreparedTask, run_dir: Path, argv: list[str]) -> list[str]:
        """The supervisor (worker/runtime/supervise.py) that runs `argv` and restarts it as configured."""
        c = self.config
        return [sys.executable, str(SUPERVISOR), "--run-dir", str(run_dir), "--cwd", str(prepared.data_dir),
                "--max-restarts", str(c.max_restarts), "--restart-delay", str(c.restart_delay),
                "--owner-file", str(self.owner_file), "--orphan-ttl", str(c.orphan_ttl),
                "--", *argv]  # fmt: skip

    @staticmethod
    def _save_record(run_dir: Path, record: RunRecord) -> None:
        tmp = run_dir / "run.json.tmp"
        # The assigned task may carry its group's secret: readable by the worker's user only.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(record.model_dump_json())
        os.chmod(tmp, 0o600)
        os.replace(tmp, run_dir / "run.json")

    def _spawn(self, prepared: PreparedTask, desired: AssignedTask, fresh: bool = True) -> RunRecord:
        make_dirs(prepared)
        run_dir = self._run_dir(prepared, fresh)
        argv = self._argv(prepared, run_dir)
        env = self._environment(prepared)
        jail = self._confine(prepared, desired, run_dir) if argv else None
        if jail is not None:
            argv = jail.command(argv)
            env |= {"HOME": "/tmp", "TMPDIR": "/tmp", "USER": "nobody"}
        if argv:
            process = subprocess.Popen(
                self._supervisor_command(prepared, run_dir, argv),
                env=env,
                cwd=prepared.data_dir,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=(run_dir / "supervisor.err").open("ab"),
            )
            pid, started = process.pid, psutil.Process(process.pid).create_time()
        else:
            pid, started = 0, time.time()
        record = RunRecord(
            name=prepared.name, task_id=prepared.task_id, config_hash=prepared.config_hash,
            effective_hash=prepared.effective_hash, image_hint=prepared.image, supervisor_pid=pid,
            supervisor_started=started, assigned=desired,
        )  # fmt: skip
        self._save_record(run_dir, record)
        return record

    def _load(self, name: str) -> RunRecord | None:
        path = self.runs_dir / name / "run.json"
        try:
            return RunRecord.model_validate_json(path.read_text())
        except (OSError, ValueError):
            return None

    def _alive(self, record: RunRecord) -> bool:
        """The supervisor is running and is the same process (pids get reused: compare start times)."""
        if record.supervisor_pid <= 0:
            return False
        try:
            process = psutil.Process(record.supervisor_pid)
            return (
                abs(process.create_time() - record.supervisor_started) < 0.05
                and process.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False

    def _group_members(self, record: RunRecord) -> list[psutil.Process]:
        """Processes of the run's group (pgid = supervisor pid) started after it: never a stranger."""
        members = []
        for process in psutil.process_iter(["pid", "create_time"]):
            try:
                if (
                    os.getpgid(process.pid) == record.supervisor_pid
                    and process.info["create_time"] >= record.supervisor_started - 0.05
                ):
                    members.append(process)
            except (OSError, psutil.Error):
                continue
        return members

    def _stop(self, record: RunRecord) -> None:
        members = self._group_members(record) if record.supervisor_pid > 0 else []
        if not members:
            return
        if self._alive(record):
            os.killpg(record.supervisor_pid, signal.SIGTERM)
        else:
            for process in members:
                process.terminate()
        _, alive = psutil.wait_procs(members, timeout=self.config.stop_timeout)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=5)
        self._reap(record)

    def _reap(self, record: RunRecord) -> None:
        # Our own child supervisor must be waited for, or it lingers as a zombie.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(record.supervisor_pid, os.WNOHANG)

    def _status(self, record: RunRecord) -> TaskStatus:
        state_file = self.runs_dir / record.name / "state.json"
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            state = None
        alive = self._alive(record)
        if not alive:
            self._reap(record)
        base = {"task_id": record.task_id, "config_hash": record.config_hash}
        if state is None:
            if alive:
                return TaskStatus(**base, state=TaskState.PENDING, detail="starting")
            return TaskStatus(
                **base, state=TaskState.FAILED, detail="the task's supervisor exited before starting it"
            )
        task_state = STATES.get(state.get("state"), TaskState.UNKNOWN)
        detail = state.get("detail")
        if task_state in (TaskState.RUNNING, TaskState.RESTARTING) and not alive:
            task_state, detail = TaskState.FAILED, "the task's supervisor process vanished"
        elif task_state == TaskState.RUNNING and state.get("restart_count"):
            detail = f"running after {state['restart_count']} restart(s)"
        return TaskStatus(**base, state=task_state, detail=detail, exit_code=state.get("exit_code"))
