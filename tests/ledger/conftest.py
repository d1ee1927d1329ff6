"""Fixtures: one real anvil and one deployment per session; every test runs between an
evm_snapshot and an evm_revert, so tests see the same fresh state and cannot leak into each other."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ledger_world import World, build_world

from ledger.dev.anvil import Anvil


@pytest.fixture(scope="session")
def chain() -> Iterator[Anvil]:
    with Anvil.start() as anvil:
        yield anvil


@pytest.fixture(scope="session")
def world_snapshot(chain: Anvil) -> tuple[World, str]:
    return build_world(chain), chain.snapshot()


@pytest.fixture()
def world(world_snapshot: tuple[World, str]) -> Iterator[World]:
    w, _ = world_snapshot
    snap = w.chain.snapshot()
    try:
        yield w
    finally:
        w.chain.revert(snap)
