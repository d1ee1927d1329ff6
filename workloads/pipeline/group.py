"""Run a whole group on this machine, one process per member on loopback (tests, bench, demo)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from intellect.net import free_port
from workloads.pipeline.__main__ import SECRET_ENV, output_from_json
from workloads.pipeline.member import BatchRequest, StageOutput

REPO = Path(__file__).resolve().parents[2]


@dataclass
class GroupRun:
    outputs: dict[int, StageOutput] = field(default_factory=dict)
    errors: dict[int, dict] = field(default_factory=dict)  # member index → {"error", "member" at fault}

    @property
    def ok(self) -> bool:
        return not self.errors and len(self.outputs) > 0


def run_local_group(members: int, request: BatchRequest, folder: Path, *, model: str = "tiny",
                    weights: Path | None = None, cheats: dict[int, str] | None = None,
                    timeout: float = 30.0) -> GroupRun:  # fmt: skip
    """Start `members` member processes on 127.0.0.1, run one batch, collect what each made."""
    folder.mkdir(parents=True, exist_ok=True)
    ports = [free_port() for _ in range(members)]
    (folder / "request.json").write_text(json.dumps(asdict(request)))
    env = {**os.environ, SECRET_ENV: secrets.token_hex(32), "PYTHONPATH": str(REPO)}
    procs = []
    for i in range(members):
        argv = [sys.executable, "-m", "workloads.pipeline", "--index", str(i), "--members", str(members),
                "--model", model, "--bind", f"tcp://127.0.0.1:{ports[i]}",
                "--next", f"tcp://127.0.0.1:{ports[(i + 1) % members]}",
                "--out", str(folder / f"member-{i}.json"),
                "--timeout", str(timeout)]  # fmt: skip
        if weights is not None:
            argv += ["--weights", str(weights)]
        if i == 0:
            argv += ["--request", str(folder / "request.json")]
        if cheats and i in cheats:
            argv += ["--cheat", cheats[i]]
        log = (folder / f"member-{i}.log").open("wb")
        procs.append(subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    run = GroupRun()
    for i, proc in enumerate(procs):
        try:
            proc.wait(timeout=timeout * 4 + 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out = folder / f"member-{i}.json"
        if not out.exists():
            run.errors[i] = {"error": f"exited {proc.returncode}: {_tail(folder / f'member-{i}.log')}",
                             "member": i}  # fmt: skip
            continue
        data = json.loads(out.read_text())
        if "error" in data:
            run.errors[i] = data
        else:
            run.outputs[i] = output_from_json(data)
    return run


def _tail(path: Path, lines: int = 5) -> str:
    return " | ".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
