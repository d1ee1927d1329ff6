"""The challenger against workers that do not play along (real HTTP on loopback, no chain): an answer
too big to read is refused before it is parsed, a node nobody can reach costs a few seconds and proves
nothing, and a commitment not signed by the node is none (the probe stays secret)."""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI
from hardware_node import NODE, run, served, worker

from intellect.identity import Wallet
from intellect.net import free_port
from intellect.wire.hardware import MAX_ANSWER_BYTES
from orchestrator.clients import SignedClient
from orchestrator.store.hardware import UNANSWERED, UNOPENED
from tests.support.testing import serve_in_thread
from worker.proof import HardwareProver


def honest(signer: Wallet = NODE) -> HardwareProver:
    """A node that commits and opens honestly, its commitments signed by `signer`."""
    return HardwareProver(NODE.address, signer.sign_message)


def test_an_answer_too_big_to_read_is_refused_before_it_is_parsed() -> None:
    huge = b'{"rows": [' + b"1.0," * (MAX_ANSWER_BYTES // 4) + b'1.0]}'
    [proof] = served(worker(honest(), reveal_body=huge), n=32)
    # it committed first, so an opening too big to read is no opening: it fails like a wrong answer
    assert proof.outcome == UNOPENED and f"over {MAX_ANSWER_BYTES} bytes" in proof.reasons[0]
    assert proof.flops is None and proof.rtt_ms is not None


def test_a_node_nobody_can_reach_proves_nothing_quickly() -> None:
    started = time.monotonic()
    proof = run(f"http://127.0.0.1:{free_port()}", 32)
    assert proof.outcome == UNANSWERED and proof.reasons[0].startswith("round trip")
    assert time.monotonic() - started < 10


def test_a_commitment_signed_by_another_key_is_no_commitment_and_convicts_nobody() -> None:
    """Checked before the secret is revealed: the node never sees the probe, so it chose nothing by it
    (unanswered, no evidence). A signed commitment opened in words not the node's own:
    tests/orchestrator/test_hardware_optout.py."""
    [proof] = served(worker(honest(signer=Wallet.create())), n=32)
    assert proof.outcome == UNANSWERED and "not signed by the node's key" in " ".join(proof.reasons)
    assert proof.evidence is None


def test_a_round_trip_pass_records_links_both_ends_measured(tmp_path) -> None:
    """`round_trip_pass` over real HTTP on loopback: each callable Healthy node measures the others'
    peer inboxes through its own worker route; a link counts once both ends measured it, and a node
    behind NAT (never called) leaves its links unmeasured."""
    from types import SimpleNamespace

    from orchestrator.db import make_engine, migrate, session_factory
    from orchestrator.hardware.round_trips import round_trip_pass
    from orchestrator.models import NodeRow, utcnow
    from orchestrator.store.round_trips import RoundTripBook
    from worker.api import hardware_router, manager_only

    def member() -> FastAPI:
        app = FastAPI()
        app.include_router(hardware_router)
        app.dependency_overrides[manager_only] = lambda: "0xmanager"
        return app

    servers = [serve_in_thread(member()) for _ in range(2)]
    try:
        rows = []
        for i, server in enumerate([*servers, None]):
            port = int(server.url.rsplit(":", 1)[1]) if server else free_port()
            rows.append(NodeRow(address=f"0x{i:040x}", state="Healthy", ip_address="127.0.0.1", port=port,
                                joined_via="push" if server else "pull", created_at=utcnow()))  # fmt: skip
        engine = make_engine(f"sqlite:///{tmp_path / 'o.db'}")
        migrate(engine)
        book = RoundTripBook(session_factory(engine))
        ctx = SimpleNamespace(book=SimpleNamespace(all=lambda states: rows), round_trips=book,
                              peers=SignedClient(Wallet.create(), timeout=10, retries=1))  # fmt: skip

        async def go() -> int:
            try:
                return await round_trip_pass(ctx)  # type: ignore[arg-type]
            finally:
                await ctx.peers.aclose()

        assert asyncio.run(go()) == 2
    finally:
        for server in servers:
            server.stop()
    a, b, behind_nat = (r.address for r in rows)
    links = book.links()
    assert list(links) == [frozenset((a, b))] and 0 < links[frozenset((a, b))] < 1000
    assert book.measured_at()[a].keys() == {b, behind_nat}  # measured (unreachable: no figure), not a link
