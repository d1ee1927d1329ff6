"""The cheaters that live in the worker itself (devnet/cheaters.py), each on its own node of one devnet,
next to an honest node, caught by the rule the protocol names for each:

- `withhold` (files on chain, never in storage): invalidated for data availability once the window after
  the submission passed, its stake slashed and the node ejected by the validator's vote;
- `copy` (another node's file, re-encoded, uploaded and submitted as its own): invalidated for another
  node's problems, slashed and ejected;
- `hardware` (a replayed product for every hardware challenge): refused the invite by the orchestrator
  and banned after 3 wrong answers, never in the pool;
- and a cheat of the task rather than the client (the operator injects `INTELLECT_ARITH_CHEAT`): its
  wrong answers invalidated, slashed and ejected;

while the honest node's files are accepted, its rewards pending, its stake untouched.

Real processes, started as `intellect devnet up` starts them (`devnet.network.up`): anvil, Redis,
discovery, the orchestrator, five `intellect-worker start` (three of them `python -m devnet.cheaters
KIND -- start ...`, the command `cheater_argv` makes), one voting validator (quorum 1); the task is the
cheapest workload that is judged (examples/arith, a third workload with no line of the services written
for it: this module replaced tests/examples/test_arith_devnet.py, its own devnet). One devnet serves
every test of the module.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devnet import network, services
from devnet.cheaters import WORKER_CHEATS, cheater_argv, foreign_files, reencoded
from devnet.demo import DEMO_SLASH_TOKENS, DemoPlan, configure_chain, start_validator
from devnet.placement import Placement
from devnet.processes import wait_healthy
from devnet.state import DevnetState
from intellect.client import OrchestratorClient
from intellect.identity import Wallet
from intellect.net import stable_port
from ledger.client import LedgerClient
from ledger.models import ONE_TOKEN

pytestmark = pytest.mark.slow

HONEST = 1
CHEATS = {2: "withhold", 3: "copy", 4: "hardware"}  # worker index -> the cheat it runs
WRONG = 5  # a cheat in its tasks, not its client: the operator injects INTELLECT_ARITH_CHEAT
PROBLEMS, FILES = 16, 2
# The pool's vote window: short, so a withheld file's availability window (a third of it, 20 s) passes
# within the test; the vote lands well before the window's end.
VOTE_WINDOW = 60
WAIT = 300.0  # seconds for anything to happen on a busy 2-core machine


@dataclass
class Run:
    state: DevnetState
    ledger: LedgerClient
    orchestrator: str
    token: str
    validator: str
    stakes: dict[int, int]  # worker index -> its provider's stake once its node joined (before the task)

    def node(self, index: int) -> str:
        return self.state.account(f"node-{index}").address

    def provider(self, index: int) -> str:
        return self.state.account(f"provider-{index}").address

    def verdicts(self, index: int) -> list[dict[str, Any]]:
        reply = httpx.get(f"{self.validator}/verdicts", params={"limit": 1000}, timeout=10)
        return [v for v in reply.json()["items"] if v["node"].lower() == self.node(index).lower()]

    def orchestrator_node(self, index: int) -> dict[str, Any]:
        reply = httpx.get(f"{self.orchestrator}/nodes/{self.node(index)}", timeout=10,
                          headers={"Authorization": f"Bearer {self.token}"})  # fmt: skip
        return dict(reply.json()) if reply.status_code == 200 else {}


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(1)
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    directory = tmp_path_factory.mktemp("cheaters") / "devnet"
    quiet = {"INTELLECT_WORKER_BENCHMARK": "false"}  # no throughput measured: nothing here places groups
    try:
        state, where = network.chain_up(directory, None, lambda msg: None, hosts=False)
        services.start_core(state, where, lambda msg: None, [])
        # the cheaters' workers as the devnet runs them: `python -m devnet.cheaters KIND -- start ...`
        specs = {i: services.WorkerSpec(env=quiet, program=CHEATS.get(i)) for i in range(1, 5)}
        specs[WRONG] = services.WorkerSpec(env=quiet | {"INTELLECT_WORKER_TASK_ENV": json.dumps(
            {"INTELLECT_ARITH_CHEAT": "wrong-answer"})})
        services.start_workers(state, where, specs, lambda msg: None)
        cmds = {p.name: p.cmd for p in state.processes}
        assert cmds["worker-1"][0].endswith("intellect-worker")
        assert all(cmds[f"worker-{i}"][2:5] == ["devnet.cheaters", kind, "--"] for i, kind in CHEATS.items())
        configure_chain(state, DemoPlan(validators=1, quorum=1))
        manager = LedgerClient(state.rpc_url, Path(state.deployment_path),
                               Wallet.from_key(state.account("pool-manager").private_key))  # fmt: skip
        manager.slashing.set_policy(state.pool_id, 1, DEMO_SLASH_TOKENS * ONE_TOKEN, VOTE_WINDOW)
        orchestrator = state.process("orchestrator")
        assert orchestrator is not None and orchestrator.url
        port = stable_port()
        validator = start_validator(state, 0, port, f"http://127.0.0.1:{port}", orchestrator.url,
                                    Placement.of(state))  # fmt: skip
        state.processes.append(validator)
        state.save()
        wait_healthy(validator, timeout=180)
        assert validator.url
        ledger = LedgerClient(state.rpc_url, Path(state.deployment_path), check=False)
        token = (directory / "orchestrator" / "admin-token").read_text().strip()
        result = Run(state, ledger, orchestrator.url, token, validator.url, {})
        joining = (HONEST, 2, 3, WRONG)
        wait_for(lambda: all(ledger.is_node_in_pool(state.pool_id, result.node(i)) for i in joining),
                 "the honest, withholding and copying workers joined the pool")  # fmt: skip
        result.stakes = {i: ledger.get_provider(result.provider(i)).stake for i in range(1, 6)}
        with OrchestratorClient(orchestrator.url, token=token) as client:  # a trainer, with the SDK
            task = client.submit({
                "name": "arith",
                "workload": {"type": "arith", "settings": {"problems": PROBLEMS, "files": FILES}},
                "entrypoint": [sys.executable, "-m", "intellect_arith"],  # process runtime: this Python
            })  # fmt: skip
        # the third workload, with no line of the services written for it: judged by the plug-in it names
        assert task.judged and task.spec.workload is not None and task.spec.workload.type == "arith"
        assert task.spec.env_vars["INTELLECT_ARITH_PROBLEMS"] == str(PROBLEMS)  # rendered by the plug-in
        yield result
    finally:
        network.down(directory, purge=False, progress=lambda msg: None)


def test_the_cheater_command_wraps_the_worker_command(tmp_path: Path) -> None:
    """What the devnet calls, and what a person running it sees: the kinds, and a clear refusal."""
    worker = ["/venv/bin/intellect-worker", "start", "--yes", "--api-port", "8101"]
    assert cheater_argv("copy", worker) == [sys.executable, "-m", "devnet.cheaters", "copy", "--",
                                            "start", "--yes", "--api-port", "8101"]  # fmt: skip
    with pytest.raises(ValueError, match="unknown worker cheat 'lie'"):
        cheater_argv("lie", worker)

    def cheaters(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "devnet.cheaters", *args], capture_output=True,
                              text=True, timeout=60)  # fmt: skip

    shown = cheaters("--help")
    assert shown.returncode == 0 and all(kind in shown.stdout for kind in WORKER_CHEATS)
    refused = cheaters("lie", "--", "start")
    assert refused.returncode == 2 and "invalid choice: 'lie'" in refused.stderr

    # The copy: the same content in new bytes (a new work key), found among other nodes' files only.
    body = {"node": "0xabc", "answers": ["1", "2"]}
    again = reencoded(json.dumps(body).encode())
    assert json.loads(again) == body and again != json.dumps(body).encode()
    table = pa.table({"x": [1, 2, 3]})
    written = io.BytesIO()
    pq.write_table(table, written, compression="gzip")
    copied = reencoded(written.getvalue())
    assert copied != written.getvalue() and pq.read_table(io.BytesIO(copied)).equals(table)
    for owner in ("0xaaa", "0xbbb"):
        (tmp_path / "task-1" / owner).mkdir(parents=True)
        (tmp_path / "task-1" / owner / "0-file.json").write_text("{}")
    (tmp_path / "task-2" / "0xbbb").mkdir(parents=True)
    (tmp_path / "task-2" / "0xbbb" / "0-file.json").write_text("{}")
    assert foreign_files(tmp_path, "task-1", "0xAAA") == [tmp_path / "task-1" / "0xbbb" / "0-file.json"]


def test_a_hardware_liar_is_refused_the_invite_and_banned(run: Run) -> None:
    liar = 4
    record = wait_for(lambda: (r := run.orchestrator_node(liar)).get("state") == "Banned" and r,
                      "the hardware liar banned")  # fmt: skip
    assert "hardware challenges failed" in record["reason"]
    assert record["hardware"]["outcome"] == "wrong" and record["hardware"]["flops"] is None
    assert any("freivalds" in reason for reason in record["hardware"]["reasons"])
    assert not run.ledger.is_node_in_pool(run.state.pool_id, run.node(liar))  # never invited, never joined
    assert run.orchestrator_node(HONEST)["hardware"]["outcome"] == "proven"  # the same challenge, honestly


def slashed(run: Run, index: int, reason: str) -> list[dict[str, Any]]:
    """Waits until the worker's files are judged `invalidate` for `reason` and it is out of the pool;
    asserts that its provider was slashed and it keeps no reward. Returns its verdicts."""
    node = run.node(index)

    def done() -> list[dict[str, Any]] | None:
        verdicts = run.verdicts(index)
        voted = [v for v in verdicts if v["verdict"] == "invalidate" and v["tx_hash"]]
        out = not run.ledger.is_node_in_pool(run.state.pool_id, node)
        return verdicts if voted and out else None

    verdicts = wait_for(done, f"worker {index} ({CHEATS.get(index, 'wrong answers')}) invalidated by a vote "
                        "and ejected")  # fmt: skip
    assert all(v["verdict"] == "invalidate" for v in verdicts), verdicts
    assert any(reason in r for v in verdicts for r in v["reasons"]), verdicts
    assert run.ledger.get_provider(run.provider(index)).stake < run.stakes[index]  # slashed, by the quorum
    assert run.ledger.pending_rewards(node) + run.ledger.claimable_rewards(node) == 0
    return verdicts


def test_a_withholder_is_slashed_for_data_availability(run: Run) -> None:
    verdicts = slashed(run, 2, "data availability: the file was still not in the pool's storage")
    assert any("no completed upload" in r for v in verdicts for r in v["reasons"])


def test_a_copier_is_slashed_for_another_nodes_work(run: Run) -> None:
    # the copy is of another node's file (the honest node's, or the wrong-answer node's next to it)
    verdicts = slashed(run, 3, "arith: problems of node ")
    others = {run.node(HONEST).lower(), run.node(WRONG).lower()}
    said = " ".join(r for v in verdicts for r in v["reasons"])
    assert any(f"problems of node {node}, submitted by" in said for node in others), said
    # new bytes, so work keys of its own: the honest node's own bytes would have been refused at the door
    honest = {v["sha256"] for v in run.verdicts(HONEST)}
    assert not honest & {v["sha256"] for v in verdicts}


def test_a_node_whose_tasks_answer_wrong_is_slashed(run: Run) -> None:
    """The cheat of the third workload (examples/arith), as tests/examples once ran it on a devnet of its
    own: every file invalidated for its wrong answers, the provider slashed, the node ejected."""
    slashed(run, WRONG, "answers wrong")


def test_the_honest_node_next_to_them_is_paid_and_not_slashed(run: Run) -> None:
    verdicts = wait_for(lambda: len(v := run.verdicts(HONEST)) >= FILES and v, "the honest files judged")
    assert [v["verdict"] for v in verdicts] == ["accept"] * FILES, verdicts
    node = run.node(HONEST)
    assert run.ledger.is_node_in_pool(run.state.pool_id, node)
    assert run.ledger.get_provider(run.provider(HONEST)).stake == run.stakes[HONEST]
    assert run.ledger.pending_rewards(node) + run.ledger.claimable_rewards(node) > 0
    assert run.orchestrator_node(HONEST)["state"] == "Healthy"
