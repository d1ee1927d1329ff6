from __future__ import annotations

from collections.abc import Iterator

import pytest

from intellect.redis_server import EmbeddedRedis
from tests.support.testing import ServerThread  # noqa: F401  (re-exported for test_signing)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[EmbeddedRedis]:
    """A real redis-server of this module's own (see tests/conftest.py for why not a shared one)."""
    with EmbeddedRedis() as server:
        yield server
