"""The liveness loop's pass at pool scale: a quiet pass, and the pass after a stall that moves every node.

After the orchestrator (or its Redis) stalls for longer than the TTL, every Healthy node looks late at
once and one pass moves them all to Unhealthy: an SQL update and an audit row per node, the Redis state
mirror, the log. That pass runs exactly when the orchestrator is already behind, so its cost decides
how fast it recovers. Real SQLite, a real Redis; `check_pass` is run as the loop runs it.

    .venv/bin/python bench/liveness_pass.py --nodes 5000 20000

Prints, per pool size: CPU and wall of a quiet pass (every node beat on time) and of the mass pass, and
the mass pass's CPU per moved node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from redis.asyncio import Redis
from rich.console import Console
from rich.table import Table
from sqlalchemy import func, insert, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from intellect.redis_server import EmbeddedRedis  # noqa: E402
from orchestrator.context import Metrics  # noqa: E402
from orchestrator.db import make_engine, migrate, session_factory  # noqa: E402
from orchestrator.live import LiveStore  # noqa: E402
from orchestrator.models import NodeRow, utcnow  # noqa: E402
from orchestrator.monitor import Watchlist, check_pass  # noqa: E402
from orchestrator.settings import OrchestratorSettings  # noqa: E402
from orchestrator.store.nodes import NodeBook  # noqa: E402
from orchestrator.store.tasks import TaskStore  # noqa: E402


async def _no_change() -> None:
    return None


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # the pass's SQL runs in a thread of this process
    return usage.ru_utime + usage.ru_stime


async def _timed(ctx: SimpleNamespace, watchlist: Watchlist) -> tuple[float, float]:
    cpu, wall = _cpu(), time.perf_counter()
    await check_pass(ctx, 0.0, watchlist)
    return _cpu() - cpu, time.perf_counter() - wall


async def one_size(n: int, redis_url: str, work: Path) -> dict[str, float | int]:
    settings = OrchestratorSettings(pool_id=1, state_dir=work / "orch", eject_dead_nodes=False)
    engine = make_engine(f"sqlite:///{work / 'orch.db'}")
    migrate(engine)
    sessions = session_factory(engine)
    addresses = [f"0x{i:040x}" for i in range(1, n + 1)]
    with engine.begin() as conn:
        conn.execute(insert(NodeRow), [
            {"address": a, "state": "Healthy", "misses": 0, "in_pool": True, "invite_attempts": 0,
             "state_changed_at": utcnow(), "created_at": utcnow()} for a in addresses])
    live = LiveStore(Redis.from_url(redis_url), 1, settings.heartbeat_ttl_seconds)
    await live.redis.flushdb()
    book = NodeBook(sessions, live)
    await book.rebuild_mirror()
    ctx = SimpleNamespace(settings=settings, sessions=sessions, live=live, book=book, metrics=Metrics(),
                          tasks=TaskStore(sessions, _no_change))
    watchlist = Watchlist()
    await live.redis.zadd(live.seen_key, {a: time.time() for a in addresses})
    await check_pass(ctx, 0.0, watchlist)  # the first pass sweeps every Healthy address once
    quiet_cpu, quiet_wall = await _timed(ctx, watchlist)
    stalled = time.time() - settings.heartbeat_ttl_seconds - 5
    await live.redis.zadd(live.seen_key, {a: stalled for a in addresses})
    mass_cpu, mass_wall = await _timed(ctx, watchlist)
    with sessions() as session:
        unhealthy = session.scalar(
            select(func.count()).select_from(NodeRow).where(NodeRow.state == "Unhealthy"))
    mirrored = await live.redis.hget(live.state_key, addresses[-1])
    assert unhealthy == n and mirrored == b"Unhealthy", (unhealthy, mirrored)
    await live.redis.aclose()
    engine.dispose()
    return {"nodes": n, "quiet_cpu_s": round(quiet_cpu, 3), "quiet_wall_s": round(quiet_wall, 3),
            "mass_cpu_s": round(mass_cpu, 2), "mass_wall_s": round(mass_wall, 2),
            "mass_cpu_us_per_node": round(mass_cpu / n * 1e6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    import structlog

    # The service logs as JSON lines; here the lines go nowhere but are still built, as in the service.
    structlog.configure(processors=[structlog.processors.JSONRenderer()],
                        logger_factory=structlog.PrintLoggerFactory(open(os.devnull, "w")))  # noqa: SIM115
    rows = []
    with EmbeddedRedis() as redis:
        for n in args.nodes:
            with tempfile.TemporaryDirectory() as work:
                rows.append(asyncio.run(one_size(n, redis.url, Path(work))))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("nodes", "quiet pass CPU s", "quiet wall s", "mass pass CPU s", "mass wall s",
                  "mass CPU µs / node", title="liveness pass: all on time vs. all late after a stall")
    for r in rows:
        keys = ("nodes", "quiet_cpu_s", "quiet_wall_s", "mass_cpu_s", "mass_wall_s", "mass_cpu_us_per_node")
        table.add_row(*(str(r[k]) for k in keys))
    Console().print(table)


if __name__ == "__main__":
    main()
