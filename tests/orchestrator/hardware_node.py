"""A node's hardware routes on loopback, as the orchestrator's challenger meets them, and challenges of
them: shared by test_hardware_client.py and test_hardware_optout.py (real HTTP, no chain)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import FastAPI, HTTPException, Response

from intellect.identity import Wallet
from intellect.wire.hardware import HardwareChallenge, HardwareCommitment, HardwareReveal
from orchestrator.clients import SignedClient
from orchestrator.hardware.challenger import challenge_node
from orchestrator.store.hardware import ProofRecord
from tests.support.testing import serve_in_thread
from worker.proof import HardwareProver

NODE = Wallet.create()


def worker(prover: HardwareProver, health_delay: float = 0.0, reveal_delay: float = 0.0,
           reveal_body: bytes | None = None,
           declines: Callable[[HardwareReveal], bool] | None = None) -> FastAPI:  # fmt: skip
    """NODE's hardware routes, answered by `prover` (the health check and the opening each late by so
    many seconds); the opening answered with `reveal_body` instead where given, refused (409) where
    `declines` it."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        await asyncio.sleep(health_delay)
        return {"status": "ok"}

    @app.post("/hardware/challenge")
    async def challenge(body: HardwareChallenge) -> HardwareCommitment:
        return prover.commit(body)

    @app.post("/hardware/reveal")
    async def reveal(body: HardwareReveal) -> Response:
        await asyncio.sleep(reveal_delay)
        if reveal_body is not None:
            return Response(reveal_body, media_type="application/json")
        if declines is not None and declines(body):
            raise HTTPException(409, "declined")
        return Response(prover.reveal(body).model_dump_json(), media_type="application/json")

    return app


def run(url: str, n: int, timeout: float = 30) -> ProofRecord:
    """One challenge of NODE at `url` (n × n, float32) by a fresh orchestrator key."""

    async def go() -> ProofRecord:
        peers = SignedClient(Wallet.create(), timeout=10, retries=1)
        try:
            return await challenge_node(peers, NODE.address, url, n, "float32", timeout=timeout)
        finally:
            await peers.aclose()

    return asyncio.run(go())


def served(app: FastAPI, *, n: int, times: int = 1, timeout: float = 30) -> list[ProofRecord]:
    """`times` challenges of the node `app` serves on loopback (stopped after)."""
    server = serve_in_thread(app)
    try:
        return [run(server.url, n, timeout) for _ in range(times)]
    finally:
        server.stop()
