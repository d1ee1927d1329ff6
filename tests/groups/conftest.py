from __future__ import annotations

import pytest

from intellect.redis_server import EmbeddedRedis
from intellect.testing import start_devnet


@pytest.fixture(scope="module")
def devnet():
    net = start_devnet()
    yield net
    net.stop()


@pytest.fixture(scope="module")
def redis_url():
    with EmbeddedRedis() as redis:
        yield redis.url
