from __future__ import annotations

import pytest

from intellect.redis_server import EmbeddedRedis
from intellect.testing import ServerThread  # noqa: F401  (re-exported for test_signing)


@pytest.fixture(scope="module")
def redis_server():
    with EmbeddedRedis() as redis:
        yield redis
