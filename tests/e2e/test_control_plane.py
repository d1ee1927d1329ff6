"""The control plane end to end, every component real and in its own process.

anvil (chain) + Redis + `intellect-discovery serve` + `intellect-orchestrator serve` + three
`intellect-worker start` processes, all on loopback free ports with small intervals:
registration → discovery → invite → join on chain → heartbeats → Healthy → a POSTed task is
assigned and reported back; SIGTERM → a `leaving` heartbeat; SIGKILL → Dead within TTL + threshold
and ejected on chain; a restarted worker is re-invited; an orchestrator restart loses nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see tests/worker/worker_devnet.py

from intellect.identity import Wallet  # noqa: E402
from intellect.net import free_port, wait_for_port  # noqa: E402
from intellect.processes import stop_process  # noqa: E402
from intellect.redis_server import EmbeddedRedis  # noqa: E402
from ledger.client import LedgerClient  # noqa: E402
from ledger.deploy import DeployParams, deploy_all  # noqa: E402
from ledger.dev.anvil import Anvil  # noqa: E402
from ledger.models import ONE_TOKEN  # noqa: E402

# Orchestrator timings: a silent node is Dead after TTL + MISSES x CHECK seconds at most.
HEARTBEAT, TTL, CHECK, MISSES = 1.0, 4.0, 1.0, 3
WORKERS = 3
NATED = 1  # this worker advertises an address nobody can call (as behind NAT): it joins by pulling


def wait_until(what: str, predicate: Callable[[], Any], timeout: float, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            last_error = exc
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_error})")


@dataclass
class Service:
    """A child process started from a command line, logging to a file, stopped by its pid."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()
        try:
            wait_for_port("127.0.0.1", self.port, timeout=60)
        except TimeoutError:
            raise AssertionError(f"{self.name} did not start:\n{self.log_tail()}") from None
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc, grace=10)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def script(module: str) -> list[str]:
    """Run a typer app the way its console script does, with this interpreter."""
    return [sys.executable, "-c", f"from {module} import app; app()"]


