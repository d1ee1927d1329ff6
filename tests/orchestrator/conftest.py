"""Orchestrator fixtures: a discovery service, and the SQL database behind the stores (SQLite and a real
PostgreSQL)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from postgres_cluster import PostgresCluster, postgres_bin, start_cluster

from discovery.app import create_app as create_discovery
from discovery.chain import LedgerChainView
from discovery.settings import DiscoverySettings
from tests.support.testing import serve_in_thread

_names = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """One throw-away cluster for the session; each test gets its own database in it."""
    if postgres_bin() is None:
        reason = "no PostgreSQL binaries (initdb) on this machine; scripts/ci-services.sh installs them"
        print(f"SKIP postgres variant: {reason}")
        pytest.skip(reason)
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """An empty database URL of each kind the orchestrator supports."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'orchestrator.db'}"
    cluster: PostgresCluster = request.getfixturevalue("postgres")
    return cluster.fresh_database(f"t{next(_names)}")


@pytest.fixture(scope="module")
def discovery(devnet, redis_url, tmp_path_factory):
    """A discovery service on the module's Redis, syncing pool membership from the devnet."""
    settings = DiscoverySettings(redis_url=redis_url, state_dir=tmp_path_factory.mktemp("disc"),
                                 sync_interval_seconds=0.5, chain_cache_seconds=0, max_nodes_per_ip=50)
    server = serve_in_thread(create_discovery(settings, LedgerChainView(devnet.client())))
    yield server.url
    server.stop()
