"""The pool owner's CLI end to end on its own anvil: deploy -> domain -> pool -> invite -> work ->
invalidate -> slash/eject/drop rewards -> the honest node's rewards claimable after the lock."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from intellect.identity import Wallet
from intellect.wire.invites import NONCE_HEX
from ledger.cli import app
from ledger.client import LedgerClient
from ledger.dev.anvil import Anvil
from ledger.invites import Invite
from ledger.models import ONE_TOKEN

DAY = 24 * 3600


@pytest.fixture(scope="module")
def cli_chain() -> Iterator[Anvil]:
    with Anvil.start() as anvil:
        yield anvil


class Cli:
    def __init__(self, chain: Anvil, tmp: Path):
        self.chain = chain
        self.deployment = tmp / "deployment.json"
        self.home = tmp / "home"
        self.runner = CliRunner()

    def run(self, key: str | None, *args: str, expect: int = 0) -> str:
        env: dict[str, str | None] = {
            "INTELLECT_HOME": str(self.home),
            "INTELLECT_RPC_URL": self.chain.rpc_url,
            "INTELLECT_PRIVATE_KEY": key,  # None unsets it for this invocation
        }
        argv = list(args)
        if argv[0] != "deploy" and "--deployment" not in argv:
            argv += ["--deployment", str(self.deployment)]
        result = self.runner.invoke(app, argv, env=env)
        assert result.exit_code == expect, result.output
        return result.output

    def json(self, key: str | None, *args: str):
        return json.loads(self.run(key, *args, "--json"))


def test_full_scenario_through_the_cli(cli_chain: Anvil, tmp_path: Path) -> None:
    cli = Cli(cli_chain, tmp_path)
    owner, validator, bad_key, honest_key = (
        cli_chain.dev_keys[0],
        cli_chain.dev_keys[1],
        *cli_chain.dev_keys[2:4],
    )
    validator_addr = Wallet.from_key(validator).address
    bad, honest = Wallet.from_key(bad_key), Wallet.from_key(honest_key)
    bad_node, honest_node = Wallet.create(), Wallet.create()

    deployed = cli.json(owner, "deploy", "--out", str(cli.deployment), "--validator", validator_addr)
    assert set(deployed["addresses"]) == {
        "IntellectToken",
        "ComputeRegistry",
        "DomainRegistry",
        "ComputePool",
    }
    assert cli.json(owner, "create-domain", "math", "--parameters-uri", "file:///math.json") == {
        "domain_id": 1
    }
    pool = cli.json(owner, "create-pool", "--domain-id", "1", "--name", "rl", "--compute-limit", "100")
    pool_id = str(pool["pool_id"])
    assert "pool 1 started" in cli.run(owner, "start-pool", pool_id)
    assert cli.json(None, "pool", pool_id)["status"] == 1
    for who in (bad, honest):
        cli.run(owner, "mint", who.address, "1000")

    # Providers act through the ledger client (the worker's side); nodes come in by the owner's invite.
    client = LedgerClient(cli_chain.rpc_url, cli.deployment)
    for who, node, units in ((bad, bad_node, 10), (honest, honest_node, 5)):
        provider = client.with_wallet(who)
        provider.register_provider(500 * ONE_TOKEN)
        provider.add_node(node, units)
        invite = Invite.model_validate(cli.json(owner, "invite", pool_id, node.address))
        provider.join_pool(int(pool_id), node.address, invite)
    assert {n["node"] for n in cli.json(None, "nodes", pool_id)} == {bad_node.address, honest_node.address}

    bad_key_hex = "0x" + hashlib.sha256(b"bad rollouts").hexdigest()
    client.with_wallet(bad).submit_work(int(pool_id), bad_node.address, bad_key_hex, 8)
    client.with_wallet(honest).submit_work(
        int(pool_id), honest_node.address, hashlib.sha256(b"good").digest(), 6
    )
    listed = cli.json(None, "work", pool_id)
    assert [w["node"] for w in listed] == [bad_node.address, honest_node.address]
    assert "2 submission(s)" in cli.run(None, "work", pool_id)  # the table renders

    # The owner is not a validator: a clean one-line error, exit 1, no traceback.
    out = cli.run(owner, "invalidate", pool_id, bad_key_hex, expect=1)
    assert "AccessControlUnauthorizedAccount" in out and "Traceback" not in out
    out = cli.json(validator, "invalidate", pool_id, bad_key_hex)
    assert "invalidated; provider slashed 200 tokens" in out["message"]

    rows = {
        r["address"]: r for r in cli.json(None, "balances", bad.address, honest.address, bad_node.address)
    }
    assert rows[bad.address]["stake"] == 300 * ONE_TOKEN  # 500 - penalty 200
    assert rows[honest.address]["stake"] == 500 * ONE_TOKEN
    assert rows[bad_node.address]["pending_rewards"] == 0
    nodes = cli.json(None, "nodes", pool_id)
    assert [n["node"] for n in nodes] == [honest_node.address]  # the bad node was ejected
    assert nodes[0]["pending_rewards"] == 6 * ONE_TOKEN and nodes[0]["claimable_rewards"] == 0
    assert cli.json(None, "work", pool_id)[0]["node"] == honest_node.address

    cli_chain.increase_time(DAY + 1)
    nodes = cli.json(None, "nodes", pool_id)
    assert nodes[0]["claimable_rewards"] == 6 * ONE_TOKEN and nodes[0]["pending_rewards"] == 0
    before = client.balance_of(honest.address)
    assert "claimed 6 tokens" in cli.run(honest_key, "claim-rewards", honest_node.address)
    assert client.balance_of(honest.address) == before + 6 * ONE_TOKEN
    assert client.claimable_rewards(bad_node.address) == 0
    out = cli.run(validator, "invalidate", pool_id, bad_key_hex, expect=1)
    assert "WorkAlreadyInvalidated" in out

    # The audit traces the payout to the work it paid, and the invalidated work to its verdict.
    good_key = "0x" + hashlib.sha256(b"good").hexdigest()
    honest_audit = cli.json(None, "audit", "--node", honest_node.address)
    [payout] = honest_audit["payouts"]
    assert payout["amount"] == 6 * ONE_TOKEN and payout["reconciled"] and payout["provider"] == honest.address
    assert [w["work_key"] for w in payout["work"]] == [good_key]
    assert payout["work"][0]["paid_tx"] == payout["tx_hash"]
    assert payout["work"][0]["submitted_tx"].startswith("0x")
    assert honest_audit["unpaid"] == []
    bad_audit = cli.json(None, "audit", "--work-key", bad_key_hex)
    assert bad_audit["payouts"] == []
    [entry] = bad_audit["unpaid"]
    assert entry["status"] == "invalidated" and entry["dropped_tx"] and entry["units"] == 8
    assert entry["votes"] == [] and entry["node"] == bad_node.address  # one direct invalidation, no vote
    table = cli.run(None, "audit", "--node", honest_node.address)
    assert "reconciled" in table and payout["tx_hash"] in table
    assert "exactly one of" in cli.run(None, "audit", expect=1)
    assert "not 0x + 64 hex" in cli.run(None, "audit", "--work-key", "0x12", expect=1)


def test_owner_commands_and_errors(cli_chain: Anvil, tmp_path: Path) -> None:
    cli = Cli(cli_chain, tmp_path)
    owner, provider_key, other = cli_chain.dev_keys[0], cli_chain.dev_keys[4], cli_chain.dev_keys[5]
    provider = Wallet.from_key(provider_key)
    other_addr = Wallet.from_key(other).address
    cli.json(owner, "deploy", "--out", str(cli.deployment), "--stake-minimum", "2")
    cli.json(owner, "create-domain", "code")
    pool_id = str(cli.json(owner, "create-pool", "--domain-id", "1", "--name", "p", "--start")["pool_id"])

    assert "stake minimum set to 3 tokens" in cli.run(owner, "set-stake-minimum", "3")
    client = LedgerClient(cli_chain.rpc_url, cli.deployment)
    assert client.stake_minimum() == 3 * ONE_TOKEN
    cli.run(owner, "grant-validator", other_addr)
    assert client.is_validator(other_addr)
    cli.run(owner, "grant-federator", other_addr)
    assert client.is_federator(other_addr)
    cli.run(owner, "whitelist-provider", provider.address)
    assert client.get_provider(provider.address).whitelisted

    # A mixed-case address with a wrong EIP-55 checksum is a typo: refused, naming the checksummed form.
    letter = next(i for i, ch in enumerate(provider.address) if i > 1 and ch.isalpha())
    typo = provider.address[:letter] + provider.address[letter].swapcase() + provider.address[letter + 1 :]
    refused = cli.run(owner, "mint", typo, "100", expect=1)
    assert "wrong EIP-55 checksum" in refused and provider.address in refused
    assert client.balance_of(provider.address) == 0  # nothing minted
    cli.run(owner, "mint", provider.address.lower(), "100")  # all lower case carries no checksum: fine
    p = client.with_wallet(provider)
    p.register_provider(100 * ONE_TOKEN)
    nodes = [Wallet.create() for _ in range(3)]
    for i, node in enumerate(nodes):
        p.add_node(node, 1)
        p.join_pool(
            int(pool_id),
            node.address,
            Invite.model_validate(cli.json(owner, "invite", pool_id, node.address)),
        )
        p.submit_work(int(pool_id), node.address, bytes([i + 1]) * 32, 1)

    # An operator recovering a node by hand: join with a saved invite, record a file's work.
    spare = Wallet.create()
    p.add_node(spare, 1)
    invite_file = tmp_path / "invite.json"
    invite_file.write_text(cli.run(owner, "invite", pool_id, spare.address, "--json"))
    (tmp_path / "junk.json").write_text('{"pool_id": 1}')
    assert "intellect-pool invite" in cli.run(provider_key, "join", pool_id, spare.address, "--invite",
                                              str(tmp_path / "junk.json"), expect=1)  # fmt: skip
    joined = json.loads(cli.run(provider_key, "join", pool_id, spare.address, "--invite", str(invite_file),
                                "--json"))  # fmt: skip
    assert joined["transactions"][0]["tx_hash"] and client.is_node_in_pool(int(pool_id), spare.address)
    rollout = tmp_path / "rollout.parquet"
    rollout.write_bytes(b"rows" * 1000)
    assert "exactly one of" in cli.run(provider_key, "submit-work", pool_id, spare.address, "4", expect=1)
    cli.run(provider_key, "submit-work", pool_id, spare.address, "4", "--file", str(rollout))
    recorded = client.get_work(int(pool_id), hashlib.sha256(rollout.read_bytes()).digest())
    assert recorded is not None and recorded.units == 4 and recorded.node == spare.address
    cli.run(owner, "eject", pool_id, spare.address)
    cli.run(owner, "eject", pool_id, nodes[0].address)
    cli.run(owner, "blacklist-node", pool_id, nodes[1].address)
    assert client.pool_nodes(int(pool_id)) == [nodes[2].address]
    assert client.is_node_blacklisted(int(pool_id), nodes[1].address)
    cli.run(other, "soft-invalidate", pool_id, "0x" + "03" * 32)
    assert len(cli.json(None, "work", pool_id)) == 3  # 3 + 1 recorded by hand, less 1 soft-invalidated
    cli.run(owner, "blacklist-provider", provider.address, "--pool", pool_id)
    assert client.pool_nodes(int(pool_id)) == []
    cli.run(owner, "blacklist-provider", provider.address)
    assert client.get_provider(provider.address).blacklisted
    cli.run(owner, "end-pool", pool_id)
    assert cli.json(None, "pool", pool_id)["status"] == 2

    # Errors name what to fix.
    assert "not a 0x-prefixed 20-byte address" in cli.run(owner, "eject", pool_id, "0x12", expect=1)
    assert "not a token amount" in cli.run(owner, "mint", provider.address, "ten", expect=1)
    assert "must not be negative" in cli.run(owner, "mint", provider.address, "-5", expect=1)
    assert "INTELLECT_PRIVATE_KEY" in cli.run(None, "start-pool", pool_id, expect=1)
    assert "PoolAlreadyEnded" in cli.run(owner, "end-pool", pool_id, expect=1)
    assert "NotPoolCreator" in cli.run(other, "end-pool", pool_id, expect=1)
    out = cli.run(owner, "nodes", "1", "--deployment", str(tmp_path / "nope.json"), expect=1)
    assert "no deployment file" in out
    assert "work key must be 32 bytes" in cli.run(other, "invalidate", pool_id, "0x1234", expect=1)
    assert "PoolNotFound" in cli.run(None, "work", "999", expect=1)  # not an empty list and exit 0
    invite = cli.json(owner, "invite", pool_id, nodes[2].address)
    assert NONCE_HEX.fullmatch(invite["nonce"])  # the worker API's 0x + 64 hex form, not an int
    assert "--ttl" in cli.run(owner, "invite", pool_id, nodes[2].address, "--ttl", "-100", expect=2)
    for command in ("deploy", "nodes", "invalidate", "balances"):
        assert "--json" in cli.run(None, command, "--help")


def test_chain_options_before_the_command(cli_chain: Anvil, tmp_path: Path) -> None:
    """`intellect-pool --deployment D --json pool 1` holds for the command that follows (the app's
    context object); the same option after the command wins; neither given: settings from env."""
    cli = Cli(cli_chain, tmp_path)
    owner = cli_chain.dev_keys[0]
    cli.json(owner, "deploy", "--out", str(cli.deployment))
    cli.json(owner, "create-domain", "math")
    cli.json(owner, "create-pool", "--domain-id", "1", "--name", "first")
    env = {
        "INTELLECT_HOME": str(cli.home),
        "INTELLECT_RPC_URL": cli_chain.rpc_url,
        "INTELLECT_PRIVATE_KEY": None,
    }
    before = cli.runner.invoke(app, ["--deployment", str(cli.deployment), "--json", "pool", "1"], env=env)
    assert before.exit_code == 0, before.output
    assert json.loads(before.output)["name"] == "first"  # --json before the command: JSON, not a table

    missing = tmp_path / "missing.json"
    after_wins = cli.runner.invoke(
        app, ["--deployment", str(cli.deployment), "pool", "1", "--deployment", str(missing)], env=env
    )
    assert after_wins.exit_code == 1 and f"no deployment file at {missing}" in after_wins.output
    signer = cli.runner.invoke(
        app,
        ["--deployment", str(cli.deployment), "start-pool", "1"],
        env={**env, "INTELLECT_PRIVATE_KEY": owner},
    )
    assert signer.exit_code == 0 and "pool 1 started" in signer.output
    wrong_chain = cli.runner.invoke(
        app, ["--rpc-url", "http://127.0.0.1:9", "--deployment", str(cli.deployment), "pool", "1"], env=env
    )
    assert wrong_chain.exit_code == 1 and "cannot reach the chain at http://127.0.0.1:9" in wrong_chain.output