@dataclass
class Cluster:
    tmp: Path
    anvil: Anvil
    deployment: Path
    chain: LedgerClient
    manager: Wallet
    pool_id: int
    redis: EmbeddedRedis
    discovery: Service | None = None
    orchestrator: Service | None = None
    workers: list[Service] = field(default_factory=list)
    nodes: list[Wallet] = field(default_factory=list)
    orch_token: str = ""

    @property
    def orch_url(self) -> str:
        assert self.orchestrator is not None
        return f"http://127.0.0.1:{self.orchestrator.port}"

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_")}
        return env | {"INTELLECT_HOME": str(self.tmp / "home"), "PYTHONUNBUFFERED": "1"}

    def start_discovery(self) -> None:
        port = free_port()
        env = self.base_env() | {
            "INTELLECT_DISCOVERY_PORT": str(port),
            "INTELLECT_DISCOVERY_REDIS_URL": self.redis.url,
            "INTELLECT_DISCOVERY_RPC_URL": self.anvil.rpc_url,
            "INTELLECT_DISCOVERY_DEPLOYMENT": str(self.deployment),
            "INTELLECT_DISCOVERY_STATE_DIR": str(self.tmp / "discovery"),
            "INTELLECT_DISCOVERY_POOL_ID": str(self.pool_id),
            "INTELLECT_DISCOVERY_SYNC_INTERVAL_SECONDS": "2",
            "INTELLECT_DISCOVERY_CHAIN_CACHE_SECONDS": "1",
        }
        self.discovery = Service(
            "discovery", [*script("discovery.cli"), "serve"], env, self.tmp / "discovery.log", port
        ).start()

    def start_orchestrator(self, port: int | None = None) -> None:
        port = port or free_port()
        env = self.base_env() | {
            "INTELLECT_ORCH_PORT": str(port),
            "INTELLECT_ORCH_POOL_ID": str(self.pool_id),
            "INTELLECT_ORCH_REDIS_URL": self.redis.url,
            "INTELLECT_ORCH_RPC_URL": self.anvil.rpc_url,
            "INTELLECT_ORCH_DEPLOYMENT": str(self.deployment),
            "INTELLECT_ORCH_STATE_DIR": str(self.tmp / "orchestrator"),
            "INTELLECT_ORCH_DISCOVERY_URL": f"http://127.0.0.1:{self.discovery.port}",  # type: ignore[union-attr]
            "INTELLECT_ORCH_MANAGER_KEY": self.manager.private_key_hex(),
            "INTELLECT_ORCH_HEARTBEAT_INTERVAL_SECONDS": str(HEARTBEAT),
            "INTELLECT_ORCH_HEARTBEAT_TTL_SECONDS": str(TTL),
            "INTELLECT_ORCH_CHECK_INTERVAL_SECONDS": str(CHECK),
            "INTELLECT_ORCH_MISS_THRESHOLD": str(MISSES),
            "INTELLECT_ORCH_EJECT_AFTER_SECONDS": "0",  # ejected as soon as Dead: what these tests watch
            "INTELLECT_ORCH_INVITE_INTERVAL_SECONDS": "1",
            "INTELLECT_ORCH_INVITE_TIMEOUT_SECONDS": "10",
            "INTELLECT_ORCH_INVITE_MAX_BACKOFF_SECONDS": "2",
            "INTELLECT_ORCH_HTTP_TIMEOUT_SECONDS": "20",
        }
        self.orchestrator = Service(
            "orchestrator", [*script("orchestrator.cli"), "serve"], env, self.tmp / "orchestrator.log", port
        ).start()
        token_file = self.tmp / "orchestrator" / "admin-token"
        self.orch_token = wait_until(
            "the admin token", lambda: token_file.exists() and token_file.read_text().strip(), 10
        )

    def worker_service(self, index: int) -> Service:
        """Worker `index`'s process description; the same keys and state dir every time it starts."""
        provider = Wallet.from_key(self.anvil.dev_keys[3 + index])
        node = self.nodes[index]
        port = free_port()
        env = self.base_env() | {
            "INTELLECT_WORKER_PROVIDER_KEY": provider.private_key_hex(),
            "INTELLECT_WORKER_NODE_KEY": node.private_key_hex(),
            "INTELLECT_WORKER_RPC_URL": self.anvil.rpc_url,
            "INTELLECT_WORKER_DEPLOYMENT": str(self.deployment),
            "INTELLECT_WORKER_DISCOVERY_URL": f"http://127.0.0.1:{self.discovery.port}",  # type: ignore[union-attr]
            "INTELLECT_WORKER_POOL_ID": str(self.pool_id),
            "INTELLECT_WORKER_STATE_DIR": str(self.tmp / f"worker{index}"),
            "INTELLECT_WORKER_HEARTBEAT_INTERVAL": str(HEARTBEAT),
            "INTELLECT_WORKER_METADATA_REFRESH": "2",
            "INTELLECT_WORKER_MIN_DISK_MB": "0",
        }
        if index == NATED:  # 127.0.0.2: loopback, but nothing listens there (its API binds 127.0.0.1)
            env["INTELLECT_WORKER_ADVERTISED_IP"] = "127.0.0.2"
        # The control plane only: tasks are recorded, not run (the default, auto, would run them).
        argv = [*script("worker.cli"), "start", "--yes", "--api-port", str(port), "--runtime", "recording"]
        return Service(f"worker{index}", argv, env, self.tmp / f"worker{index}.log", port)

    # ---- orchestrator admin API ----

    def orch(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.orch_token}"}
        return httpx.request(method, f"{self.orch_url}{path}", headers=headers, timeout=10, **kw)

    def node_states(self) -> dict[str, dict[str, Any]]:
        response = self.orch("GET", "/nodes")
        response.raise_for_status()
        return {n["address"]: n for n in response.json()["nodes"]}

    def state_of(self, index: int) -> str | None:
        record = self.node_states().get(self.nodes[index].address)
        return record["state"] if record else None

    def in_pool(self, index: int) -> bool:
        return self.chain.is_node_in_pool(self.pool_id, self.nodes[index].address)

    def logs(self) -> str:
        parts = [self.discovery, self.orchestrator, *self.workers]
        return "\n\n".join(f"== {s.name}\n{s.log_tail()}" for s in parts if s)


C = TypeVar("C", bound=Cluster)


