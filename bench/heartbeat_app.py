"""CPU per heartbeat inside the orchestrator's app: no network, no HTTP server, no load generator.

The real app (`create_app`, its lifespan, an embedded Redis, SQLite with 50 Healthy nodes, no chain: a
stand-in pool) is driven through ASGI with pre-signed heartbeats, and the process's CPU time per beat is
measured in rounds. Two ways in, side by side:

- `hot`: as served: `OrchestratorApp` calls the heartbeat route's endpoint ahead of the middleware
  stack (orchestrator/api/hot_path.py);
- `stack`: the same route as an ordinary one: the middleware stack, FastAPI's router and its
  request/response wrapper around it (what routing the heartbeat like every other route would cost).

Quicker and steadier than bench/heartbeats.py (which also counts uvicorn, the sockets and the load
generator on the same cores) for a change to the route's path through the app:

    .venv/bin/python bench/heartbeat_app.py [--beats 3000] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastapi import FastAPI  # noqa: E402

from intellect.identity import Wallet  # noqa: E402
from intellect.redis_server import EmbeddedRedis  # noqa: E402
from intellect.signing import sign_request  # noqa: E402
from orchestrator.db import make_engine, migrate, session_factory  # noqa: E402
from orchestrator.models import NodeRow, utcnow  # noqa: E402
from orchestrator.server import create_app  # noqa: E402
from orchestrator.settings import OrchestratorSettings  # noqa: E402

BODY = b'{"metrics":{"tokens_per_s":123.0},"worker_version":"0.1.0"}'


class StandInPool:
    """The chain as the lifespan needs it with the loops off: nothing is asked of it."""

    pool_id, domain_id = 1, 1

    def __init__(self, manager: Wallet) -> None:
        self.manager = manager


def seed(state_dir: Path, nodes: list[Wallet]) -> None:
    engine = make_engine(f"sqlite:///{state_dir / 'orchestrator.db'}")
    migrate(engine)
    with session_factory(engine)() as session, session.begin():
        session.add_all(NodeRow(address=n.address, state="Healthy", misses=0, in_pool=True, invite_attempts=0,
                                state_changed_at=utcnow(), created_at=utcnow()) for n in nodes)
    engine.dispose()


async def beat(app: FastAPI, headers: dict[str, str], way: str) -> None:
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/heartbeat", "raw_path": b"/heartbeat", "query_string": b"", "root_path": "", "headers": raw,
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {},
    }  # fmt: skip
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    if way == "hot":
        await app(scope, receive, send)
    else:  # FastAPI's own entry: the middleware stack and the router, past the hot dispatch
        await FastAPI.__call__(app, scope, receive, send)
    if sent[0]["status"] != 200:
        raise RuntimeError(f"heartbeat answered {sent[0]['status']}: {sent[1].get('body')!r}")


async def measure(ways: list[str], beats: int, rounds: int) -> dict[str, dict[str, Any]]:
    nodes = [Wallet.create() for _ in range(50)]
    state_dir = Path(tempfile.mkdtemp(prefix="heartbeat-app-"))
    seed(state_dir, nodes)
    out: dict[str, dict[str, Any]] = {}
    with EmbeddedRedis() as redis:
        manager = Wallet.create()
        settings = OrchestratorSettings(pool_id=1, redis_url=redis.url, state_dir=state_dir,
                                        run_background_loops=False, heartbeat_rate_limit_per_minute=10**9)
        app = create_app(settings, manager=manager, chain=StandInPool(manager))
        async with app.router.lifespan_context(app):
            for way in ways:
                signed = [sign_request(nodes[i % len(nodes)], "POST", "/heartbeat", BODY)
                          for i in range(beats + 200)]
                for headers in signed[:200]:  # warm-up: the plan, the reply cache, the Redis script
                    await beat(app, headers, way)
                per_round, each = [], beats // rounds
                for r in range(rounds):
                    started = time.process_time()
                    for headers in signed[200 + r * each:200 + (r + 1) * each]:
                        await beat(app, headers, way)
                    per_round.append(round((time.process_time() - started) / each * 1e6))
                out[way] = {"median_us": statistics.median(per_round), "rounds_us": per_round}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beats", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--way", choices=["hot", "stack"], action="append",
                        help="only this way in (repeatable; default both)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(measure(args.way or ["hot", "stack"], args.beats, args.rounds))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for way, figures in result.items():
        print(f"{way:6} {figures['median_us']:6.0f} µs of CPU a heartbeat (rounds: {figures['rounds_us']})")


if __name__ == "__main__":
    main()
