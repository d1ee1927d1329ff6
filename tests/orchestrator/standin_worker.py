"""A minimal worker API for orchestrator tests: accepts signed invites from the manager and joins on chain.

The real worker (`worker/`) is tested end to end in tests/e2e; this stand-in keeps the orchestrator's
tests independent of it while speaking the same HTTP contract (docs/orchestrator.md).
"""

from __future__ import annotations

from fastapi import Depends, FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool

from intellect.auth import MemoryNonceStore, RequestVerifier
from intellect.identity import Wallet
from intellect.wire.invites import InviteRequest, InviteResponse


def standin_worker(devnet, provider: Wallet, node: Wallet) -> tuple[FastAPI, list[InviteRequest]]:
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

    return app, received
