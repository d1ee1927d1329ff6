"""The worker API on a real chain: only the pool's manager invites, validators read logs, no replays."""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from worker_devnet import Devnet

from intellect import hardware
from intellect.identity import Wallet, verify_message
from intellect.signing import SignedAuth, sign_request
from intellect.wire.hardware import (
    HardwareAnswer,
    HardwareChallenge,
    HardwareCommitment,
    answer_text,
    commitment_text,
)
from intellect.wire.invites import InviteRequest
from intellect.wire.tasks import AssignedTask, Task, TaskSpec
from ledger.invites import sign_invite
from worker.api import ApiContext, create_app
from worker.chain import ChainAuthorizer, WorkerChain
from worker.daemon import WorkerDaemon
from worker.hardware import detect
from worker.keys import WorkerKeys
from worker.proof import HardwareProver
from worker.runtime.recording import RecordingRuntime
from worker.settings import WorkerSettings
from worker.state import StateStore


@pytest.fixture
def worker(devnet: Devnet, tmp_path: Path, server_thread):
    keys = WorkerKeys(provider=devnet.fresh_provider(), node=Wallet.create())
    settings = WorkerSettings(
        rpc_url=devnet.rpc_url, deployment=devnet.deployment_path, pool_id=devnet.pool_id, state_dir=tmp_path
    )
    chain = WorkerChain(settings.rpc_url, settings.resolved_deployment(), keys)
    chain.ensure_registered(1, None, lambda plan: True)
    runtime = RecordingRuntime()
    daemon = WorkerDaemon(
        settings,
        keys,
        chain,
        runtime,
        detect(tmp_path / "data"),
        StateStore(settings.state_file),
        ChainAuthorizer(chain, devnet.pool_id),
    )
    ctx = ApiContext(
        node_address=keys.node.address,
        pool_id=devnet.pool_id,
        authorizer=daemon.authorizer,
        runtime=runtime,
        on_invite=daemon.handle_invite,
        health=daemon.health,
        prover=HardwareProver(keys.node.address, keys.node.sign_message),
    )
    with server_thread(create_app(ctx)) as server:
        yield server, daemon, keys, chain


def invite_body(devnet: Devnet, node: str, signer: Wallet | None = None, **over: object) -> bytes:
    nonce = secrets.randbits(256)
    expiration = int(time.time()) + 600
    invite = sign_invite(signer or devnet.manager, devnet.domain_id, devnet.pool_id, node, nonce, expiration)
    req = InviteRequest(
        domain_id=devnet.domain_id,
        pool_id=devnet.pool_id,
        node_address=node,
        nonce=f"0x{nonce:064x}",
        expiration=expiration,
        signature=invite.signature,
        orchestrator_url="http://127.0.0.1:9/",
    )
    return req.model_copy(update=over).model_dump_json().encode()


def post_invite(url: str, body: bytes, wallet: Wallet | None) -> httpx.Response:
    auth = SignedAuth(wallet) if wallet else None
    return httpx.post(
        f"{url}/invite", content=body, auth=auth, timeout=30, headers={"Content-Type": "application/json"}
    )


def test_health_is_public(worker) -> None:
    server, _, keys, _ = worker
    body = httpx.get(f"{server.url}/health").json()
    assert body["node_address"] == keys.node.address and body["pool_joined"] is False


def test_unsigned_and_stranger_invites_are_refused(worker, devnet: Devnet) -> None:
    server, _, keys, chain = worker
    body = invite_body(devnet, keys.node.address)
    assert post_invite(server.url, body, None).status_code == 401
    stranger = Wallet.create()
    refused = post_invite(server.url, invite_body(devnet, keys.node.address, signer=stranger), stranger)
    only = f"only pool {devnet.pool_id}'s manager may invite"
    assert refused.status_code == 403
    # Not "neither the manager nor a validator": a validator may not invite either.
    assert refused.json()["detail"] == f"{only}; {stranger.address} is not the manager"
    by_validator = post_invite(server.url, body, devnet.validator)
    assert by_validator.status_code == 403
    assert by_validator.json()["detail"] == f"{only}; {devnet.validator.address} is a validator"
    assert not chain.in_pool(devnet.pool_id)


def test_invite_for_another_node_or_pool_or_expired(worker, devnet: Devnet) -> None:
    server, _, keys, _ = worker
    other = Wallet.create().address
    r = post_invite(server.url, invite_body(devnet, other), devnet.manager)
    assert r.status_code == 400 and "this node is" in r.json()["detail"]
    r = post_invite(
        server.url, invite_body(devnet, keys.node.address, pool_id=devnet.pool_id + 5), devnet.manager
    )
    assert r.status_code == 400 and "serves pool" in r.json()["detail"]
    r = post_invite(
        server.url, invite_body(devnet, keys.node.address, expiration=int(time.time()) - 1), devnet.manager
    )
    assert r.status_code == 400 and "expired" in r.json()["detail"]


