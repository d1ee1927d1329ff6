"""Heartbeat load on one orchestrator: N simulated workers, real signatures, HTTP, Redis, SQLite, anvil.

The orchestrator runs as `intellect-orchestrator serve --workers W` in its own processes; separate
client processes play the workers. Every request is signed ahead of its run (signing costs about as
much CPU as verifying and would otherwise compete with the server on the same 2 cores), then sent
open-loop at N / interval per second. Latency is measured from each request's *scheduled* send time,
so a client or server that falls behind shows up in the figures. By default each heartbeat opens a
new TCP connection (the worst case); `--keep-alive` reuses connections, as the worker daemon does.

For each N: throughput, p50/p99, CPU per heartbeat of the server processes, of Redis and of the
clients, and the time to detect a node that went silent at the start of the load as Dead. Then a
saturation run sends as fast as the server answers, to `/heartbeat` and to a bare `/health` on the
same server (the raw HTTP + framework limit of this machine), and prints the ratio.

    .venv/bin/python bench/heartbeats.py --nodes 1000 5000 10000 --workers 2 --seconds 30
    .venv/bin/python bench/heartbeats.py --replicas 2 --workers 1 --nodes 10000 --keep-alive  # HAProxy

The load generator is bench/heartbeat_load.py; the replicas and HAProxy, bench/balancer.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "orchestrator"))  # the throw-away PostgreSQL of the store tests

from balancer import Fleet, HAProxy, haproxy_binary  # noqa: E402
from heartbeat_load import BODY, ClientResult, Clients, ms, percentile  # noqa: E402

from intellect.identity import Wallet  # noqa: E402
from intellect.net import free_port  # noqa: E402
from intellect.redis_server import EmbeddedRedis  # noqa: E402
from intellect.signing import sign_request  # noqa: E402
from tests.support.testing import start_devnet  # noqa: E402


def seed_nodes(db_url: str, nodes: list[Wallet]) -> None:
    from orchestrator.db import make_engine, migrate, session_factory
    from orchestrator.models import NodeRow, utcnow

    engine = make_engine(db_url)
    migrate(engine)
    with session_factory(engine)() as session, session.begin():
        session.add_all(NodeRow(address=n.address, state="Healthy", misses=0, in_pool=False,
                                invite_attempts=0, state_changed_at=utcnow(), created_at=utcnow())
                        for n in nodes)
    engine.dispose()


class Server:
    """`intellect-orchestrator serve` in its own process group, stopped by pid."""

    def __init__(self, devnet, state_dir: Path, redis_url: str, port: int, workers: int, keep_alive: float,
                 settings: dict[str, object]) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        deployment = state_dir / "deployment.json"
        devnet.deployment.save(deployment)
        env = {**os.environ, "INTELLECT_ORCH_MANAGER_KEY": devnet.manager.private_key_hex()}
        for key, value in {"port": self.port, "pool_id": devnet.pool_id, "redis_url": redis_url,
                           "state_dir": state_dir, "rpc_url": devnet.rpc_url, "deployment": deployment,
                           "discovery_url": "http://127.0.0.1:9", "heartbeat_rate_limit_per_minute": 1000,
                           **settings}.items():
            env[f"INTELLECT_ORCH_{key.upper()}"] = str(value)
        self.log = state_dir / "server.log"
        with self.log.open("wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.cli", "serve", "--log-level", "warning",
                 "--workers", str(workers), "--keep-alive", str(keep_alive)],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 90
        while True:  # the port opens before the API processes finish start-up: wait for /health
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()  # by pid, with its API and loops processes: a failed start leaves nothing behind
                raise RuntimeError(f"orchestrator did not start (its log: {self.log})")
            time.sleep(0.2)
        if workers > 1:  # every API process must be up, not just the first one
            time.sleep(3)
        self.token = (state_dir / "admin-token").read_text().strip()

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of the API processes (they hold the listening socket) and the rest
        (the loops process of `--workers N`, uvicorn's supervisor)."""
        out = {"api": 0.0, "other": 0.0}
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return out
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                listening = any(c.status == psutil.CONN_LISTEN for c in p.net_connections("tcp"))
                serving = listening and (p is not root or len(procs) == 1)
                out["api" if serving else "other"] += sum(p.cpu_times()[:2])
        return out

    def node_state(self, address: str) -> str:
        r = httpx.get(f"{self.url}/nodes/{address}", headers={"Authorization": f"Bearer {self.token}"},
                      timeout=10)
        return r.json()["state"]

    def stop(self) -> None:
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        self.proc.terminate()  # uvicorn's supervisor stops its API processes and the loops process
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _, alive = psutil.wait_procs(children, timeout=25)
        for p in alive:  # whatever outlived its parent, by pid
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


