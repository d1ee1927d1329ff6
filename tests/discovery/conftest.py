from __future__ import annotations

import pytest

from intellect.redis_server import EmbeddedRedis
from intellect.testing import start_devnet

REQUIREMENTS = '{"requirements": {"cpu_cores": 2, "ram_mb": 1000, "gpu": {"count": 0}}}'


@pytest.fixture(scope="module")
def devnet():
    net = start_devnet(pool_data_uri=REQUIREMENTS)
    yield net
    net.stop()


@pytest.fixture(scope="module")
def redis_url():
    with EmbeddedRedis() as redis:
        yield redis.url
