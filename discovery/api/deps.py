"""FastAPI dependencies of the discovery routes: everything is read from `request.app.state`.

Why: the routes used to be closures inside `create_app` reading a local `state` dict. Now
`discovery.server` puts each object on `app.state` (settings, admin token and metrics when the app is
built; store, chain view and verifier in the lifespan, once Redis and the chain are reachable) and a
route names what it needs with one of the `Annotated` aliases below; a test can replace any of these
functions through `app.dependency_overrides`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CollectorRegistry, Counter, Gauge

from discovery.chain import CachedChainView
from discovery.settings import DiscoverySettings
from discovery.store import NodeStore
from intellect.app_state import from_app_state
from intellect.auth import RequestVerifier


@dataclass(frozen=True)
class Caller:
    """Who is reading: the admin (bearer token) or a signed address."""

    admin: bool = False
    address: str | None = None


class DiscoveryMetrics:
    """The service's Prometheus metrics, in a registry of their own (one per app, so several apps in
    one test process do not collide)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.uploads = Counter("discovery_uploads", "metadata uploads by result", ["result"],
                               registry=self.registry)
        self.known = Gauge("discovery_nodes", "node records held", registry=self.registry)
        self.syncs = Counter("discovery_syncs", "background on-chain refreshes", registry=self.registry)


get_settings = from_app_state("settings", DiscoverySettings)
get_store = from_app_state("store", NodeStore)
get_chain = from_app_state("chain", CachedChainView)
get_metrics = from_app_state("metrics", DiscoveryMetrics)


async def signed(request: Request) -> str:
    """The address that signed the request (401 for a bad signature or replay, 429 over the rate)."""
    verifier: RequestVerifier = request.app.state.verifier
    return await verifier.verify(request)


async def caller(request: Request) -> Caller:
    """A bearer header means the admin token (checked: 401/403), anything else a signed request."""
    if request.headers.get("authorization"):
        await request.app.state.admin(request)
        return Caller(admin=True)
    return Caller(address=await signed(request))


SettingsDep = Annotated[DiscoverySettings, Depends(get_settings)]
StoreDep = Annotated[NodeStore, Depends(get_store)]
ChainDep = Annotated[CachedChainView, Depends(get_chain)]
MetricsDep = Annotated[DiscoveryMetrics, Depends(get_metrics)]
SignerDep = Annotated[str, Depends(signed)]
CallerDep = Annotated[Caller, Depends(caller)]


async def is_validator(chain: CachedChainView, address: str) -> bool:
    return await run_in_threadpool(chain.is_validator, address)