def test_invite_with_a_forged_signature_reverts_on_chain(worker, devnet: Devnet) -> None:
    server, _, keys, chain = worker
    forged = invite_body(devnet, keys.node.address, signer=Wallet.create())
    r = post_invite(server.url, forged, devnet.manager)
    assert r.status_code == 409 and "InvalidInviteSignature" in r.json()["detail"]
    assert not chain.in_pool(devnet.pool_id)


def test_manager_invite_joins_the_pool_and_is_persisted(worker, devnet: Devnet) -> None:
    server, daemon, keys, chain = worker
    r = post_invite(server.url, invite_body(devnet, keys.node.address), devnet.manager)
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] and r.json()["tx_hash"].startswith("0x")
    assert chain.in_pool(devnet.pool_id)
    state = daemon.store.load()
    assert state.pool_joined and state.orchestrator_url == "http://127.0.0.1:9/" and state.join_tx
    # A second invite (e.g. from a restarted orchestrator) re-attaches without a transaction.
    again = post_invite(
        server.url, invite_body(devnet, keys.node.address, orchestrator_url="http://o2"), devnet.manager
    )
    assert again.status_code == 200 and again.json()["tx_hash"] is None
    assert daemon.store.load().orchestrator_url == "http://o2"
    assert httpx.get(f"{server.url}/health").json()["pool_joined"] is True


def test_logs_and_restart_for_validator_and_manager_only(worker, devnet: Devnet) -> None:
    server, daemon, _, _ = worker
    runtime: RecordingRuntime = daemon.runtime  # type: ignore[assignment]
    runtime.restart()
    r = httpx.get(f"{server.url}/logs?tail=5", auth=SignedAuth(devnet.validator))
    assert r.status_code == 200 and any("restart" in line for line in r.json()["lines"])
    # The reply says what happened: with no task assigned there was nothing to restart.
    assert httpx.post(f"{server.url}/restart", auth=SignedAuth(devnet.manager)).json() == {
        "restarted": False,
        "detail": "no task assigned: nothing to restart",
    }
    assert runtime.restarts == 2
    task = Task(id="t-1", spec=TaskSpec(name="t", image="img"), created_at=datetime.now(UTC))
    runtime.apply(AssignedTask(task=task))
    assert httpx.post(f"{server.url}/restart", auth=SignedAuth(devnet.validator)).json() == {
        "restarted": True,
        "detail": "task t-1 running: recorded (no runtime)",
    }
    assert httpx.get(f"{server.url}/logs", auth=SignedAuth(Wallet.create())).status_code == 403
    assert httpx.get(f"{server.url}/logs?tail=-1", auth=SignedAuth(devnet.manager)).status_code == 422


