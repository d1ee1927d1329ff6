"""On-chain admission checks for uploaded metadata (sync: run in a thread)."""

from __future__ import annotations

from discovery.chain import ChainView
from intellect.errors import PeerRefused
from intellect.wire.nodes import NodeMetadata, OnChainFlags
from intellect.wire.requirements import parse_pool_requirements


def read_flags(chain: ChainView, node_address: str, provider_address: str,
               pool_id: int | None = None) -> OnChainFlags:
    node = chain.node(node_address)
    if node is None:
        return OnChainFlags()
    provider = chain.provider(node.provider)
    blacklisted = bool(provider and provider.blacklisted)
    check_pool = node.pool_id or pool_id
    if check_pool and chain.node_blacklisted(check_pool, node_address):
        blacklisted = True
    return OnChainFlags(
        registered=node.provider == provider_address,
        provider_whitelisted=bool(provider and provider.whitelisted),
        blacklisted=blacklisted,
        validated=node.validated,
        pool_id=node.pool_id,
        compute_units=node.compute_units,
    )


def admit(chain: ChainView, metadata: NodeMetadata, *, require_whitelisted: bool,
          pool_id: int | None) -> OnChainFlags:
    """The node's on-chain flags, or PeerRefused naming what the node's owner has to fix."""
    node = chain.node(metadata.node_address)
    if node is None:
        raise PeerRefused(403, f"node {metadata.node_address} is not registered on chain: "
                           "the provider must add it (ComputeRegistry.addNode)")
    if node.provider != metadata.provider_address:
        raise PeerRefused(403, f"node {metadata.node_address} is registered under provider {node.provider}, "
                           f"not {metadata.provider_address}")
    flags = read_flags(chain, metadata.node_address, metadata.provider_address, pool_id)
    provider = chain.provider(node.provider)
    if provider is None or not provider.registered:
        raise PeerRefused(403, f"provider {node.provider} is not registered on chain")
    if provider.blacklisted:
        raise PeerRefused(403, f"provider {node.provider} is blacklisted")
    if flags.blacklisted:
        raise PeerRefused(403, f"node {metadata.node_address} is blacklisted in pool "
                                f"{node.pool_id or pool_id}")
    if require_whitelisted and not provider.whitelisted:
        raise PeerRefused(403, f"provider {node.provider} is not whitelisted: "
                                "ask the pool owner to whitelist it")
    if pool_id is not None:
        pool = chain.pool(pool_id)
        if pool is not None:
            problems = parse_pool_requirements(pool.data_uri).mismatches(metadata.compute_specs)
            if problems:
                raise PeerRefused(422, f"node does not meet pool {pool_id}'s hardware requirements: "
                                   + "; ".join(problems))
    return flags
