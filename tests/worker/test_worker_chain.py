"""Registration, resume and deregistration on a real chain."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from worker_devnet import Devnet

from intellect.identity import Wallet
from ledger.invites import sign_invite
from ledger.models import ONE_TOKEN
from worker.chain import ChainAuthorizer, RegistrationDeclined, WorkerChain
from worker.daemon import WorkerDaemon
from worker.hardware import detect
from worker.keys import WorkerKeys
from worker.runtime.recording import RecordingRuntime
from worker.settings import WorkerSettings
from worker.state import StateStore


def make_chain(devnet: Devnet, provider: Wallet) -> WorkerChain:
    return WorkerChain(
        devnet.rpc_url, devnet.deployment_path, WorkerKeys(provider=provider, node=Wallet.create())
    )


def test_registration_is_idempotent(devnet: Devnet) -> None:
    chain = make_chain(devnet, devnet.fresh_provider())
    asked = []
    txs = chain.ensure_registered(2, None, lambda plan: asked.append(plan) or True)
    assert len(txs) >= 2 and asked[0].register_stake == 3 * 10 * ONE_TOKEN  # (2 units + 1) x minimum
    node = chain.get_node()
    assert node is not None and node.provider == chain.provider and node.compute_units == 2
    # A restarted worker reads the chain and sends nothing.
    assert chain.ensure_registered(2, None, lambda plan: pytest.fail("must not ask again")) == []


def test_declined_or_unfunded_registration_spends_nothing(devnet: Devnet) -> None:
    provider = devnet.fresh_provider()
    chain = make_chain(devnet, provider)
    with pytest.raises(RegistrationDeclined, match="--yes"):
        chain.ensure_registered(1, None, lambda plan: False)
    assert devnet.admin.balance_of(provider.address) == 1000 * ONE_TOKEN
    assert not chain.get_provider().registered
    poor = make_chain(devnet, devnet.fresh_provider(tokens=5))
    with pytest.raises(RegistrationDeclined, match="fund it first"):
        poor.ensure_registered(1, None, lambda plan: True)
    with pytest.raises(RegistrationDeclined, match="raise --stake"):
        chain.ensure_registered(1, 1, lambda plan: True)


def test_second_node_of_a_provider_tops_up_the_stake(devnet: Devnet) -> None:
    provider = devnet.fresh_provider()
    make_chain(devnet, provider).ensure_registered(1, None, lambda plan: True)
    second = make_chain(devnet, provider)
    plans = []
    second.ensure_registered(1, None, lambda plan: plans.append(plan) or True)
    assert plans[0].register_stake == 0 and plans[0].extra_stake == 10 * ONE_TOKEN
    assert second.get_provider().node_count == 2


def join(devnet: Devnet, chain: WorkerChain) -> None:
    import secrets
    import time

    invite = sign_invite(
        devnet.manager,
        devnet.domain_id,
        devnet.pool_id,
        chain.node,
        secrets.randbits(64),
        int(time.time()) + 300,
    )
    chain.provider_client.join_pool(devnet.pool_id, chain.node, invite)


def test_resume_trusts_the_chain(devnet: Devnet, tmp_path: Path) -> None:
    chain = make_chain(devnet, devnet.fresh_provider())
    chain.ensure_registered(1, None, lambda plan: True)
    settings = WorkerSettings(
        rpc_url=devnet.rpc_url, deployment=devnet.deployment_path, pool_id=devnet.pool_id, state_dir=tmp_path
    )
    store = StateStore(settings.state_file)
    store.update(pool_joined=True, orchestrator_url="http://127.0.0.1:9", pool_id=devnet.pool_id)

    def daemon() -> WorkerDaemon:
        return WorkerDaemon(
            settings,
            chain.keys,
            chain,
            RecordingRuntime(),
            detect(tmp_path / "d"),
            store,
            ChainAuthorizer(chain, devnet.pool_id),
        )

    # The state file says "joined" but the chain disagrees (ejected while down): wait for an invite.
    asyncio.run(daemon()._resume())
    assert store.load().pool_joined is False and store.load().orchestrator_url is None
    # Really in the pool: keep heartbeating to the stored orchestrator.
    join(devnet, chain)
    store.update(pool_joined=True, orchestrator_url="http://127.0.0.1:9")
    asyncio.run(daemon()._resume())
    assert store.load().pool_joined is True


def test_deregister_leaves_removes_and_unbonds(devnet: Devnet) -> None:
    chain = make_chain(devnet, devnet.fresh_provider())
    chain.ensure_registered(1, None, lambda plan: True)
    join(devnet, chain)
    assert chain.in_pool(devnet.pool_id)
    txs = chain.deregister(devnet.pool_id)
    assert len(txs) == 3
    assert not chain.in_pool(devnet.pool_id) and chain.get_node() is None
    provider = chain.get_provider()
    assert not provider.registered and provider.stake == 0
    assert sum(u.amount for u in chain.provider_client.unbonds(chain.provider)) == 20 * ONE_TOKEN


def test_authorizer_roles(devnet: Devnet) -> None:
    auth = ChainAuthorizer(make_chain(devnet, devnet.fresh_provider(tokens=0)), devnet.pool_id)
    assert auth.role_of(devnet.manager.address) == "manager"
    assert auth.role_of(devnet.validator.address.lower()) == "validator"
    assert auth.role_of(Wallet.create().address) is None


def test_daemon_says_once_that_its_node_left_the_registry_and_backs_off(
    devnet: Devnet, tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deregistered behind the daemon's back: the real discovery refuses its metadata (403); the daemon
    logs why once, with what to do, and retries ever more slowly instead of every 10 s forever."""
    from discovery.app import create_app as discovery_app
    from discovery.settings import DiscoverySettings
    from tests.support.testing import ServerThread
    from worker import daemon as daemon_module

    chain = make_chain(devnet, devnet.fresh_provider())
    chain.ensure_registered(1, None, lambda plan: True)
    chain.deregister(None)
    settings = DiscoverySettings(redis_url=redis_url, rpc_url=devnet.rpc_url,
                                 deployment=devnet.deployment_path, state_dir=tmp_path / "discovery",
                                 require_whitelisted_provider=False)
    attempts: list[float] = []
    real_upload = daemon_module.upload_metadata

    async def counted(*args: Any, **kwargs: Any) -> None:
        attempts.append(asyncio.get_running_loop().time())
        await real_upload(*args, **kwargs)

    monkeypatch.setattr(daemon_module, "upload_metadata", counted)
    monkeypatch.setattr(daemon_module, "REFUSAL_BACKOFF_FIRST", 0.2)
    with ServerThread(discovery_app(settings)) as discovery:
        worker_settings = WorkerSettings(rpc_url=devnet.rpc_url, deployment=devnet.deployment_path,
                                         pool_id=devnet.pool_id, state_dir=tmp_path / "w",
                                         discovery_url=discovery.url, metadata_refresh=0.1)
        daemon = WorkerDaemon(worker_settings, chain.keys, chain, RecordingRuntime(), detect(tmp_path / "d"),
                              StateStore(worker_settings.state_file), ChainAuthorizer(chain, devnet.pool_id))

        async def run_for(seconds: float) -> None:
            loop = asyncio.create_task(daemon._metadata_loop())
            await asyncio.sleep(seconds)
            daemon._stop.set()
            await loop

        with structlog.testing.capture_logs() as logs:
            asyncio.run(run_for(2.5))
    errors = [entry["event"] for entry in logs if entry["log_level"] == "error"]
    assert len(errors) == 1, errors
    assert "403" in errors[0] and "not registered on chain" in errors[0]
    assert "intellect-worker start" in errors[0]
    # 0.2, 0.4, 0.8 s apart (then 1.6): a handful of tries in 2.5 s, not one per metadata_refresh (0.1 s).
    assert 3 <= len(attempts) <= 5
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    # Each wait at least the doubled back-off (a lower bound: a slow upload or chain read under load only
    # adds to a gap; comparing gaps with each other failed when one call happened to be slow).
    assert all(gap >= 0.95 * 0.2 * 2**k for k, gap in enumerate(gaps)), gaps