def test_metrics_are_public_prometheus_text(worker, devnet: Devnet) -> None:
    server, daemon, _, _ = worker
    runtime: RecordingRuntime = daemon.runtime  # type: ignore[assignment]
    runtime.metrics = lambda: {"tokens_per_second": 12.5}  # type: ignore[method-assign]
    r = httpx.get(f"{server.url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "worker_pool_joined 0.0" in r.text and "worker_heartbeating 0.0" in r.text
    assert 'worker_task_metric{name="tokens_per_second"} 12.5' in r.text


def test_replayed_request_is_refused(worker, devnet: Devnet) -> None:
    server, _, _, _ = worker
    headers = sign_request(devnet.validator, "GET", "/logs?tail=3")
    assert httpx.get(f"{server.url}/logs?tail=3", headers=headers).status_code == 200
    replay = httpx.get(f"{server.url}/logs?tail=3", headers=headers)
    assert replay.status_code == 401 and "replayed" in replay.json()["detail"]
    # The signature covers the query: the same headers on another query are refused too.
    other = sign_request(devnet.validator, "GET", "/logs?tail=3")
    assert httpx.get(f"{server.url}/logs?tail=4", headers=other).status_code == 401
    stale = sign_request(devnet.validator, "GET", "/logs", timestamp=int(time.time()) - 3600)
    skewed = httpx.get(f"{server.url}/logs", headers=stale)
    assert skewed.status_code == 401 and "clock" in skewed.json()["detail"]


def test_openapi_fuzz_unsigned_and_signed_by_a_stranger(worker, devnet: Devnet) -> None:
    """schemathesis over the worker's own API: no 5xx, every answer documented, bodies on schema."""
    from tests.support.openapi_fuzz import run_fuzz

    server, *_ = worker
    for sign_key in (None, Wallet.create().private_key_hex()):
        ran = run_fuzz(server.url, sign_key=sign_key, examples=15)
        assert "POST /invite" in ran, ran


def test_hardware_challenges_are_answered_for_the_pool_only_and_once(worker, devnet: Devnet) -> None:
    """The worker's side of docs/hardware.md: the manager (or a validator) challenges, the node commits
    to C = A·B with its key, then answers the probe once; what it signs checks out."""
    server, _, keys, _ = worker
    challenge = HardwareChallenge(challenge_id=secrets.token_hex(32), n=48, precision="bfloat16")

    def post(path: str, body: HardwareChallenge | bytes, wallet: Wallet | None) -> httpx.Response:
        content = body if isinstance(body, bytes) else body.model_dump_json().encode()
        auth = SignedAuth(wallet) if wallet else None
        return httpx.post(f"{server.url}/hardware/{path}", content=content, auth=auth,
                          headers={"Content-Type": "application/json"}, timeout=30)  # fmt: skip

    assert post("challenge", challenge, None).status_code == 401
    assert post("challenge", challenge, Wallet.create()).status_code == 403
    too_big = challenge.model_dump() | {"n": hardware.MAX_N + 1}
    assert post("challenge", json.dumps(too_big).encode(), devnet.manager).status_code == 422
    made = post("challenge", challenge, devnet.validator)
    assert made.status_code == 200, made.text
    commitment = HardwareCommitment.model_validate(made.json())
    assert commitment.node_address == keys.node.address
    said = commitment_text(challenge, keys.node.address, commitment.root)
    assert verify_message(said, commitment.signature, keys.node.address)
    secret = secrets.token_bytes(32)
    reveal = {"challenge_id": challenge.challenge_id, "secret": secret.hex()}
    other = post("reveal", json.dumps({**reveal, "challenge_id": "f" * 64}).encode(), devnet.manager)
    assert other.status_code == 409 and "not the one held here" in other.json()["detail"]
    answered = post("reveal", json.dumps(reveal).encode(), devnet.manager)
    assert answered.status_code == 200, answered.text
    answer = HardwareAnswer.model_validate(answered.json())
    said = answer_text(challenge.challenge_id, keys.node.address, secret.hex(), answer.cr, answer.rows,
                       answer.proofs)  # fmt: skip
    assert verify_message(said, answer.signature, keys.node.address)
    a, b = hardware.matrices(challenge.challenge_id, keys.node.address, challenge.n, challenge.precision)
    result = hardware.check(a, b, challenge.precision, commitment.root, hardware.probe(secret, challenge.n),
                            answer.cr, answer.rows, answer.proofs)  # fmt: skip
    assert result.ok, result.reasons
    again = post("reveal", json.dumps(reveal).encode(), devnet.manager)  # a second probe would open more rows
    assert again.status_code == 409


def test_round_trips_are_measured_for_the_pool_only_and_bounded(worker, devnet: Devnet) -> None:
    """`POST /hardware/round-trips`: the manager names peer inboxes, the worker answers
    the shortest TCP handshake to each (null for one nobody answers); strangers and long lists refused."""
    from intellect.net import free_port
    from intellect.wire.hardware import MAX_PEERS

    server, *_ = worker
    own = server.url.removeprefix("http://")
    body = json.dumps({"peers": [own, f"127.0.0.1:{free_port()}", "not-an-address"]}).encode()

    def post(content: bytes, wallet: Wallet | None) -> httpx.Response:
        return httpx.post(f"{server.url}/hardware/round-trips", content=content,
                          auth=SignedAuth(wallet) if wallet else None,
                          headers={"Content-Type": "application/json"}, timeout=30)  # fmt: skip

    assert post(body, None).status_code == 401
    assert post(body, Wallet.create()).status_code == 403
    refused = post(body, devnet.validator)  # a validator may challenge, not make the node open connections
    assert refused.status_code == 403 and "manager may call /hardware/round-trips" in refused.json()["detail"]
    many = json.dumps({"peers": [own] * (MAX_PEERS + 1)}).encode()
    assert post(many, devnet.manager).status_code == 422
    measured = post(body, devnet.manager)
    assert measured.status_code == 200, measured.text
    ms = measured.json()["ms"]
    assert len(ms) == 3 and 0 < ms[0] < 1000 and ms[1] is None and ms[2] is None
