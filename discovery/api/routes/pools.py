"""`GET /pools/{pool_id}/nodes`: what a pool's manager (or a validator, or the admin) may invite.

The answer is the pool's members on chain plus the candidates: registered, not blacklisted, in no
pool, from a whitelisted provider (when required) and meeting the pool's hardware requirements.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path
from fastapi.concurrency import run_in_threadpool

from discovery.api.deps import CallerDep, ChainDep, SettingsDep, StoreDep, is_validator
from intellect.wire.nodes import DiscoveredNode
from intellect.wire.requirements import PoolRequirements, parse_pool_requirements

router = APIRouter(tags=["pools"])


def eligible(record: DiscoveredNode, pool_id: int, requirements: PoolRequirements,
             require_whitelisted: bool) -> bool:
    flags = record.on_chain
    if flags.pool_id == pool_id:
        return True
    if flags.pool_id is not None or not flags.registered or flags.blacklisted:
        return False
    if require_whitelisted and not flags.provider_whitelisted:
        return False
    return not requirements.mismatches(record.metadata.compute_specs)


PoolId = Annotated[int, Path(ge=0, le=2**256 - 1, description="pool id on chain (uint256)")]


@router.get("/pools/{pool_id}/nodes", response_model=list[DiscoveredNode])
async def pool_nodes(pool_id: PoolId, who: CallerDep, settings: SettingsDep, store: StoreDep,
                     chain: ChainDep) -> list[DiscoveredNode]:
    pool = await run_in_threadpool(chain.pool, pool_id)
    if pool is None:
        raise HTTPException(404, f"pool {pool_id} does not exist on chain")
    if not who.admin and who.address != pool.manager and not await is_validator(chain, who.address or ""):
        raise HTTPException(403, f"{who.address} is neither pool {pool_id}'s manager nor a validator")
    requirements = parse_pool_requirements(pool.data_uri)
    require_whitelisted = settings.require_whitelisted_provider
    return [r for r in await store.all() if eligible(r, pool_id, requirements, require_whitelisted)]
