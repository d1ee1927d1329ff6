"""The `servers` fixture of the broadcast tests (helpers live in helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.broadcast.helpers import RelayProcess
from tests.support.testing import ServerThread


@pytest.fixture
def servers() -> Iterator[list[ServerThread | RelayProcess]]:
    """Collects everything a test starts; stops it all at the end, in reverse order."""
    started: list[ServerThread | RelayProcess] = []
    yield started
    for server in reversed(started):
        if isinstance(server, RelayProcess):
            server.kill()
        else:
            server.stop()