# ---- runs ----


def merged_errors(results: list[ClientResult]) -> dict[str, int]:
    errors: dict[str, int] = {}
    for res in results:
        for k, v in res.errors.items():
            errors[k] = errors.get(k, 0) + v
    return errors


def start_server(devnet, redis_url: str, nodes: list[Wallet], port: int, args) -> Server | Fleet:
    """One orchestrator on SQLite at `port`, or (`--replicas N`) N of them on one PostgreSQL database
    behind HAProxy listening at `port`."""
    settings: dict[str, object] = {
        "heartbeat_interval_seconds": args.interval, "heartbeat_ttl_seconds": args.ttl,
        "check_interval_seconds": args.check, "miss_threshold": args.misses, "eject_dead_nodes": "false"}
    state_dir = Path(tempfile.mkdtemp(prefix="bench-orch-"))
    if args.replicas == 1:
        seed_nodes(f"sqlite:///{state_dir / 'orchestrator.db'}", nodes)
        return Server(devnet, state_dir, redis_url, port, args.workers, args.server_keep_alive, settings)
    database = args.postgres.fresh_database(f"bench{port}")
    seed_nodes(database, nodes)
    replicas: list[Server] = []
    try:
        for i in range(args.replicas):
            replica_dir = state_dir / f"replica{i}"
            replica_dir.mkdir()
            replicas.append(Server(devnet, replica_dir, redis_url, free_port(), args.workers,
                                   args.server_keep_alive, {**settings, "database_url": database}))
        return Fleet(list(replicas), HAProxy(port, [r.port for r in replicas], state_dir))
    except BaseException:
        for replica in replicas:
            replica.stop()
        raise


def load_run(devnet, redis: EmbeddedRedis, n: int, args, console: Console) -> dict:
    """N nodes (one of them goes silent at the start) beating every interval for `seconds`."""
    console.print(f"[bold]N={n}[/bold]: keys, seeding, pre-signing")
    nodes = [Wallet.create() for _ in range(n)]
    victim, beating = nodes[0], nodes[1:]
    rate = n / args.interval
    count = int(rate * args.seconds)
    # Pre-sign while the orchestrator starts: nodes begin beating right after its start-up, as a
    # fleet re-attaching to a restarted orchestrator would (within its one-TTL start-up grace).
    port = free_port()
    clients = Clients(f"http://127.0.0.1:{port}", "/heartbeat", [w.private_key_hex() for w in beating],
                      args.clients, rate=rate, count=count, keep_alive=args.keep_alive)
    server = start_server(devnet, redis.url, nodes, port, args)
    try:
        return _measure(server, redis, clients, victim, n, rate, args)
    finally:
        server.stop()


