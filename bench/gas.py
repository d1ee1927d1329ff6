"""Gas used by every state-changing contract call, measured on a fresh local anvil.

.venv/bin/python bench/gas.py               # table
.venv/bin/python bench/gas.py --json        # machine-readable
.venv/bin/python bench/gas.py --write-doc   # the table of docs/contracts.md, regenerated in place

A second table prices one file recorded alone (`submitWork`) and inside batches of 1, 8, 32 and 128
files (`submitWorkBatch`), per file, side by side, steady state (the node has submitted before).

docs/contracts.md's table sits between `<!-- bench/gas.py: start -->` and `<!-- bench/gas.py: end -->`;
tests/docs/test_doc_figures.py fails when it and a fresh run differ by more than 10 % in any row,
or a row is missing.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from intellect.identity import Wallet  # noqa: E402
from ledger.client import LedgerClient  # noqa: E402
from ledger.deploy import _constructor_data, deploy_all  # noqa: E402
from ledger.dev.anvil import Anvil  # noqa: E402
from ledger.invites import sign_invite  # noqa: E402
from ledger.models import ONE_TOKEN, TxResult  # noqa: E402
from ledger.tx import TxSender  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))  # appended: bench/validator.py must not shadow
from doc_tables import markers, write_block  # noqa: E402

DAY = 24 * 3600


def measure() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []

    def rec(contract: str, call: str, result: TxResult | list[TxResult]) -> None:
        results = result if isinstance(result, list) else [result]
        rows.append({"contract": contract, "call": call, "gas": results[0].gas_used})

    with Anvil.start() as chain:
        admin_w, prov_w, prov2_w, manager_w = (Wallet.from_key(k) for k in chain.dev_keys[:4])
        deployment = deploy_all(chain.rpc_url, admin_w)
        admin = LedgerClient(chain.rpc_url, deployment, admin_w)
        for name in ("IntellectToken", "ComputeRegistry", "DomainRegistry", "ComputePool"):
            code = admin.w3.eth.get_code(deployment.address(name))
            rows.append({"contract": name, "call": f"deploy ({len(code)} bytes)", "gas": None})
        # deployment gas: re-send each constructor and read its receipt
        tx = TxSender(admin.w3, admin_w, chain_key="bench")
        a = admin_w.address
        ctor_args = {
            "IntellectToken": [a],
            "ComputeRegistry": [a, deployment.address("IntellectToken"), 10 * ONE_TOKEN],
            "DomainRegistry": [a],
            "ComputePool": [a, *(deployment.address(n) for n in ("IntellectToken", "ComputeRegistry",
                                                                   "DomainRegistry")), ONE_TOKEN],
        }  # fmt: skip
        for row in rows:
            name = str(row["contract"])
            row["gas"] = tx.send(None, _constructor_data(name, ctor_args[name]))["gasUsed"]

        prov = admin.with_wallet(prov_w)
        node, node2, node3 = Wallet.create(), Wallet.create(), Wallet.create()
        for n in (node, node2, node3):
            chain.rpc("anvil_setBalance", [n.address, hex(10**20)])
        rec("IntellectToken", "mint", admin.mint(prov_w.address, 10_000 * ONE_TOKEN))
        admin.mint(prov2_w.address, 10_000 * ONE_TOKEN)
        rec("IntellectToken", "transfer", prov.transfer(prov2_w.address, ONE_TOKEN))
        rec("IntellectToken", "approve", prov.approve(admin.registry.address, 10_000 * ONE_TOKEN))
        rec("ComputeRegistry", "grantRole (grant_validator)", admin.grant_validator(a)[1])
        rec(
            "DomainRegistry",
            "createDomain",
            admin._tx(admin.domains, "createDomain", "math", "file:///m.json"),
        )
        rec("DomainRegistry", "updateParametersURI", admin.update_domain_parameters(1, "file:///m2.json"))
        rec(
            "ComputePool",
            "createPool",
            admin._tx(admin.pools, "createPool", 1, manager_w.address, "p", "x", 0),
        )
        rec("ComputePool", "startPool", admin.start_pool(1))
        rec("ComputeRegistry", "registerProvider", prov.register_provider(2000 * ONE_TOKEN))
        rec("ComputeRegistry", "increaseStake", prov.increase_stake(100 * ONE_TOKEN))
        rec("ComputeRegistry", "addNode", prov.add_node(node, 10))
        prov.add_node(node2, 10)
        prov.add_node(node3, 1)
        rec("ComputeRegistry", "setNodeValidated", admin.validate_node(node.address))
        rec("ComputeRegistry", "setProviderWhitelisted", admin.whitelist_provider(prov_w.address))
        rec("ComputeRegistry", "setProviderBlacklisted", admin.blacklist_provider(prov2_w.address))
        rec("ComputeRegistry", "setStakeMinimum", admin.set_stake_minimum(10 * ONE_TOKEN))
        rec("ComputeRegistry", "setUnbondingPeriod", admin.set_unbonding_period(7 * DAY))
        rec("ComputeRegistry", "setTreasury", admin.set_treasury(a))
        exp = admin.timestamp() + 3600
        inv = sign_invite(manager_w, 1, 1, node.address, 1, exp)
        rec("ComputePool", "joinComputePool", prov.join_pool(1, node.address, inv))
        prov.join_pool(1, node2.address, sign_invite(manager_w, 1, 1, node2.address, 2, exp))
        prov.join_pool(1, node3.address, sign_invite(manager_w, 1, 1, node3.address, 3, exp))
        keys = [hashlib.sha256(str(i).encode()).digest() for i in range(4)]
        rec(
            "ComputePool",
            "submitWork (first)",
            admin.with_wallet(node).submit_work(1, node.address, keys[0], 5),
        )
        rec(
            "ComputePool",
            "submitWork (next)",
            admin.with_wallet(node).submit_work(1, node.address, keys[1], 5),
        )
        prov.submit_work(1, node2.address, keys[2], 5)
        rec("ComputePool", "softInvalidateWork", admin.soft_invalidate_work(1, keys[1]))
        rec("ComputePool", "invalidateWork (slash+eject)", admin.invalidate_work(1, keys[2]))
        # slashing by quorum: two pool validators, 2-of-2; the final vote slashes and ejects
        node4 = Wallet.create()
        chain.rpc("anvil_setBalance", [node4.address, hex(10**20)])
        prov.add_node(node4, 1)
        prov.join_pool(1, node4.address, sign_invite(manager_w, 1, 1, node4.address, 9, exp))
        mgr = admin.with_wallet(manager_w)
        rec("ComputePool", "addPoolValidator", mgr.slashing.add_validator(1, a))
        mgr.slashing.add_validator(1, manager_w.address)
        rec("ComputePool", "setSlashingPolicy", mgr.slashing.set_policy(1, 2, 200 * ONE_TOKEN, DAY))
        prov.submit_work(1, node4.address, keys[3], 5)
        rec("ComputePool", "voteInvalidate (1st of 2)", admin.slashing.vote_invalidate(1, keys[3]))
        rec("ComputePool", "voteInvalidate (final: slash+eject)", mgr.slashing.vote_invalidate(1, keys[3]))
        rec("ComputePool", "voteInvalidate (after the decision)", admin.slashing.vote_invalidate(1, keys[3]))
        # a file inside a batch, voted out by the same 2-of-2 quorum
        node5 = Wallet.create()
        prov.add_node(node5, 1)
        prov.join_pool(1, node5.address, sign_invite(manager_w, 1, 1, node5.address, 10, exp))
        batch = [(hashlib.sha256(f"b{i}".encode()).digest(), 5) for i in range(32)]
        prov.submit_work_batch(1, node5.address, batch)
        admin.slashing.vote_invalidate(1, batch[7][0])
        rec("ComputePool", "voteInvalidate (final, a file of a 32-file batch)",
            mgr.slashing.vote_invalidate(1, batch[7][0]))  # fmt: skip
        rec("ComputePool", "leaveComputePool", prov.leave_pool(1, node3.address))
        prov.join_pool(1, node3.address, sign_invite(manager_w, 1, 1, node3.address, 4, exp))
        rec("ComputePool", "ejectNode", admin.eject_node(1, node3.address))
        rec("ComputePool", "blacklistNode", admin.blacklist_node(1, node3.address))
        rec("ComputePool", "blacklistProvider (pool)", admin.blacklist_pool_provider(1, prov2_w.address))
        chain.increase_time(DAY + 1)
        rec("ComputePool", "claimRewards", prov.claim_rewards(node.address))
        rec("ComputePool", "setParameters", admin.set_work_parameters(ONE_TOKEN, DAY, DAY, 200 * ONE_TOKEN))
        rec("ComputePool", "setWhitelistRequired", admin.set_whitelist_required(False))
        rec("ComputePool", "endPool (1 node left)", admin.end_pool(1))
        rec("ComputeRegistry", "removeNode", prov.remove_node(node3.address))
        rec("ComputeRegistry", "startUnbonding", prov.start_unbonding(100 * ONE_TOKEN))
        admin.grant_role("ComputeRegistry", "POOL_ROLE", a)
        rec("ComputeRegistry", "slash", admin.slash(prov_w.address, 50 * ONE_TOKEN))
        prov.remove_node(node.address)
        prov.remove_node(node2.address)
        prov.remove_node(node4.address)
        prov.remove_node(node5.address)
        rec("ComputeRegistry", "deregisterProvider", prov.deregister_provider())
        chain.increase_time(7 * DAY + 1)
        rec("ComputeRegistry", "claimUnbonded", prov.claim_unbonded())
    return rows


BATCH_SIZES = (1, 8, 32, 128)


def measure_batches() -> list[dict[str, object]]:
    """Gas per file: single submissions vs batches of each size, every figure the second of its kind
    for the node (its reward recipient and lock list already exist: the steady state)."""
    out: list[dict[str, object]] = []
    with Anvil.start() as chain:
        admin_w, prov_w, manager_w = (Wallet.from_key(k) for k in chain.dev_keys[:3])
        admin = LedgerClient(chain.rpc_url, deploy_all(chain.rpc_url, admin_w), admin_w)
        admin.mint(prov_w.address, 10_000 * ONE_TOKEN)
        prov = admin.with_wallet(prov_w)
        prov.approve(admin.registry.address, 10_000 * ONE_TOKEN)
        prov.register_provider(2000 * ONE_TOKEN)
        domain = admin.create_domain("math", "file:///m.json")
        pool = admin.create_pool(domain, manager_w.address, "p", "x", 0)
        admin.start_pool(pool)
        node = Wallet.create()
        prov.add_node(node, 10)
        exp = admin.timestamp() + 3600
        prov.join_pool(pool, node.address, sign_invite(manager_w, domain, pool, node.address, 1, exp))
        counter = iter(range(10**9))

        def fresh(n: int) -> list[tuple[bytes, int]]:
            return [(hashlib.sha256(f"f{next(counter)}".encode()).digest(), 5) for _ in range(n)]

        prov.submit_work(pool, node.address, fresh(1)[0][0], 5)
        single = prov.submit_work(pool, node.address, fresh(1)[0][0], 5).gas_used
        for n in BATCH_SIZES:
            prov.submit_work_batch(pool, node.address, fresh(n))
            gas = prov.submit_work_batch(pool, node.address, fresh(n)).gas_used
            out.append({"files": n, "batch_gas": gas, "per_file": gas // n, "single_per_file": single,
                        "saving": round(single / (gas / n), 2)})  # fmt: skip
    return out


DOC = Path(__file__).resolve().parent.parent / "docs" / "contracts.md"
START, END = markers("bench/gas.py")


def label(row: dict[str, object]) -> str:
    """A row's name in the doc: the call, with the deployed size for deployments."""
    return str(row["call"])