@contextmanager
def cluster_stack(tmp: Path, pool: str, workers: int, kind: type[C], worker: Callable[[C, int], Service],
                  after: Callable[[C], None] | None = None) -> Iterator[C]:  # fmt: skip
    """anvil + Redis + discovery + orchestrator + `workers` workers (`worker(cluster, i)`, started) on a
    started pool named `pool`, each worker's provider funded and whitelisted; every log printed if
    this fails, everything stopped after (`after(cluster)` once the services are, before Redis and
    anvil)."""
    anvil = Anvil.start(accounts=3 + workers)
    redis = EmbeddedRedis().start()
    cluster: C | None = None
    try:
        deployer, manager = Wallet.from_key(anvil.dev_keys[0]), Wallet.from_key(anvil.dev_keys[1])
        deployment = deploy_all(anvil.rpc_url, deployer, DeployParams(stake_minimum=10 * ONE_TOKEN))
        path = deployment.save(tmp / "deployment.json")
        ledger = LedgerClient(anvil.rpc_url, path, deployer)
        domain = ledger.create_domain("rl", "")
        pool_id = ledger.create_pool(domain, manager.address, pool, '{"requirements": {"cpu_cores": 1}}', 0)
        ledger.start_pool(pool_id)
        for key in anvil.dev_keys[3 : 3 + workers]:
            provider = Wallet.from_key(key).address
            ledger.mint(provider, 1000 * ONE_TOKEN)
            ledger.whitelist_provider(provider)
        cluster = kind(
            tmp, anvil, path, ledger, manager, pool_id, redis, nodes=[Wallet.create() for _ in range(workers)]
        )
        cluster.start_discovery()
        cluster.start_orchestrator()
        cluster.workers = [worker(cluster, i).start() for i in range(workers)]
        yield cluster
    except BaseException:
        if cluster:
            print(cluster.logs())
        raise
    finally:
        try:
            if cluster:
                for service in [*cluster.workers, cluster.orchestrator, cluster.discovery]:
                    if service:
                        service.stop()
                if after:
                    after(cluster)
        finally:
            redis.stop()
            anvil.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("control-plane")
    with cluster_stack(tmp, "e2e", WORKERS, Cluster, Cluster.worker_service) as cluster:
        failed_before = request.session.testsfailed
        yield cluster
        if request.session.testsfailed > failed_before:
            print(cluster.logs())


