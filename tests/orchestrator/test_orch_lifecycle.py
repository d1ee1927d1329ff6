"""Orchestrator node lifecycle against real anvil, Redis, discovery and uvicorn servers."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
from lifecycle_world import Orchestrator, upload
from standin_worker import standin_worker

from intellect import hardware
from intellect.hardware_evidence import judge
from intellect.identity import Wallet
from intellect.signing import SignedAuth, sign_request
from intellect.wire.hardware import (
    HardwareChallenge,
    HardwareCommitment,
    HardwareReveal,
    answer_text,
    commitment_text,
)
from intellect.wire.heartbeat import HeartbeatRequest, TaskStatus
from intellect.wire.tasks import TaskState
from tests.support.testing import serve_in_thread, wait_for
from worker.proof import HardwareProver, _Held


def test_invite_heartbeat_task_death_ejection_and_return(devnet, redis_url, discovery, tmp_path):
    orch = Orchestrator(devnet, redis_url, discovery, tmp_path / "orch").start()
    try:
        provider = devnet.new_provider()
        node = devnet.new_node(provider)
        app, invites = standin_worker(devnet, provider, node)
        worker = serve_in_thread(app)
        upload(discovery, node, provider, worker.url)
        # discovered → invited (signed by the manager, joined on chain) → WaitingForHeartbeat
        wait_for(lambda: orch.node(node.address).get("state") == "WaitingForHeartbeat", what="invite")
        assert devnet.client().is_node_in_pool(devnet.pool_id, node.address)
        assert invites[0].orchestrator_url == orch.url
        # first heartbeat → Healthy, no task yet
        r = orch.heartbeat(node)
        assert r.status_code == 200, r.text
        assert r.json()["current_task"] is None and r.json()["interval_seconds"] == 0.5
        assert orch.node(node.address)["state"] == "Healthy"
        # a posted task is handed out and the reported state is kept
        spec = {"name": "rollouts", "image": "intellect/inference:dev", "cmd": ["run", "${TASK_ID}"]}
        created = orch.admin("POST", "/tasks", json=spec)
        assert created.status_code == 201, created.text
        task_id = created.json()["id"]
        assigned = orch.heartbeat(node).json()["current_task"]
        assert assigned["task"]["id"] == task_id
        status = TaskStatus(task_id=task_id, state=TaskState.RUNNING, config_hash="abc")
        assert orch.heartbeat(node, HeartbeatRequest(task=status, metrics={"tok_s": 12.5})).status_code == 200
        record = orch.node(node.address)
        assert record["task"]["state"] == "running" and record["metrics"] == {"tok_s": 12.5}
        logs = orch.admin("GET", f"/nodes/{node.address}/logs?tail=2")
        assert logs.status_code == 200 and logs.json()["lines"] == ["line 1", "line 2"]
        # silence → Unhealthy → Dead; a beat before the ejection grace brings it back, nothing on chain
        wait_for(lambda: orch.node(node.address)["state"] == "Unhealthy", what="Unhealthy")
        wait_for(lambda: orch.node(node.address)["state"] == "Dead", what="Dead")
        assert devnet.client().is_node_in_pool(devnet.pool_id, node.address)
        assert orch.heartbeat(node).status_code == 200
        wait_for(lambda: orch.node(node.address)["state"] == "Healthy", what="Healthy again (a healed link)")
        assert devnet.client().is_node_in_pool(devnet.pool_id, node.address)
        # silence past the grace → Dead → ejected on chain
        wait_for(lambda: orch.node(node.address)["state"] == "Dead", what="Dead again")
        wait_for(lambda: orch.node(node.address)["state"] == "Ejected", what="Ejected")
        assert not devnet.client().is_node_in_pool(devnet.pool_id, node.address)
        r = orch.heartbeat(node)
        assert r.status_code == 403 and "ejected" in r.json()["detail"]
        # the node comes back (re-uploads its metadata, every few seconds as a worker's refresh does: an
        # upload stamped before the orchestrator recorded the ejection does not count as coming back)
        # → re-invited and joins again
        refreshed = [0.0]

        def reinvited() -> bool:
            if time.monotonic() - refreshed[0] > 3:
                upload(discovery, node, provider, worker.url)
                refreshed[0] = time.monotonic()
            # once invited the node may heartbeat at once: Healthy is as good as WaitingForHeartbeat
            state = orch.node(node.address)["state"]
            return len(invites) >= 2 and state in ("WaitingForHeartbeat", "Healthy")

        wait_for(reinvited, timeout=40, what="re-invite")
        assert devnet.client().is_node_in_pool(devnet.pool_id, node.address)

        def beats_back() -> bool:
            # a beat makes it Healthy; on a busy machine the monitor may find it late again before the
            # read (the interval is 0.5 s), so beat until a read right after a beat says Healthy
            return orch.heartbeat(node).status_code == 200 and orch.node(node.address)["state"] == "Healthy"

        wait_for(beats_back, timeout=20, what="Healthy after the re-invite")
        listing = orch.admin("GET", "/nodes").json()
        assert listing["counts"]["Healthy"] >= 1
        metrics = httpx.get(orch.url + "/metrics").text
        assert 'orchestrator_heartbeats_total{result="ok"}' in metrics
        assert "orchestrator_ejections_total 1.0" in metrics
        worker.stop()
    finally:
        orch.stop()


def test_heartbeat_refusals(devnet, redis_url, discovery, tmp_path):
    orch = Orchestrator(devnet, redis_url, discovery, tmp_path / "orch", run_background_loops=False).start()
    try:
        stranger = Wallet.create()
        r = orch.heartbeat(stranger)
        assert r.status_code == 404 and "not known to this orchestrator" in r.json()["detail"]
        body = HeartbeatRequest().model_dump_json().encode()
        # bad signature: body changed after signing
        headers = sign_request(stranger, "POST", "/heartbeat", b"{}")
        r = httpx.post(orch.url + "/heartbeat", content=body, headers=headers)
        assert r.status_code == 401 and "does not match" in r.json()["detail"]
        # a node heartbeating as another: claims another address in the header
        other = Wallet.create()
        headers = {**sign_request(stranger, "POST", "/heartbeat", body), "X-Intellect-Address": other.address}
        r = httpx.post(orch.url + "/heartbeat", content=body, headers=headers)
        assert r.status_code == 401
        # an address in the body is refused outright: the identity is the signer
        forged = b'{"node_address": "' + other.address.encode() + b'"}'
        r = httpx.post(orch.url + "/heartbeat", content=forged, auth=SignedAuth(stranger))
        assert r.status_code == 422
        # replay
        headers = sign_request(stranger, "POST", "/heartbeat", body)
        first = httpx.post(orch.url + "/heartbeat", content=body, headers=headers)
        assert first.status_code == 404
        r = httpx.post(orch.url + "/heartbeat", content=body, headers=headers)
        assert r.status_code == 401 and "replayed" in r.json()["detail"]
        # clock skew
        headers = sign_request(stranger, "POST", "/heartbeat", body, timestamp=int(time.time()) + 3600)
        r = httpx.post(orch.url + "/heartbeat", content=body, headers=headers)
        assert r.status_code == 401 and "off the server clock" in r.json()["detail"]
    finally:
        orch.stop()


def test_task_api_validation_and_auth(devnet, redis_url, discovery, tmp_path):
    orch = Orchestrator(devnet, redis_url, discovery, tmp_path / "orch", run_background_loops=False).start()
    try:
        assert httpx.get(orch.url + "/tasks").status_code == 401
        wrong = {"Authorization": "Bearer " + "x" * 40}
        assert httpx.get(orch.url + "/tasks", headers=wrong).status_code == 403
        bad = orch.admin("POST", "/tasks", json={"name": "t", "image": "i", "cmd": ["${NOPE}"]})
        assert bad.status_code == 422 and "unknown template variable ${NOPE}" in bad.text
        bad = orch.admin("POST", "/tasks", json={"name": "t", "image": "i", "surprise": 1})
        assert bad.status_code == 422 and "surprise" in bad.text
        mounts = [{"host_path": "/../etc", "container_path": "/x"}]
        bad = orch.admin("POST", "/tasks", json={"name": "t", "image": "i", "volume_mounts": mounts})
        assert bad.status_code == 422 and "host_path" in bad.text
        assert orch.admin("GET", "/tasks/nope").status_code == 404
        made = orch.admin("POST", "/tasks", json={"name": "t", "image": "i"}).json()
        assert [t["id"] for t in orch.admin("GET", "/tasks").json()] == [made["id"]]
        assert orch.admin("DELETE", f"/tasks/{made['id']}").json()["deleted"] is True
        assert orch.admin("GET", "/tasks").json() == []
        assert len(orch.admin("GET", "/tasks?include_deleted=true").json()) == 1
    finally:
        orch.stop()


def test_restart_keeps_tasks_and_nodes_and_reconciles_unknown_pool_members(devnet, redis_url, discovery,
                                                                           tmp_path):
    provider = devnet.new_provider()
    node = devnet.new_node(provider)
    app, invites = standin_worker(devnet, provider, node)
    worker = serve_in_thread(app)
    upload(discovery, node, provider, worker.url)
    orch = Orchestrator(devnet, redis_url, discovery, tmp_path / "orch").start()
    try:
        wait_for(lambda: orch.node(node.address).get("state") == "WaitingForHeartbeat", what="invite")
        assert orch.heartbeat(node).status_code == 200
        task = orch.admin("POST", "/tasks", json={"name": "keep-me", "image": "i"}).json()
    finally:
        orch.stop()
    # same state dir: tasks and nodes survive
    orch = Orchestrator(devnet, redis_url, discovery, tmp_path / "orch").start()
    try:
        assert [t["id"] for t in orch.admin("GET", "/tasks").json()] == [task["id"]]
        assert orch.node(node.address)["state"] in ("Healthy", "Unhealthy")
        assert orch.heartbeat(node).json()["current_task"]["task"]["id"] == task["id"]
    finally:
        orch.stop()
    # a fresh database (lost state): the node is in the pool on chain, so it is reconciled and re-invited
    fresh = Orchestrator(devnet, redis_url, discovery, tmp_path / "fresh").start()
    try:
        count = len(invites)
        wait_for(lambda: len(invites) > count, what="re-invite of a pool member unknown locally")
        assert invites[-1].orchestrator_url == fresh.url
        assert fresh.heartbeat(node).status_code == 200
        assert fresh.node(node.address)["state"] == "Healthy"
    finally:
        fresh.stop()
        worker.stop()


def test_waiting_for_heartbeat_never_sticks_and_ban(devnet, redis_url, discovery, tmp_path):
    provider = devnet.new_provider()
    node = devnet.new_node(provider)
    app, invites = standin_worker(devnet, provider, node)
    worker = serve_in_thread(app)
    upload(discovery, node, provider, worker.url)
    orch = Orchestrator(devnet, redis_url, discovery, tmp_path / "orch", invite_timeout_seconds=1.5).start()
    try:
        wait_for(lambda: len(invites) >= 2, what="a second invite after the WaitingForHeartbeat timeout")
        assert orch.heartbeat(node).status_code == 200
        banned = orch.admin("POST", f"/nodes/{node.address}/ban")
        assert banned.status_code == 200 and banned.json()["tx_hash"]
        assert devnet.client().is_node_blacklisted(devnet.pool_id, node.address)
        assert not devnet.client().is_node_in_pool(devnet.pool_id, node.address)
        r = orch.heartbeat(node)
        assert r.status_code == 403 and "banned" in r.json()["detail"]
    finally:
        orch.stop()
        worker.stop()


class ReplayingProver(HardwareProver):
    """A liar: commits to the product of another challenge's matrices (an answer made once and replayed),
    signed with its own key, so what it said is evidence."""

    def commit(self, challenge: HardwareChallenge) -> HardwareCommitment:
        a, b = hardware.matrices("0" * 64, self.node_address, challenge.n, challenge.precision)
        product = hardware.multiply(a, b, challenge.precision)
        levels = hardware.merkle_levels(product)
        self._held = _Held(challenge, product, levels, time.monotonic())
        root = levels[-1][0].hex()
        signature = self.sign(commitment_text(challenge, self.node_address, root))
        return HardwareCommitment(challenge_id=challenge.challenge_id, node_address=self.node_address,
                                  root=root, seconds=0.0, signature=signature)


def signed_wrong_answer(node: Wallet) -> dict:
    """Evidence of a wrong answer in `node`'s own signed words: an honest round whose C·r it then
    changed and signed again (a member that stopped computing after it joined)."""
    prover = HardwareProver(node.address, node.sign_message)
    challenge = HardwareChallenge(challenge_id=secrets.token_hex(32), n=32, precision="float32")
    commitment = prover.commit(challenge)
    secret = secrets.token_hex(32)
    answer = prover.reveal(HardwareReveal(challenge_id=challenge.challenge_id, secret=secret)).model_dump()
    answer["cr"] = [x + 1000.0 for x in answer["cr"]]
    answer["signature"] = node.sign_message(answer_text(challenge.challenge_id, node.address, secret,
                                                        answer["cr"], answer["rows"], answer["proofs"]))
    return {"challenge": challenge.model_dump(), "commitment": commitment.model_dump(), "secret": secret,
            "answer": answer}


def test_hardware_is_proven_before_the_invite_and_a_wrong_answer_is_refused(devnet, redis_url, discovery,
                                                                            tmp_path):  # fmt: skip
    orch = Orchestrator(devnet, redis_url, discovery, tmp_path / "orch", hardware_n=96,
                        hardware_recheck_seconds=0).start()
    servers = []
    try:
        nodes = {}
        for kind, prover_type in (("honest", HardwareProver), ("liar", ReplayingProver)):
            provider = devnet.new_provider()
            node = devnet.new_node(provider)
            prover = prover_type(node.address, node.sign_message)
            app, invites = standin_worker(devnet, provider, node, prover)
            servers.append(serve_in_thread(app))
            upload(discovery, node, provider, servers[-1].url)
            nodes[kind] = (node, invites, provider)
        honest, liar = nodes["honest"][0].address, nodes["liar"][0].address
        wait_for(lambda: orch.node(honest).get("state") == "WaitingForHeartbeat", what="the honest invited")
        figures = orch.node(honest)["hardware"]
        assert figures["outcome"] == "proven" and figures["n"] == 96 and figures["precision"] == "float32"
        assert figures["flops"] > 0 and figures["rtt_ms"] > 0
        wait_for(lambda: "answered wrongly" in (orch.node(liar).get("reason") or ""), what="the liar refused")
        record = orch.node(liar)
        assert record["state"] == "Discovered" and nodes["liar"][1] == []  # never invited
        assert record["hardware"]["outcome"] == "wrong" and record["hardware"]["flops"] is None
        assert "freivalds: C·r is not A·(B·r)" in record["reason"]
        assert not devnet.client().is_node_in_pool(devnet.pool_id, liar)
        # the evidence, as the pool owner reads it, convicts the liar again with nothing but itself
        history = orch.admin("GET", f"/nodes/{liar}/hardware").json()
        evidence = history["evidence"][0]
        challenge = HardwareChallenge.model_validate(evidence["challenge"])
        said = (evidence["commitment"], bytes.fromhex(evidence["secret"]), evidence["answer"])
        again = judge(liar, challenge, *said)
        assert again and again[0].startswith("freivalds")
        # ... and would not convict the honest node for the same words under its own name
        assert "not signed by the node's key" in " ".join(judge(honest, challenge, *said))
        # the pool owner's CLI (the installed program: the orchestrator in this process logs to stdout)
        # shows the proven figure next to the on-chain record
        deployment = devnet.deployment.save(tmp_path / "deployment.json")
        env = {**os.environ, "INTELLECT_RPC_URL": devnet.rpc_url, "INTELLECT_ADMIN_TOKEN": orch.token}

        def pool(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(Path(sys.executable).parent / "intellect-pool"), *argv], env=env,
                                  capture_output=True, text=True, timeout=120)  # fmt: skip

        shown = pool("nodes", str(devnet.pool_id), "--orchestrator", orch.url, "--json", "--deployment",
                     str(deployment))  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        row = next(r for r in json.loads(shown.stdout) if r["node"] == honest)
        # (the honest node, never heartbeating here, may have been invited and challenged again since)
        assert row["hardware"]["outcome"] == "proven" and row["hardware"]["flops"] > 0
        # ... and `intellect-pool hardware-evidence` re-runs it from the orchestrator or from a saved file
        judged = pool("hardware-evidence", liar, "--orchestrator", orch.url, "--json")
        assert judged.returncode == 0, judged.stderr
        verdicts = json.loads(judged.stdout)  # the liar may have been challenged again meanwhile
        assert len(verdicts) >= len(history["evidence"]) and {v["verdict"] for v in verdicts} == {"wrong"}
        assert verdicts[0]["reasons"][0].startswith("freivalds")
        saved = tmp_path / "evidence.json"
        saved.write_text(json.dumps(history))
        framed = pool("hardware-evidence", honest, "--file", str(saved), "--json")
        assert framed.returncode == 0 and json.loads(framed.stdout)[0]["verdict"] == "unsigned", framed.stderr
        neither = pool("hardware-evidence", liar)
        assert neither.returncode == 1 and "--orchestrator URL" in neither.stderr + neither.stdout
        # A validator's slash vote (`intellect-pool slashing hardware`) judges the evidence first
        validator = devnet.new_provider()
        devnet.client(devnet.owner).grant_validator(validator.address)
        env["INTELLECT_PRIVATE_KEY"] = validator.private_key_hex()
        where = ("--deployment", str(deployment), "--json")
        refused = pool("slashing", "hardware", str(devnet.pool_id), honest, "--file", str(saved), *where)
        assert refused.returncode == 1 and "nothing here convicts" in refused.stderr + refused.stdout
        outside = pool("slashing", "hardware", str(devnet.pool_id), liar, "--orchestrator", orch.url, *where)
        assert outside.returncode == 1 and "NodeNotInPool" in outside.stderr + outside.stdout  # never invited
        # a member that answers a later (re)challenge wrongly, in its own signed words, is slashed
        wait_for(lambda: devnet.client().is_node_in_pool(devnet.pool_id, honest), what="the honest joined")
        turned = tmp_path / "turned.json"
        turned.write_text(json.dumps(signed_wrong_answer(nodes["honest"][0])))
        stake = devnet.client().get_provider(nodes["honest"][2].address).stake
        slashed = pool("slashing", "hardware", str(devnet.pool_id), honest, "--file", str(turned), *where)
        assert slashed.returncode == 0 and "decided: slashed" in slashed.stdout, slashed.stderr
        assert devnet.client().get_provider(nodes["honest"][2].address).stake < stake
        assert devnet.client().is_node_blacklisted(devnet.pool_id, honest)
        metrics = httpx.get(orch.url + "/metrics").text
        assert 'orchestrator_hardware_challenges_total{outcome="proven"}' in metrics
        assert 'orchestrator_hardware_challenges_total{outcome="wrong"}' in metrics
    finally:
        for server in servers:
            server.stop()
        orch.stop()
