"""A minimal worker API for orchestrator tests: accepts signed invites from the manager and joins on chain.

The real worker (`worker/`) is tested end to end in tests/e2e; this stand-in keeps the orchestrator's
tests independent of it while speaking the same HTTP contract (docs/orchestrator.md).
"""

from __future__ import annotations

from fastapi import Depends, FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool

from intellect.auth import MemoryNonceStore, RequestVerifier
from intellect.identity import Wallet
from intellect.wire.hardware import HardwareAnswer, HardwareChallenge, HardwareCommitment, HardwareReveal
from intellect.wire.invites import InviteRequest, InviteResponse
from worker.proof import HardwareProver


def standin_worker(devnet, provider: Wallet, node: Wallet,
                   prover: HardwareProver | None = None) -> tuple[FastAPI, list[InviteRequest]]:  # fmt: skip
    """With `prover`, it also answers hardware challenges (`/health`, `/hardware/*`) as the worker does."""
    from ledger.invites import Invite

    verifier = RequestVerifier(MemoryNonceStore())
    app = FastAPI()
    received: list[InviteRequest] = []

    @app.post("/invite", response_model=InviteResponse)
    async def invite(body: InviteRequest, caller: str = Depends(verifier.dependency)) -> InviteResponse:
        if caller != devnet.manager.address:
            raise HTTPException(403, "not the manager")
        received.append(body)
        client = devnet.client(provider)
        if await run_in_threadpool(client.is_node_in_pool, body.pool_id, node.address):
            return InviteResponse(accepted=True, detail="already in the pool")
        signed = Invite(domain_id=body.domain_id, pool_id=body.pool_id, node=body.node_address,
                        nonce=int(body.nonce, 16), expiration=body.expiration, signature=body.signature)
        tx = await run_in_threadpool(client.join_pool, body.pool_id, node.address, signed)
        return InviteResponse(accepted=True, tx_hash=tx.tx_hash)

    @app.get("/logs")
    async def logs(tail: int = 100, caller: str = Depends(verifier.dependency)) -> dict[str, object]:
        return {"node_address": node.address, "lines": [f"line {i}" for i in range(3)][-tail:]}

    if prover is not None:
        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.post("/hardware/challenge", response_model=HardwareCommitment)
        async def challenge(body: HardwareChallenge,
                            caller: str = Depends(verifier.dependency)) -> HardwareCommitment:  # fmt: skip
            if caller != devnet.manager.address:
                raise HTTPException(403, "not the manager")
            return await run_in_threadpool(prover.commit, body)

        @app.post("/hardware/reveal", response_model=HardwareAnswer)
        async def reveal(body: HardwareReveal, caller: str = Depends(verifier.dependency)) -> HardwareAnswer:
            if caller != devnet.manager.address:
                raise HTTPException(403, "not the manager")
            return await run_in_threadpool(prover.reveal, body)

    return app, received
