"""Run a whole group on this machine, one process per member on loopback (tests, bench, demo), or each
member on a host of its own (devnet/hosts.py), some of them behind NAT; or one thread per member in
this process (`run_thread_group`: the same protocol over the same CURVE links, without an interpreter
and a model load per member, for tests that run many small groups).

Each member gets a node key of its own (`GroupRun.keys`), as a worker's node would have, and signs
its link commitments with it (`commit.py`); and a transport secret of its own with every member's
public key (`transport.local_keys`), as the orchestrator gives a worker's group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, cast

from intellect.identity import Wallet
from intellect.links import DelayRelay, LinkShape
from intellect.net import stable_port
from workloads.pipeline.commit import KEY_ENV, KeySigner
from workloads.pipeline.draft import Draft
from workloads.pipeline.member import BatchRequest, Member, StageOutput
from workloads.pipeline.selfcheck import SelfLimits
from workloads.pipeline.stages import Stage
from workloads.pipeline.standalone import KEYS_ENV, SECRET_ENV, output_from_json
from workloads.pipeline.transport import local_keys


class MemberFactory(Protocol):
    """What member `index` of a thread group runs: a `Member` class taking its arguments (None: Member)."""

    def __call__(self, index: int, /) -> Callable[..., Member] | None: ...


class Host(Protocol):
    """Where a member process runs when not on this host's loopback: tests and the devnet place members
    on network namespaces (`devnet.hosts.Host` satisfies this; a workload never imports devnet)."""

    @property
    def public_address(self) -> str: ...  # the address others see its connections come from

    def argv(self, command: list[str]) -> list[str]: ...  # `command` run inside the host

REPO = Path(__file__).resolve().parents[2]


@dataclass
class GroupRun:
    outputs: dict[int, StageOutput] = field(default_factory=dict)  # the (first) batch, by member
    batches: list[dict[int, StageOutput]] = field(default_factory=list)  # every batch, by member
    errors: dict[int, dict] = field(default_factory=dict)  # member index → {"error", "member" at fault}
    keys: list[Wallet] = field(default_factory=list)  # each member's node key (signed: True)

    @property
    def addresses(self) -> list[str]:
        return [k.address for k in self.keys]

    def record(self, member: int, made: list[StageOutput]) -> None:
        """What `member` made of each batch, in order."""
        self.outputs[member] = made[0]
        for b, stage_out in enumerate(made):
            if len(self.batches) <= b:
                self.batches.append({})
            self.batches[b][member] = stage_out

    @property
    def ok(self) -> bool:
        return not self.errors and len(self.outputs) > 0


def run_local_group(
    members: int, request: BatchRequest | list[BatchRequest], folder: Path, *, model: str = "tiny",
    weights: Path | None = None, cheats: dict[int, str] | None = None, timeout: float = 30.0,
    eos: int | None = None, hosts: list[Host] | None = None, behind_nat: set[int] | None = None,
    signed: bool = True, link: LinkShape | None = None, in_flight: int = 1, keys: list[Wallet] | None = None,
    draft: str = "none", draft_tokens: int = 4,
) -> GroupRun:  # fmt: skip
    """Start `members` member processes on 127.0.0.1 (or member i on `hosts[i]`), run the batch (or each
    batch of a list) through them, collect what each member made. Members in `behind_nat` open both of
    their links themselves (`--dial-prev`; their predecessor `--listen-next`). `link`: every hop goes
    through a delay relay of that shape (intellect/links.py), in front of each member's inbox. `in_flight`:
    batches the driver keeps moving at once (`flight.py`). `keys`: the members' node keys (default new
    ones; the same keys make the same signatures, so two runs' files can be compared byte for byte).
    `draft`: the driver's draft by name (`draft.py`), guessing up to `draft_tokens` tokens a trip."""
    folder.mkdir(parents=True, exist_ok=True)
    ports = [stable_port() for _ in range(members)]
    outports = [stable_port() for _ in range(members)]
    nat = behind_nat or set()
    address = [h.public_address for h in hosts] if hosts else ["127.0.0.1"] * members  # as others see it
    listen = "0.0.0.0" if hosts else "127.0.0.1"
    many = isinstance(request, list)
    body = [asdict(r) for r in request] if isinstance(request, list) else asdict(request)
    (folder / "request.json").write_text(json.dumps(body))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    curve = [k.hex() for k in local_keys(members)]  # each member's secret, every member's public key
    procs = []
    relays: list[DelayRelay] = []
    if link is not None:
        if hosts or nat:
            raise ValueError("delayed links are built for members on 127.0.0.1 that bind their inboxes")
        relays = [DelayRelay(("127.0.0.1", port), link).start() for port in ports]
    inbox = [r.port for r in relays] if relays else ports  # where the previous member sends
    keys = (keys or [Wallet.create() for _ in range(members)]) if signed else []
    for i in range(members):
        j, h = (i + 1) % members, (i - 1) % members
        argv = [sys.executable, "-m", "workloads.pipeline", "--index", str(i), "--members", str(members),
                "--model", model, "--out", str(folder / f"member-{i}.json"), "--timeout", str(timeout),
                *(["--dial-prev", f"tcp://{address[h]}:{outports[h]}"] if i in nat
                  else ["--bind", f"tcp://{listen}:{ports[i]}"]),
                *(["--listen-next", f"tcp://{listen}:{outports[i]}"] if j in nat
                  else ["--next", f"tcp://{address[j]}:{inbox[j]}"])]  # fmt: skip
        if weights is not None:
            argv += ["--weights", str(weights)]
        if eos is not None:
            argv += ["--eos", str(eos)]
        if i == 0:
            argv += ["--request", str(folder / "request.json"), "--in-flight", str(in_flight)]
        elif isinstance(request, list):
            argv += ["--batches", str(len(request))]
        if cheats and i in cheats:
            argv += ["--cheat", cheats[i]]
        argv += ["--draft", draft, "--draft-tokens", str(draft_tokens)]  # every member bounds a trip by it
        member_env = {**env, SECRET_ENV: curve[i][0], KEYS_ENV: curve[i][1]}
        if keys:
            argv += ["--address", keys[i].address]
            member_env[KEY_ENV] = keys[i].private_key_hex()
        if hosts:
            argv = hosts[i].argv(argv)
        log = (folder / f"member-{i}.log").open("wb")
        procs.append(subprocess.Popen(argv, env=member_env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    try:
        _wait(procs, timeout * 4 + 120)
    finally:
        for relay in relays:
            relay.stop()
    return _read_outputs(folder, procs, GroupRun(keys=keys), many=many)


def _wait(procs: list[subprocess.Popen], seconds: float) -> None:
    """Every member process ended; one still running after `seconds` is killed."""
    for proc in procs:
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_outputs(folder: Path, procs: list[subprocess.Popen], run: GroupRun, *, many: bool) -> GroupRun:
    """What each member process wrote (`standalone.output_json`), or why it wrote nothing: its error
    naming the member at fault, or its exit code and the tail of its log."""
    for i, proc in enumerate(procs):
        out = folder / f"member-{i}.json"
        if not out.exists():
            run.errors[i] = {"error": f"exited {proc.returncode}: {_tail(folder / f'member-{i}.log')}",
                             "member": i}  # fmt: skip
            continue
        data = json.loads(out.read_text())
        if isinstance(data, dict) and "error" in data:
            run.errors[i] = data
            continue
        run.record(i, [output_from_json(d) for d in (data if many else [data])])
    return run


def _tail(path: Path, lines: int = 5) -> str:
    return " | ".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def run_thread_group(
    members: int, request: BatchRequest | list[BatchRequest], *, model: str = "tiny",
    cheats: dict[int, str] | None = None, timeout: float = 20.0, signed: bool = True,
    task_id: str = "local", group_id: str = "local", in_flight: int = 1, keys: list[Wallet] | None = None,
    draft: Draft | None = None, draft_tokens: int = 0, stages: list[Stage] | None = None,
    factory: MemberFactory | None = None, self_limits: SelfLimits | None = None,
) -> GroupRun:  # fmt: skip
    """`run_local_group` with each member a thread of this process: real links on loopback, each member
    its own stage (only its layers), node key and cheat, `in_flight` batches moving at once, the driver
    guessing up to `draft_tokens` tokens a trip with `draft` (`draft.py`). `stages`: the members' stages,
    loaded once by a caller that runs many groups; `factory(i)`: the class member i runs (the fuzzer's
    `adversary.Adversary`; default `Member`), or None for `Member`. `self_limits`: what honest members
    hold their own files to (`selfcheck.py`; default the model's, `limits_for`)."""
    import threading

    import torch

    from workloads.model.loading import load_tokenizer
    from workloads.pipeline.member import Member
    from workloads.pipeline.options import Cheat
    from workloads.pipeline.selfcheck import limits_for
    from workloads.pipeline.stages import load_stage, plan_stages
    from workloads.pipeline.transport import MemberError, MemberLink, MemberTimeout

    requests = request if isinstance(request, list) else [request]
    tok = load_tokenizer(model)
    held = self_limits or limits_for(model)
    curve = local_keys(members)
    ports = [stable_port() for _ in range(members)]
    keys = (keys or [Wallet.create() for _ in range(members)]) if signed else []
    run = GroupRun(keys=keys)
    plans = plan_stages(model, members)
    # Loaded here, one after another: building a model sets torch's process-wide default dtype for a
    # while, and loads racing in threads leave it at bfloat16 for everything that runs afterwards.
    default = torch.get_default_dtype()
    stages = stages or [load_stage(model, plan) for plan in plans]
    torch.set_default_dtype(default)
    made: dict[int, list[StageOutput]] = {}

    def member(i: int) -> None:
        link = MemberLink(i, curve[i], f"tcp://127.0.0.1:{ports[i]}",
                          f"tcp://127.0.0.1:{ports[(i + 1) % members]}", max_frame_bytes=64 << 20,
                          timeout=timeout)  # fmt: skip
        try:
            link.connect()
            cheat = (cheats or {}).get(i, "none")
            make = (factory(i) if factory is not None else None) or Member
            m = make(stages[i], link, int(tok.eos_token_id), int(tok.pad_token_id),
                       cheat=cast(Cheat, cheat),
                       address=keys[i].address if keys else "", signer=KeySigner(keys[i]) if keys else None,
                       task_id=task_id, group_id=group_id, draft=draft if i == 0 else None,
                       draft_tokens=draft_tokens if draft is not None else 0, self_limits=held,
                       expected=[k.address for k in keys] or None)  # fmt: skip
            m.introduce()
            served = m.serve(requests if i == 0 else None, in_flight=in_flight, batches=len(requests))
            made[i] = sorted(served, key=lambda o: o.started)
        except MemberError as exc:
            run.errors[i] = {"error": str(exc), "member": exc.member, "from": i,
                             "timeout": isinstance(exc, MemberTimeout)}  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a member that dies of what it was sent names nobody
            run.errors[i] = {"error": f"crashed: {exc!r}", "member": None, "from": i, "crash": True}
        finally:
            link.close()

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 4 + 60)
    for i, outs in sorted(made.items()):
        run.record(i, outs)
    return run
