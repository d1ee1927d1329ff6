"""Run a whole group on this machine, one process per member on loopback (tests, bench, demo), or each
member on a host of its own (devnet/hosts.py), some of them behind NAT."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from intellect.net import stable_port
from workloads.pipeline.__main__ import SECRET_ENV, output_from_json
from workloads.pipeline.member import BatchRequest, StageOutput

if TYPE_CHECKING:  # tests and the devnet place members on hosts; a member never imports devnet
    from devnet.hosts import Host

REPO = Path(__file__).resolve().parents[2]


@dataclass
class GroupRun:
    outputs: dict[int, StageOutput] = field(default_factory=dict)  # the (first) batch, by member
    batches: list[dict[int, StageOutput]] = field(default_factory=list)  # every batch, by member
    errors: dict[int, dict] = field(default_factory=dict)  # member index → {"error", "member" at fault}

    @property
    def ok(self) -> bool:
        return not self.errors and len(self.outputs) > 0


def run_local_group(
    members: int, request: BatchRequest | list[BatchRequest], folder: Path, *, model: str = "tiny",
    weights: Path | None = None, cheats: dict[int, str] | None = None, timeout: float = 30.0,
    eos: int | None = None, hosts: list[Host] | None = None, behind_nat: set[int] | None = None,
) -> GroupRun:  # fmt: skip
    """Start `members` member processes on 127.0.0.1 (or member i on `hosts[i]`), run the batch (or each
    batch of a list) through them, collect what each member made. Members in `behind_nat` open both of
    their links themselves (`--dial-prev`; their predecessor `--listen-next`)."""
    folder.mkdir(parents=True, exist_ok=True)
    ports = [stable_port() for _ in range(members)]
    outports = [stable_port() for _ in range(members)]
    nat = behind_nat or set()
    address = [h.public_address for h in hosts] if hosts else ["127.0.0.1"] * members  # as others see it
    listen = "0.0.0.0" if hosts else "127.0.0.1"
    many = isinstance(request, list)
    body = [asdict(r) for r in request] if isinstance(request, list) else asdict(request)
    (folder / "request.json").write_text(json.dumps(body))
    env = {**os.environ, SECRET_ENV: secrets.token_hex(32), "PYTHONPATH": str(REPO)}
    procs = []
    for i in range(members):
        j, h = (i + 1) % members, (i - 1) % members
        argv = [sys.executable, "-m", "workloads.pipeline", "--index", str(i), "--members", str(members),
                "--model", model, "--out", str(folder / f"member-{i}.json"), "--timeout", str(timeout),
                *(["--dial-prev", f"tcp://{address[h]}:{outports[h]}"] if i in nat
                  else ["--bind", f"tcp://{listen}:{ports[i]}"]),
                *(["--listen-next", f"tcp://{listen}:{outports[i]}"] if j in nat
                  else ["--next", f"tcp://{address[j]}:{ports[j]}"])]  # fmt: skip
        if weights is not None:
            argv += ["--weights", str(weights)]
        if eos is not None:
            argv += ["--eos", str(eos)]
        if i == 0:
            argv += ["--request", str(folder / "request.json")]
        elif isinstance(request, list):
            argv += ["--batches", str(len(request))]
        if cheats and i in cheats:
            argv += ["--cheat", cheats[i]]
        if hosts:
            argv = hosts[i].argv(argv)
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
        if isinstance(data, dict) and "error" in data:
            run.errors[i] = data
            continue
        made = [output_from_json(d) for d in (data if many else [data])]
        run.outputs[i] = made[0]
        for b, stage_out in enumerate(made):
            if len(run.batches) <= b:
                run.batches.append({})
            run.batches[b][i] = stage_out
    return run


def _tail(path: Path, lines: int = 5) -> str:
    return " | ".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
