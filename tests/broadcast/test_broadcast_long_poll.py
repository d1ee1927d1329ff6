"""`GET /versions?after=N&wait=S`: a new version reaches relays and waiting clients when it is
published, not a poll interval later. Real uvicorn servers; the origin's directory is written by
`publish` as the CLI would, from another thread while the long-poll waits."""

from __future__ import annotations

import threading
import time

import httpx

from tests.broadcast.helpers import SHARD, random_file, sha256
from tests.support.testing import ServerThread
from workloads.broadcast.client import download
from workloads.broadcast.origin import create_origin_app, publish
from workloads.broadcast.relay import create_relay_app
from workloads.broadcast.store import VersionStore

MB = 1_000_000
SLOW_POLL = 60.0  # a plain poll would not see anything new within a test's lifetime


def publish_later(root, src, version: int, delay: float) -> threading.Thread:
    """Publish into the origin's directory from another store, as `intellect-broadcast publish` does."""

    def run() -> None:
        time.sleep(delay)
        publish(VersionStore(root), src, version, SHARD)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_long_poll_answers_when_a_version_is_published_not_when_it_times_out(tmp_path, servers):
    origin = ServerThread(create_origin_app(VersionStore(tmp_path / "o"), poll_seconds=SLOW_POLL)).start()
    servers.append(origin)
    assert httpx.get(f"{origin.url}/versions", params={"after": 0, "wait": 0.2}).json()["versions"] == []
    src = random_file(tmp_path / "ckpt", MB)
    writer = publish_later(tmp_path / "o", src, 1, delay=0.3)
    started = time.monotonic()
    listed = httpx.get(f"{origin.url}/versions", params={"after": 0, "wait": 20}, timeout=30).json()
    waited = time.monotonic() - started
    writer.join()
    assert [v["version"] for v in listed["versions"]] == [1]
    assert waited < 10, f"answered after {waited:.1f}s: at the timeout, not at the publish"
    # Already newer than `after`: answered at once; a bad `wait` is refused with a reason.
    assert httpx.get(f"{origin.url}/versions", params={"after": 0, "wait": 20}).json()["versions"]
    bad = httpx.get(f"{origin.url}/versions", params={"after": 0, "wait": 3600})
    assert bad.status_code == 422 and "wait" in bad.text


def test_an_idle_relay_and_a_waiting_client_get_a_new_version_without_a_poll_interval(tmp_path, servers):
    origin = ServerThread(create_origin_app(VersionStore(tmp_path / "o"), poll_seconds=SLOW_POLL)).start()
    servers.append(origin)
    relay_app = create_relay_app(
        origin.url, VersionStore(tmp_path / "r"), poll_seconds=SLOW_POLL, shard_wait=5
    )
    relay = ServerThread(relay_app).start()
    servers.append(relay)
    src = random_file(tmp_path / "ckpt", 2 * MB + 7)
    writer = publish_later(tmp_path / "o", src, 4, delay=1.0)
    started = time.monotonic()
    # Neither origin (re-reads its directory every 60 s) nor relay (polls every 60 s) would have
    # v4 in time by polling: the relay's long-poll on the origin and the client's on the relay do.
    result = download(4, tmp_path / "out", [relay.url], wait_seconds=30)
    writer.join()
    assert sha256(tmp_path / "out") == sha256(src) == result.digest
    assert time.monotonic() - started < SLOW_POLL / 2