def markdown(rows: list[dict[str, object]]) -> str:
    lines = ["| contract | call | gas |", "|---|---|---:|"]
    for r in rows:
        gas = "" if r["gas"] is None else f"{r['gas']:,}"
        lines.append(f"| {r['contract']} | {label(r)} | {gas} |")
    return "\n".join(lines)


def write_doc(rows: list[dict[str, object]], doc: Path = DOC) -> None:
    write_block(doc, "bench/gas.py", markdown(rows))


def main(
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    write: bool = typer.Option(False, "--write-doc", help="regenerate the table in docs/contracts.md"),
) -> None:
    """Deploy on a fresh anvil, run every state-changing call once, print gas used."""
    rows = measure()
    batches = measure_batches()
    if write:
        write_doc(rows)
        print(f"wrote {len(rows)} rows to {DOC}")
        return
    if as_json:
        print(json.dumps({"calls": rows, "batches": batches}, indent=2))
        return
    table = Table(title="gas used per call (fresh anvil, solc 0.8.37, optimizer 200 runs)")
    for col in ("contract", "call", "gas"):
        table.add_column(col, justify="right" if col == "gas" else "left")
    for r in rows:
        table.add_row(str(r["contract"]), str(r["call"]), f"{r['gas']:,}")
    Console().print(table)
    per_file = Table(title="gas per file: submitWork alone vs submitWorkBatch (steady state)")
    for col in ("files per batch", "batch gas", "per file", "submitWork per file", "saving"):
        per_file.add_column(col, justify="right")
    for b in batches:
        per_file.add_row(str(b["files"]), f"{b['batch_gas']:,}", f"{b['per_file']:,}",
                         f"{b['single_per_file']:,}", f"{b['saving']}x")  # fmt: skip
    Console().print(per_file)


if __name__ == "__main__":
    typer.run(main)