def _measure(server: Server | Fleet, redis: EmbeddedRedis, clients: Clients, victim: Wallet, n: int,
             rate: float, args) -> dict:
    clients.wait_ready()
    # The victim beats once, then goes silent for good: the clock for death detection starts here.
    headers = {**sign_request(victim, "POST", "/heartbeat", BODY), "Content-Type": "application/json"}
    r = httpx.post(server.url + "/heartbeat", content=BODY, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    silent_since = time.monotonic()
    redis_proc = psutil.Process(redis.pid)
    roles0, redis_cpu0 = server.cpu_by_role(), sum(redis_proc.cpu_times()[:2])
    load0 = os.getloadavg()[0]
    # Watched during the load (4 admin reads a second), not after it: a load run as long as the
    # detection bound would otherwise hide when the node was declared dead.
    dead_at: list[float] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set() and time.monotonic() - silent_since < 120:
            with contextlib.suppress(httpx.HTTPError):
                if server.node_state(victim.address) in ("Dead", "Ejected"):
                    dead_at.append(time.monotonic() - silent_since)
                    return
            time.sleep(0.25)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    results = clients.go()
    roles = {k: v - roles0[k] for k, v in server.cpu_by_role().items()}
    server_cpu = sum(roles.values())
    redis_cpu = sum(redis_proc.cpu_times()[:2]) - redis_cpu0
    watcher.join(timeout=max(0.0, 120 - (time.monotonic() - silent_since)))
    watching.set()
    dead_after = dead_at[0] if dead_at else float("inf")
    latencies = [x for r in results for x in r.latencies]
    errors = merged_errors(results)
    wall = max(r.wall_seconds for r in results)
    ok = len(latencies)
    row = {
        "nodes": n, "target_per_s": round(rate), "achieved_per_s": round(ok / wall),
        "errors": sum(errors.values()), "error_kinds": errors,
        "p50_ms": ms(percentile(latencies, 0.5)), "p99_ms": ms(percentile(latencies, 0.99)),
        "max_ms": ms(max(latencies) if latencies else None),
        "server_cpu_ms_per_hb": round(server_cpu / max(ok, 1) * 1000, 3),
        "redis_cpu_ms_per_hb": round(redis_cpu / max(ok, 1) * 1000, 3),
        "client_cpu_ms_per_hb": round(sum(r.cpu_seconds for r in results) / max(ok, 1) * 1000, 3),
        "server_cores_busy": round(server_cpu / wall, 2),
        "api_cpu_ms_per_hb": round(roles["api"] / max(ok, 1) * 1000, 3),
        "loops_cores_busy": round(roles["other"] / wall, 2),
        "dead_detected_s": round(dead_after, 1), "load_before": round(load0, 2),
    }
    if "balancer" in roles:  # --replicas: HAProxy's share of the server CPU
        row["balancer_cpu_ms_per_hb"] = round(roles["balancer"] / max(ok, 1) * 1000, 3)
    if any(k.startswith("5") for k in errors):
        row["server_log"] = str(server.log)
    row["holds"] = bool(row["errors"] == 0 and row["p99_ms"] is not None and row["p99_ms"] < 100
                        and ok / wall >= 0.95 * rate and dead_after <= 30)
    return row


def saturation(devnet, redis: EmbeddedRedis, args, console: Console) -> dict:
    """Closed loop, keep-alive, fresh server: the most answers a second for /health and /heartbeat."""
    console.print("[bold]saturation[/bold]: /health vs /heartbeat on one server")
    nodes = [Wallet.create() for _ in range(2000)]
    count = int(3000 * args.saturate)
    port = free_port()
    beats = Clients(f"http://127.0.0.1:{port}", "/heartbeat", [w.private_key_hex() for w in nodes],
                    args.clients, count=count, keep_alive=True, concurrency=args.concurrency,
                    seconds=args.saturate)
    server = start_server(devnet, redis.url, nodes, port, args)
    out: dict[str, object] = {}
    try:
        health = Clients(server.url, "/health", [], args.clients, keep_alive=True,
                         concurrency=args.concurrency, seconds=args.saturate)
        for path, clients in (("/health", health), ("/heartbeat", beats)):
            clients.wait_ready()
            roles0 = server.cpu_by_role()
            results = clients.go()
            roles = {k: v - roles0[k] for k, v in server.cpu_by_role().items()}
            ok = sum(len(r.latencies) for r in results)
            wall = max(r.wall_seconds for r in results)
            latencies = [x for r in results for x in r.latencies]
            out[path] = {"per_s": round(ok / wall), "p50_ms": ms(percentile(latencies, 0.5)),
                         "p99_ms": ms(percentile(latencies, 0.99)),
                         "server_cpu_ms": round(sum(roles.values()) / max(ok, 1) * 1000, 3),
                         **({"balancer_cpu_ms": round(roles["balancer"] / max(ok, 1) * 1000, 3)}
                            if "balancer" in roles else {}),
                         "client_cpu_ms": round(sum(r.cpu_seconds for r in results) / max(ok, 1) * 1000, 3),
                         "errors": merged_errors(results)}
    finally:
        server.stop()
    out["ratio"] = round(out["/heartbeat"]["per_s"] / max(out["/health"]["per_s"], 1), 2)  # type: ignore[index]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--interval", type=float, default=10.0, help="heartbeat interval per node")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each load run")
    parser.add_argument("--workers", type=int, default=2, help="orchestrator API processes")
    parser.add_argument("--clients", type=int, default=1, help="load generator processes")
    parser.add_argument("--keep-alive", action="store_true",
                        help="reuse connections (default: a new connection per heartbeat, the worst case)")
    parser.add_argument("--server-keep-alive", type=float, default=5.0, help="serve --keep-alive")
    parser.add_argument("--ttl", type=float, default=15.0)
    parser.add_argument("--check", type=float, default=5.0)
    parser.add_argument("--misses", type=int, default=2)
    parser.add_argument("--saturate", type=float, default=5.0,
                        help="seconds of closed-loop /heartbeat vs /health (0: skip)")
    parser.add_argument("--concurrency", type=int, default=32, help="saturation: requests in flight")
    parser.add_argument("--replicas", type=int, default=1,
                        help="orchestrators on one PostgreSQL behind HAProxy (1: one server on SQLite)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    console = Console(stderr=True)
    console.print(f"load average before: {os.getloadavg()}, {psutil.cpu_count()} cores; "
                  f"server workers={args.workers}, client processes={args.clients}, "
                  f"{'keep-alive' if args.keep_alive else 'new connection per heartbeat'}")
    rows, sat = [], None
    args.postgres = None
    if args.replicas > 1:
        haproxy_binary()  # before anything starts: one line if it is missing
        from postgres_cluster import start_cluster

        args.postgres = start_cluster()
    devnet = start_devnet()
    try:
        with EmbeddedRedis() as redis:
            if args.saturate > 0:
                sat = saturation(devnet, redis, args, console)
                console.print(f"  {sat}")
            for n in args.nodes:
                row = load_run(devnet, redis, n, args, console)
                rows.append(row)
                console.print(f"  {row}")
    finally:
        devnet.stop()
        if args.postgres is not None:
            args.postgres.stop()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if args.json:
        print(json.dumps({"rows": rows, "saturation": sat, "workers": args.workers, "replicas": args.replicas,
                          "clients": args.clients,
                          "keep_alive": args.keep_alive, "children_cpu_s": usage.ru_utime + usage.ru_stime},
                         indent=2))
        return
    table = Table("nodes", "target/s", "achieved/s", "errors", "p50 ms", "p99 ms", "server CPU ms/hb",
                  "redis ms/hb", "client ms/hb", "dead detected (s)", "load", "holds",
                  title=f"heartbeats, {args.replicas} replica(s) x {args.workers} server process(es), "
                        f"interval {args.interval}s")
    for r in rows:
        table.add_row(*(str(r[k]) for k in (
            "nodes", "target_per_s", "achieved_per_s", "errors", "p50_ms", "p99_ms", "server_cpu_ms_per_hb",
            "redis_cpu_ms_per_hb", "client_cpu_ms_per_hb", "dead_detected_s", "load_before", "holds")))
    Console().print(table)
    if sat:
        Console().print(f"saturation (keep-alive, {args.concurrency} in flight): /health {sat['/health']}, "
                        f"/heartbeat {sat['/heartbeat']}, heartbeat/health = {sat['ratio']}")
    held = [r["nodes"] for r in rows if r["holds"]]
    Console().print(f"largest N that holds at a {args.interval}s interval: {max(held) if held else 'none'}")


if __name__ == "__main__":
    main()

