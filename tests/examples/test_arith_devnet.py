"""The third workload (examples/arith) on a devnet, with no line of the services written for it: a
trainer posts an `arith` task with the Python SDK; two workers run it (`intellect-worker start`,
process runtime), one of them a cheater whose operator injects `INTELLECT_ARITH_CHEAT` into every
task it runs; a voting validator (`intellect-validator run`) judges every file with the plug-in the
task names. The honest node's files are accepted and its rewards are paid on chain once the lock
passes; the cheater's are invalidated, its stake slashed and it is ejected from the pool.

Real anvil, Redis, discovery, orchestrator, workers and validator processes, started as `intellect
devnet up` starts them (`devnet.network.up`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from devnet import network
from devnet.demo import DEMO_REWARD_LOCK_SECONDS, DemoPlan, configure_chain, start_validator
from devnet.placement import Placement
from devnet.processes import wait_healthy
from intellect.client import OrchestratorClient
from intellect.identity import Wallet
from intellect.net import stable_port
from ledger.client import LedgerClient

pytestmark = pytest.mark.slow
PROBLEMS, FILES = 16, 2


def verdicts(url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/verdicts", params={"limit": 1000}, timeout=10).json()["items"]


def test_a_third_workload_is_paid_and_its_cheater_slashed_on_a_devnet(tmp_path: Path) -> None:
    directory = tmp_path / "devnet"
    cheat = {"INTELLECT_WORKER_TASK_ENV": json.dumps({"INTELLECT_ARITH_CHEAT": "wrong-answer"})}
    state = network.up(directory, progress=lambda msg: None, workers=2, worker_env={2: cheat})
    try:
        configure_chain(state, DemoPlan(validators=1, quorum=1))
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
        honest, cheater = state.account("node-1").address, state.account("node-2").address
        cheater_provider = state.account("provider-2").address
        stake_before = ledger.get_provider(cheater_provider).stake
        deadline = time.monotonic() + 120
        while not all(ledger.is_node_in_pool(state.pool_id, n) for n in (honest, cheater)):
            assert time.monotonic() < deadline, "the workers never joined the pool"
            time.sleep(1)

        token = (directory / "orchestrator" / "admin-token").read_text().strip()
        with OrchestratorClient(orchestrator.url, token=token) as client:  # a trainer, with the SDK
            task = client.submit({
                "name": "arith",
                "workload": {"type": "arith", "settings": {"problems": PROBLEMS, "files": FILES}},
                "entrypoint": [sys.executable, "-m", "intellect_arith"],  # process runtime: this Python
            })  # fmt: skip
        assert task.judged and task.spec.workload is not None and task.spec.workload.type == "arith"
        assert task.spec.env_vars["INTELLECT_ARITH_PROBLEMS"] == str(PROBLEMS)  # rendered by the plug-in

        deadline = time.monotonic() + 300
        while True:
            seen = verdicts(validator.url)
            mine = [v for v in seen if v["node"].lower() == honest.lower()]
            theirs = [v for v in seen if v["node"].lower() == cheater.lower()]
            ejected = not ledger.is_node_in_pool(state.pool_id, cheater)
            if len(mine) >= FILES and theirs and ejected:
                break
            assert time.monotonic() < deadline, f"verdicts so far: {seen}; cheater ejected: {ejected}"
            time.sleep(2)
        assert [v["verdict"] for v in mine] == ["accept"] * FILES
        assert all(v["tokens"] == PROBLEMS for v in mine)
        assert all(v["verdict"] == "invalidate" for v in theirs)
        assert any("answers wrong" in r for r in theirs[0]["reasons"]), theirs[0]
        assert ledger.get_provider(cheater_provider).stake < stake_before  # slashed by the quorum
        assert ledger.claimable_rewards(cheater) + ledger.pending_rewards(cheater) == 0
        assert ledger.is_node_in_pool(state.pool_id, honest)  # nobody else paid for the cheat

        # Paid on chain: past the reward lock the honest node's rewards are claimable, minted to its
        # provider.
        earned = ledger.pending_rewards(honest) + ledger.claimable_rewards(honest)
        assert earned > 0
        ledger.w3.provider.make_request("evm_increaseTime", [DEMO_REWARD_LOCK_SECONDS + 1])
        ledger.w3.provider.make_request("evm_mine", [])
        assert ledger.claimable_rewards(honest) == earned
        provider = state.account("provider-1").address
        payer = LedgerClient(state.rpc_url, Path(state.deployment_path),  # the node's operator claims
                             Wallet.from_key(state.account("provider-1").private_key))  # fmt: skip
        before = payer.balance_of(provider)
        payer.claim_rewards(honest)
        assert payer.balance_of(provider) == before + earned
    finally:
        network.down(directory, purge=False, progress=lambda msg: None)