def test_an_ejected_node_stops_its_task_at_once_and_says_why(devnet: Devnet, tmp_path: Path) -> None:
    """Issue 19.4: out of the pool, nothing the task makes can be submitted: it stops, with the reason."""
    from datetime import UTC, datetime

    from intellect.wire.tasks import AssignedTask, Task, TaskSpec, TaskState

    chain = make_chain(devnet, devnet.fresh_provider())
    chain.ensure_registered(1, None, lambda plan: True)
    join(devnet, chain)
    settings = WorkerSettings(rpc_url=devnet.rpc_url, deployment=devnet.deployment_path,
                              pool_id=devnet.pool_id, state_dir=tmp_path)
    store = StateStore(settings.state_file)
    store.update(pool_joined=True, orchestrator_url="http://127.0.0.1:9", pool_id=devnet.pool_id)
    runtime = RecordingRuntime()
    daemon = WorkerDaemon(settings, chain.keys, chain, runtime, detect(tmp_path / "d"), store,
                          ChainAuthorizer(chain, devnet.pool_id))
    task = AssignedTask(task=Task(id="t-1", spec=TaskSpec(name="gen", image="img", cmd=["run"]),
                                  created_at=datetime.now(UTC)))
    asyncio.run(daemon.heartbeater._apply_and_record(task))
    assert runtime.desired == task and daemon.heartbeater.status is not None

    asyncio.run(daemon._check_membership())  # still in the pool: nothing changes
    assert runtime.desired == task and store.load().pool_joined

    chain.deregister(devnet.pool_id)  # gone behind the daemon's back (as an ejection would)
    with structlog.testing.capture_logs() as logs:
        asyncio.run(daemon._check_membership())
    assert runtime.desired is None and daemon.heartbeater.status is None
    state = store.load()
    assert state.pool_joined is False and state.last_task is not None
    assert state.last_task.state == TaskState.FAILED
    assert state.last_task.detail is not None and "not registered on chain" in state.last_task.detail
    assert any(e["event"].startswith("task stopped") and e["task_id"] == "t-1" for e in logs)
