"""Heartbeat load on one orchestrator: N simulated workers, real signatures, HTTP, Redis, SQLite, anvil.

The orchestrator runs in its own process (uvicorn); this process plays the workers. Requests are
signed ahead of each run (signing costs as much CPU as verifying and would otherwise compete with
the server on the same 2 cores), then sent open-loop at N / interval per second. Reports throughput,
p50/p99 latency, server CPU per heartbeat, and the time to detect a silent node as Dead.

    .venv/bin/python bench/heartbeats.py --nodes 1000 5000 10000 --interval 10 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from intellect.identity import Wallet  # noqa: E402
from intellect.net import free_port, wait_for_port  # noqa: E402
from intellect.redis_server import EmbeddedRedis  # noqa: E402
from intellect.signing import sign_request  # noqa: E402
from intellect.testing import start_devnet  # noqa: E402


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


def start_orchestrator(devnet, state_dir: Path, redis_url: str, settings: dict[str, object]) -> tuple:
    port = free_port()
    deployment = state_dir / "deployment.json"
    devnet.deployment.save(deployment)
    env = {**os.environ, "INTELLECT_ORCH_MANAGER_KEY": devnet.manager.private_key_hex()}
    for key, value in {"port": port, "pool_id": devnet.pool_id, "redis_url": redis_url,
                       "state_dir": state_dir, "rpc_url": devnet.rpc_url, "deployment": deployment,
                       "discovery_url": "http://127.0.0.1:9", "heartbeat_rate_limit_per_minute": 1000,
                       **settings}.items():
        env[f"INTELLECT_ORCH_{key.upper()}"] = str(value)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "serve", "--log-level", "warning"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port("127.0.0.1", port, timeout=60)
    return proc, f"http://127.0.0.1:{port}"


def presign(nodes: list[Wallet], count: int, body: bytes) -> list[dict[str, str]]:
    return [sign_request(nodes[i % len(nodes)], "POST", "/heartbeat", body) for i in range(count)]


async def run_load(url: str, signed: list[dict[str, str]], rate: float,
                   body: bytes) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(headers: dict[str, str]) -> None:
            nonlocal errors
            start = time.perf_counter()
            try:
                async with session.post(url + "/heartbeat", data=body,
                                        headers={**headers, "Content-Type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                        return
            except aiohttp.ClientError:
                errors += 1
                return
            latencies.append(time.perf_counter() - start)

        tasks = []
        t0 = time.perf_counter()
        for i, headers in enumerate(signed):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(headers)))
        await asyncio.gather(*tasks)
    return latencies, errors


def death_detection(url: str, token: str, node: Wallet, body: bytes) -> float:
    import httpx

    headers = {**sign_request(node, "POST", "/heartbeat", body), "Content-Type": "application/json"}
    assert httpx.post(url + "/heartbeat", content=body, headers=headers).status_code == 200
    last = time.monotonic()
    while time.monotonic() - last < 120:
        state = httpx.get(f"{url}/nodes/{node.address}", headers={"Authorization": f"Bearer {token}"}).json()
        if state["state"] in ("Dead", "Ejected"):
            return time.monotonic() - last
        time.sleep(0.25)
    return float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--interval", type=float, default=10.0, help="heartbeat interval per node")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each load run")
    parser.add_argument("--ttl", type=float, default=15.0)
    parser.add_argument("--check", type=float, default=5.0)
    parser.add_argument("--misses", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    console = Console(stderr=True)
    body = b'{"metrics":{"tokens_per_s":123.0}}'
    devnet = start_devnet()
    rows = []
    try:
        with EmbeddedRedis() as redis:
            for n in args.nodes:
                state_dir = Path(tempfile.mkdtemp(prefix="bench-orch-"))
                console.print(f"[bold]N={n}[/bold]: creating keys and seeding")
                nodes = [Wallet.create() for _ in range(n)]
                seed_nodes(f"sqlite:///{state_dir / 'orchestrator.db'}", nodes)
                proc, url = start_orchestrator(devnet, state_dir, redis.url, {
                    "heartbeat_interval_seconds": args.interval, "heartbeat_ttl_seconds": args.ttl,
                    "check_interval_seconds": args.check, "miss_threshold": args.misses,
                    "eject_dead_nodes": "false"})
                try:
                    rate = n / args.interval
                    count = int(rate * args.seconds)
                    console.print(f"  pre-signing {count} heartbeats")
                    signed = presign(nodes, count, body)
                    server = psutil.Process(proc.pid)
                    cpu0 = sum(server.cpu_times()[:2])
                    t0 = time.perf_counter()
                    latencies, errors = asyncio.run(run_load(url, signed, rate, body))
                    wall = time.perf_counter() - t0
                    cpu = sum(server.cpu_times()[:2]) - cpu0
                    latencies.sort()
                    token = (state_dir / "admin-token").read_text().strip()
                    dead_after = death_detection(url, token, nodes[0], body)
                    ok = len(latencies)
                    row = {
                        "nodes": n, "target_per_s": round(rate), "achieved_per_s": round(ok / wall),
                        "errors": errors,
                        "p50_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
                        "p99_ms": round(latencies[int(0.99 * (ok - 1))] * 1000, 1) if latencies else None,
                        "server_cpu_ms_per_hb": round(cpu / max(ok, 1) * 1000, 2),
                        "dead_detected_s": round(dead_after, 1),
                    }
                    row["holds"] = bool(errors == 0 and row["p99_ms"] is not None and row["p99_ms"] < 100
                                        and row["achieved_per_s"] >= 0.95 * rate and dead_after <= 30)
                    rows.append(row)
                    console.print(f"  {row}")
                finally:
                    proc.terminate()
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:  # stuck on in-flight requests: stop it by pid
                        proc.kill()
                        proc.wait()
    finally:
        devnet.stop()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("nodes", "target/s", "achieved/s", "errors", "p50 ms", "p99 ms", "server CPU ms/hb",
                  "dead detected (s)", "holds")
    for r in rows:
        table.add_row(*(str(r[k]) for k in ("nodes", "target_per_s", "achieved_per_s", "errors", "p50_ms",
                                            "p99_ms", "server_cpu_ms_per_hb", "dead_detected_s", "holds")))
    Console().print(table)
    held = [r["nodes"] for r in rows if r["holds"]]
    Console().print(f"largest N that holds at a {args.interval}s interval: {max(held) if held else 'none'}")


if __name__ == "__main__":
    main()
