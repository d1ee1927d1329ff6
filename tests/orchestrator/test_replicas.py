"""Two orchestrator replicas, each running its loops, behind one Redis and one SQL database.

Whichever replica a worker reaches, the pool must behave as if there were one orchestrator: one
invite per node (one loop leader at a time, compare-and-set on the node's state), heartbeats landing
on either replica keep the node alive, a task made on one is handed out by the other, and when the
leader stops the other replica takes the loops over.
"""

from __future__ import annotations

import time

import redis
from lifecycle_world import Orchestrator, upload
from standin_worker import standin_worker

from tests.support.testing import serve_in_thread, wait_for


def test_two_replicas_share_one_redis_and_one_database(devnet, redis_url, discovery, database_url,
                                                       tmp_path) -> None:
    state = tmp_path / "orch"
    first = Orchestrator(devnet, redis_url, discovery, state, database_url=database_url).start()
    second = Orchestrator(devnet, redis_url, discovery, state, database_url=database_url).start()
    replicas = [first, second]
    workers = []
    try:
        provider = devnet.new_provider()
        nodes = [devnet.new_node(provider) for _ in range(3)]
        invites = []
        for node in nodes:
            app, received = standin_worker(devnet, provider, node)
            workers.append(serve_in_thread(app))
            invites.append(received)
            upload(discovery, node, provider, workers[-1].url)
        for node in nodes:
            wait_for(lambda n=node: second.node(n.address).get("state") == "WaitingForHeartbeat",
                     what=f"invite of {node.address}")
        time.sleep(2)  # several more invite passes on both replicas
        assert [len(received) for received in invites] == [1, 1, 1]
        holders = redis.Redis.from_url(redis_url).keys(f"orch:{{{devnet.pool_id}}}:leader")
        assert len(holders) == 1
        # heartbeats alternate between the replicas: nothing is lost, the liveness pass sees them all
        task_id = first.admin("POST", "/tasks", json={"name": "t", "image": "i"}).json()["id"]
        deadline = time.monotonic() + 3  # two heartbeat TTLs
        turn = 0
        while time.monotonic() < deadline:
            for node in nodes:
                reply = replicas[turn % 2].heartbeat(node)
                assert reply.status_code == 200, reply.text
                assert reply.json()["current_task"]["task"]["id"] == task_id
                turn += 1
            time.sleep(0.25)
        for node in nodes:
            record = first.node(node.address)
            assert (record["state"], record["misses"]) == ("Healthy", 0)
        # the first replica goes away: the second runs the loops (a new node is invited, once)
        first.stop()
        replicas = [second]
        late = devnet.new_node(provider)
        app, late_invites = standin_worker(devnet, provider, late)
        workers.append(serve_in_thread(app))
        upload(discovery, late, provider, workers[-1].url)
        wait_for(lambda: second.node(late.address).get("state") == "WaitingForHeartbeat", timeout=30,
                 what="invite by the remaining replica")
        time.sleep(1.5)
        assert len(late_invites) == 1
    finally:
        for replica in replicas:
            replica.stop()
        for worker in workers:
            worker.stop()