def test_workers_register_join_and_become_healthy(cluster: Cluster) -> None:
    wait_until(
        "every worker Healthy", lambda: all(cluster.state_of(i) == "Healthy" for i in range(WORKERS)), 90
    )
    for i, node in enumerate(cluster.nodes):
        assert cluster.in_pool(i), f"worker{i} not in the pool on chain"
        on_chain = cluster.chain.get_node(node.address)
        assert on_chain.provider == Wallet.from_key(cluster.anvil.dev_keys[3 + i]).address
    token = (cluster.tmp / "discovery" / "admin-token").read_text().strip()
    listed = httpx.get(
        f"http://127.0.0.1:{cluster.discovery.port}/pools/{cluster.pool_id}/nodes",  # type: ignore[union-attr]
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()
    assert {n["metadata"]["node_address"] for n in listed} >= {n.address for n in cluster.nodes}
    health = httpx.get(f"http://127.0.0.1:{cluster.workers[0].port}/health", timeout=5).json()
    assert health["pool_joined"] and health["heartbeating"]


def test_a_worker_nobody_can_call_joins_through_discovery(cluster: Cluster) -> None:
    """Issue 21: the orchestrator's call to the NATed worker's API is refused, so it leaves the signed
    invite at discovery; the worker fetches it, joins on chain and heartbeats like the others. The
    pool owner's node list says which way each node's invite reached it."""
    wait_until("the NATed worker Healthy", lambda: cluster.state_of(NATED) == "Healthy", 90)
    nodes = cluster.node_states()
    via = {i: nodes[n.address]["joined_via"] for i, n in enumerate(cluster.nodes)}
    assert via == {i: "pull" if i == NATED else "push" for i in range(WORKERS)}, via
    assert nodes[cluster.nodes[NATED].address]["worker_url"].startswith("http://127.0.0.2:")
    with pytest.raises(httpx.TransportError):
        httpx.get(nodes[cluster.nodes[NATED].address]["worker_url"] + "/health", timeout=2)
    assert cluster.in_pool(NATED)
    assert "joined through discovery" in cluster.workers[NATED].log_path.read_text(errors="replace")
    # the used invite is gone from the mailbox (only the node may read it: 404 now, not 403)
    from intellect.signing import SignedAuth

    node = cluster.nodes[NATED]
    url = f"http://127.0.0.1:{cluster.discovery.port}/nodes/{node.address}/invite"  # type: ignore[union-attr]
    assert httpx.get(url, auth=SignedAuth(node), timeout=5).status_code == 404
    stranger = httpx.get(url, auth=SignedAuth(cluster.nodes[0]), timeout=5)
    assert stranger.status_code == 403, stranger.text


def test_posted_task_is_assigned_and_reported_back(cluster: Cluster) -> None:
    spec = {
        "name": "echo",
        "image": "intellect/test:latest",
        "cmd": ["echo", "${TASK_ID}", "${NODE_ADDRESS}"],
    }
    created = cluster.orch("POST", "/tasks", json=spec)
    assert created.status_code == 201, created.text
    task_id = created.json()["id"]

    def all_report_it() -> bool:
        nodes = cluster.node_states()
        return all(
            (nodes[n.address].get("task") or {}).get("task_id") == task_id
            and nodes[n.address]["task"]["state"] == "running"
            for n in cluster.nodes
        )

    wait_until("every worker reporting the task as running", all_report_it, 30)
    # The worker persisted what it reported (survives a worker restart).
    state = (cluster.tmp / "worker0" / "state.json").read_text()
    assert task_id in state


def test_sigterm_sends_a_leaving_heartbeat(cluster: Cluster) -> None:
    last = cluster.workers[WORKERS - 1]
    last.signal(signal.SIGTERM)
    assert last.wait(timeout=15) == 0, last.log_tail()
    stopped = time.monotonic()
    # Faster than any timeout could make it: the worker said it was leaving.
    wait_until(
        "the leaving node to be Dead", lambda: cluster.state_of(WORKERS - 1) in ("Dead", "Ejected"), TTL - 1
    )
    assert time.monotonic() - stopped < TTL
    assert "leaving=true" in last.log_tail()


def test_killed_worker_becomes_dead_and_is_ejected(cluster: Cluster) -> None:
    victim = cluster.workers[0]
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    killed = time.monotonic()
    bound = TTL + MISSES * CHECK + 2 * CHECK  # detection bound plus one check period of slack each side
    wait_until("the killed node to be Dead", lambda: cluster.state_of(0) in ("Dead", "Ejected"), bound)
    detected = time.monotonic() - killed
    assert detected <= bound, f"death detected after {detected:.1f}s"
    wait_until("the dead node to be ejected on chain", lambda: not cluster.in_pool(0), 20)
    assert cluster.in_pool(1)


def test_restarted_worker_is_reinvited(cluster: Cluster) -> None:
    again = cluster.worker_service(0)
    cluster.workers[0] = again.start()
    wait_until("the restarted node back in the pool on chain", lambda: cluster.in_pool(0), 60)
    wait_until("the restarted node Healthy", lambda: cluster.state_of(0) == "Healthy", 30)
    # Resumed from its state: no second registration.
    assert again.log_path.read_text().count("registered node") == 1
    state = json.loads((cluster.tmp / "worker0" / "state.json").read_text())
    assert len(state["registration_txs"]) == 3  # approve, registerProvider, addNode: every tx it sent


def test_orchestrator_restart_loses_no_task_and_no_node(cluster: Cluster) -> None:
    tasks_before = {t["id"] for t in cluster.orch("GET", "/tasks").json()}
    assert tasks_before
    orch = cluster.orchestrator
    assert orch is not None
    orch.signal(signal.SIGTERM)
    orch.wait(timeout=30)
    cluster.start_orchestrator(port=orch.port)  # same URL: the workers keep heartbeating to it
    known = cluster.node_states()  # straight from SQL, before anyone re-invites anything
    assert {n.address for n in cluster.nodes} <= set(known)
    assert {t["id"] for t in cluster.orch("GET", "/tasks").json()} == tasks_before
    live = [0, 1]
    wait_until(
        "the live nodes Healthy after the restart",
        lambda: all(cluster.state_of(i) == "Healthy" for i in live),
        30,
    )
    task_id = next(iter(tasks_before))
    wait_until(
        "the task still reported by the live nodes",
        lambda: all(
            (cluster.node_states()[cluster.nodes[i].address].get("task") or {}).get("task_id") == task_id
            for i in live
        ),
        20,
    )
    assert all(cluster.in_pool(i) for i in live)
