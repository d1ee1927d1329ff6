"""`/nodes/{address}/invite`: the mailbox for nodes behind NAT (`discovery/invite_box.py`).

`PUT` is signed by the manager of the pool the invite is for (as the orchestrator signs every call);
`GET` by the node itself, which then joins on chain exactly as when its API is called (the contract
checks the invite's signature); `DELETE` by either, once the invite is used.
"""

from __future__ import annotations

import time
from typing import Annotated

from eth_utils import is_address, to_checksum_address
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from discovery.api.deps import ChainDep, SignerDep
from discovery.invite_box import InviteBox
from intellect.wire.invites import InviteRequest

router = APIRouter(tags=["invites"])


def get_box(request: Request) -> InviteBox:
    box: InviteBox = request.app.state.invites
    return box


BoxDep = Annotated[InviteBox, Depends(get_box)]


def _node(address: str) -> str:
    if not is_address(address):
        raise HTTPException(400, f"{address} is not an Ethereum address")
    return to_checksum_address(address)


@router.put("/nodes/{address}/invite", status_code=204)
async def leave_invite(address: str, invite: InviteRequest, signer: SignerDep, chain: ChainDep,
                       box: BoxDep) -> None:  # fmt: skip
    node = _node(address)
    if to_checksum_address(invite.node_address) != node:
        raise HTTPException(400, f"the invite is for {invite.node_address}, not {node}")
    if invite.expiration <= int(time.time()):
        raise HTTPException(400, "the invite has already expired")
    pool = await run_in_threadpool(chain.pool, invite.pool_id)
    if pool is None:
        raise HTTPException(404, f"pool {invite.pool_id} does not exist on chain")
    if pool.manager != signer:
        raise HTTPException(403, f"only pool {invite.pool_id}'s manager may leave its invites; "
                                 f"{signer} is not")
    await box.put(invite)


@router.get("/nodes/{address}/invite", response_model=InviteRequest)
async def fetch_invite(address: str, signer: SignerDep, box: BoxDep) -> InviteRequest:
    node = _node(address)
    if signer != node:
        raise HTTPException(403, f"only {node} may read its invite; the request was signed by {signer}")
    invite = await box.get(node)
    if invite is None:
        raise HTTPException(404, f"no invite waits for {node}")
    return invite


@router.delete("/nodes/{address}/invite", status_code=204)
async def drop_invite(address: str, signer: SignerDep, chain: ChainDep, box: BoxDep) -> None:
    node = _node(address)
    invite = await box.get(node)
    if invite is None:
        return
    if signer != node:
        pool = await run_in_threadpool(chain.pool, invite.pool_id)
        if pool is None or pool.manager != signer:
            raise HTTPException(403, f"only {node} or its inviter may drop its invite")
    await box.delete(node)
