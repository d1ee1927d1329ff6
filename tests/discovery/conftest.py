from __future__ import annotations

import pytest

from tests.support.testing import start_devnet

REQUIREMENTS = '{"requirements": {"cpu_cores": 2, "ram_mb": 1000, "gpu": {"count": 0}}}'


@pytest.fixture(scope="module")
def devnet():
    """Overrides the shared fixture: this pool has hardware requirements to check uploads against."""
    net = start_devnet(pool_data_uri=REQUIREMENTS)
    yield net
    net.stop()

