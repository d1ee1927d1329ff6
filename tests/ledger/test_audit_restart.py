"""`intellect-pool audit` after the chain node restarted (issue 19.6): anvil reloads its state but no
historical state, so calls at old blocks fail; the audit still reports what the chain holds and says
what it could not see, never a traceback."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ledger_world import build_world

from ledger.audit import Auditor
from ledger.client import LedgerClient
from ledger.dev.anvil import Anvil


def test_the_audit_survives_a_chain_restart(tmp_path: Path) -> None:
    state = tmp_path / "anvil-state.json"
    with Anvil.start(state_path=state) as chain:
        world = build_world(chain)
        world.onboard(world.provider, world.node)
        key = "0x" + hashlib.sha256(b"work").hexdigest()
        world.node_client(world.node).submit_work(world.pool_id, world.node.address, key, 3)
        before = Auditor(LedgerClient(chain.rpc_url, world.deployment)).node(world.node.address)
        chain.mine(3)
    assert before.unpaid and before.notes == []
    with Anvil.start(state_path=state) as again:  # the same chain, reloaded from its state file
        client = LedgerClient(again.rpc_url, world.deployment)
        assert client.is_node_in_pool(world.pool_id, world.node.address)
        after = Auditor(client).node(world.node.address)
    assert [w.work_key for w in after.unpaid] == [key]
    assert after.unpaid[0].reward == before.unpaid[0].reward
    assert after.unpaid[0].unlock_at == before.unpaid[0].unlock_at
    assert len(after.notes) == 1 and "holds no state for block" in after.notes[0], after.notes
