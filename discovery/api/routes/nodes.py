"""`/nodes`: a node uploads its own signed metadata; readers get records by access tier.

`PUT /nodes` is signed by the node key and admitted only after the on-chain checks of
`discovery.checks.admit` and the per-IP limit. `GET /nodes` is for validators and the admin;
`GET /nodes/{address}` also for the node itself and the manager of the pool it is in.
"""

from __future__ import annotations

from datetime import UTC, datetime

from eth_utils import is_address, to_checksum_address
from fastapi import APIRouter, HTTPException
from fastapi.concurrency import run_in_threadpool

from discovery.api.deps import CallerDep, ChainDep, MetricsDep, SettingsDep, SignerDep, StoreDep, is_validator
from discovery.checks import admit
from intellect.errors import PeerRefused
from intellect.wire.nodes import DiscoveredNode, NodeMetadata

router = APIRouter(tags=["nodes"])


@router.put("/nodes", response_model=DiscoveredNode)
async def upload(metadata: NodeMetadata, signer: SignerDep, settings: SettingsDep, store: StoreDep,
                 chain: ChainDep, metrics: MetricsDep) -> DiscoveredNode:
    if signer != metadata.node_address:
        metrics.uploads.labels("wrong_signer").inc()
        raise HTTPException(403, f"metadata for {metadata.node_address} must be signed by that node's "
                                 f"key; it was signed by {signer}")
    try:
        flags = await run_in_threadpool(
            admit, chain, metadata,
            require_whitelisted=settings.require_whitelisted_provider, pool_id=settings.pool_id,
        )
    except PeerRefused as exc:
        metrics.uploads.labels("refused").inc()
        raise HTTPException(exc.status, exc.reason) from None
    others = await store.others_at_ip(metadata.ip_address, metadata.node_address)
    if len(others) >= settings.max_nodes_per_ip:
        metrics.uploads.labels("ip_limit").inc()
        raise HTTPException(409, f"IP {metadata.ip_address} already has {len(others)} nodes "
                                 f"(limit {settings.max_nodes_per_ip})")
    previous = await store.get(metadata.node_address)
    now = datetime.now(UTC)
    record = DiscoveredNode(metadata=metadata, on_chain=flags,
                            first_seen=previous.first_seen if previous else now, last_updated=now)
    await store.put(record, previous)
    metrics.uploads.labels("accepted").inc()
    return record


@router.get("/nodes", response_model=list[DiscoveredNode])
async def all_nodes(who: CallerDep, store: StoreDep, chain: ChainDep) -> list[DiscoveredNode]:
    if not who.admin and not await is_validator(chain, who.address or ""):
        raise HTTPException(403, "only validators and the admin may list every node")
    return await store.all()


@router.get("/nodes/{address}", response_model=DiscoveredNode)
async def one_node(address: str, who: CallerDep, store: StoreDep, chain: ChainDep) -> DiscoveredNode:
    if not is_address(address):
        raise HTTPException(400, f"{address} is not an Ethereum address")
    address = to_checksum_address(address)
    record = await store.get(address)
    allowed = who.admin or who.address == address
    if not allowed and record and record.on_chain.pool_id is not None:
        pool = await run_in_threadpool(chain.pool, record.on_chain.pool_id)
        allowed = pool is not None and pool.manager == who.address
    if not allowed:
        allowed = await is_validator(chain, who.address or "")
    if not allowed:
        raise HTTPException(403, "only the node, its pool's manager, validators and the admin may read "
                                 "a node's record")
    if record is None:
        raise HTTPException(404, f"no metadata for node {address}")
    return record
