"""`intellect-pool audit --group`: a group batch's members' files joined with the chain. Three members
submit their files (two alone, one in a batch); one is soft-invalidated; after the lock the providers
claim. The audit says who served which layers, what each file locked and what was paid, and names every
gap: a member whose file is missing, a file the chain never took, a submitter that is not the member its
receipt names, a claim above the receipt's share, receipts that disagree."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from ledger_world import World
from typer.testing import CliRunner

from intellect.identity import Wallet
from intellect.wire.receipts import GroupReceipt, ReceiptError, StageReceipt, read_receipt
from ledger.audit import Auditor
from ledger.cli import app
from ledger.group_audit import GroupAuditor
from ledger.models import ONE_TOKEN

DAY = 24 * 3600
THIRD = Wallet.from_key("0x" + "33" * 32)


def receipt(nodes: list[str], stage: int, batch: int = 1, units: tuple[int, ...] = (8, 4, 4)) -> dict:
    spans = [(0, 2), (2, 3), (3, 4)]
    members = [StageReceipt(stage=i, node=n, layers=spans[i], units=units[i],
                            received_sha256="" if i == 0 else f"{i:064x}",
                            sent_sha256="" if i == 2 else f"{i + 1:064x}")
               for i, n in enumerate(nodes)]  # fmt: skip
    r = GroupReceipt(task_id="task-1", group_id="g-1", batch=batch, model="tiny", model_layers=4,
                     output_tokens=16, stage=stage, members=members)  # fmt: skip
    return r.model_dump(mode="json")


def member_file(folder: Path, nodes: list[str], stage: int, **kw: object) -> tuple[Path, str]:
    """A member's file as the pipeline writes it: the receipt among fields the audit does not read."""
    body = {"format": "intellect-pipeline-batch/4", "stage": stage, "outputs": [[1, 2, 3]] * 4,
            "sent_frames": [["QUJD" * 500]], "receipt": receipt(nodes, stage, **kw)}  # fmt: skip
    path = folder / f"batch{kw.get('batch', 1)}-stage{stage}.json"
    path.write_text(json.dumps(body))
    return path, "0x" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_audit_of_a_group_batch_names_who_served_what_and_was_paid(world: World, tmp_path: Path) -> None:
    world.onboard(world.provider, world.node)
    world.onboard(world.provider, THIRD, nonce=3)
    world.onboard(world.provider2, world.node2)
    world.chain.rpc("anvil_setBalance", [THIRD.address, hex(10**20)])
    nodes = [world.node.address, world.node2.address, THIRD.address]
    files = [member_file(tmp_path, nodes, stage) for stage in range(3)]
    (p0, k0), (p1, k1), (p2, k2) = files
    world.provider.submit_work(world.pool_id, world.node.address, k0, 8)
    world.provider2.submit_work_batch(world.pool_id, world.node2.address, [(k1, 4)])
    world.node_client(THIRD).submit_work(world.pool_id, THIRD.address, k2, 4)
    world.validator.soft_invalidate_work(world.pool_id, k1)  # stage 1's file: not paid
    world.chain.increase_time(2 * DAY)
    world.provider.claim_rewards(world.node.address)
    world.provider.claim_rewards(THIRD.address)

    found = GroupAuditor(Auditor(world.admin)).audit([p2, p0, p1, p0])  # any order, a file twice
    [batch] = found.batches
    assert (batch.task_id, batch.group_id, batch.batch, batch.output_tokens) == ("task-1", "g-1", 1, 16)
    assert batch.problems == []
    got = [(m.stage, m.node, m.layers, m.units, m.work_key, m.submitted_by, m.units_on_chain, m.status)
           for m in batch.members]  # fmt: skip
    assert got == [
        (0, nodes[0], (0, 2), 8, k0, nodes[0], 8, "paid"),
        (1, nodes[1], (2, 3), 4, k1, nodes[1], 4, "soft_invalidated"),
        (2, nodes[2], (3, 4), 4, k2, nodes[2], 4, "paid"),
    ]
    reward = world.admin.get_work(world.pool_id, k0)
    assert reward is not None and batch.members[0].paid == reward.reward == 8 * ONE_TOKEN
    assert [m.paid for m in batch.members] == [8 * ONE_TOKEN, 0, 4 * ONE_TOKEN]
    assert batch.paid == 12 * ONE_TOKEN
    assert all(m.paid_tx for m in batch.members if m.status == "paid")
    assert batch.members[1].received_sha256 == f"{1:064x}" and batch.members[1].sent_sha256 == f"{2:064x}"

    # Gaps: another batch whose stage 2 never reached the chain and whose stage 1 file is missing; a
    # file submitted by a node its receipt does not name, over its share; receipts that disagree.
    q0, j0 = member_file(tmp_path, nodes, 0, batch=2)
    q2, _ = member_file(tmp_path, nodes, 2, batch=2)
    world.provider2.submit_work(world.pool_id, world.node2.address, j0, 9)
    r0, _ = member_file(tmp_path, nodes, 0, batch=3)
    r1, _ = member_file(tmp_path, nodes, 1, batch=3, units=(8, 5, 4))
    again = GroupAuditor(Auditor(world.admin)).audit([q0, q2, r0, r1])
    two, three = again.batches
    assert two.batch == 2 and [m.status for m in two.members] == ["submitted", "no file", "not on chain"]
    said = " | ".join(two.problems)
    assert f"submitted by {nodes[1]}, the receipt names {nodes[0]}" in said
    assert "9 units claimed on chain, the receipt states 8" in said
    assert "stage 1 (" in said and "no file given" in said
    assert "stage 2: batch2-stage2.json" in said and "never submitted" in said
    assert any("state the batch differently: members" in p for p in three.problems), three.problems

    # The pool owner's CLI: a table, --json, and clear errors for files without a receipt.
    deployment = world.deployment.save(tmp_path / "deployment.json")
    env = {"INTELLECT_RPC_URL": world.chain.rpc_url, "INTELLECT_HOME": str(tmp_path / "home"),
           "INTELLECT_PRIVATE_KEY": None}  # fmt: skip
    runner = CliRunner()

    def cli(*args: str, code: int = 0) -> str:
        result = runner.invoke(app, ["audit", *args, "--deployment", str(deployment)], env=env)
        assert result.exit_code == code, result.output
        return result.output

    table = cli("--group", str(p0), "--group", str(p1), "--group", str(p2))
    assert "batch 1: 16 tokens through 4 layers" in table and "paid for this batch: 12 tokens" in table
    as_json = json.loads(cli("--group", str(p0), "--group", str(p1), "--group", str(p2), "--json"))
    assert [m["status"] for m in as_json["batches"][0]["members"]] == ["paid", "soft_invalidated", "paid"]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"format": "intellect-pipeline-batch/3", "stage": 0}))
    assert "no group receipt: receipt" in cli("--group", str(plain), code=1)
    assert "exactly one of" in cli("--group", str(p0), "--node", nodes[0], code=1)
    assert "cannot read it" in cli("--group", str(tmp_path / "absent.json"), code=1)


def test_a_receipt_is_read_bounded_and_must_describe_one_ring(tmp_path: Path) -> None:
    nodes = ["0x" + f"{i:040x}" for i in (1, 2, 3)]
    path, key = member_file(tmp_path, nodes, 1)
    r, sha = read_receipt(path)
    assert (r.stage, r.own.node, "0x" + sha) == (1, nodes[1], key)
    with pytest.raises(ReceiptError, match="over the 100-byte limit"):
        read_receipt(path, max_bytes=100)
    bad = json.loads(path.read_text())
    bad["receipt"]["members"][1]["layers"] = [2, 4]  # overlaps stage 2
    path.write_text(json.dumps(bad))
    with pytest.raises(ReceiptError, match="do not follow layer 4"):
        read_receipt(path)
    bad["receipt"]["members"][1]["layers"] = [2, 3]
    bad["receipt"]["stage"] = 3
    path.write_text(json.dumps(bad))
    with pytest.raises(ReceiptError, match="stage 3 of 3 members"):
        read_receipt(path)
    path.write_bytes(b"[" * 100_000)
    with pytest.raises(ReceiptError, match="no group receipt"):
        read_receipt(path)
