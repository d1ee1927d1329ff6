"""The storage host of a multi-host devnet (`intellect devnet up --hosts`): an S3-compatible server
(moto's) on a host of its own, `storage`, instead of the orchestrator's embedded disk storage.

With the embedded storage, workers upload to and validators download from the orchestrator's own
API, so "worker ↔ storage" and "worker ↔ orchestrator" would be one link and no partition could tell
them apart. With a storage host the orchestrator only signs: workers PUT to presigned URLs on
`storage` (from behind the home router too: the storage host is public), validators GET from it, and
the orchestrator itself reaches it to check a finished upload (`stat`). So `intellect devnet partition
w2 storage` cuts exactly the upload path of w2.

The server is in memory, as moto is: a restart (`devnet restart storage`) loses the files, as a
wiped disk would, but not the bucket: this module's `serve` makes the bucket every time it starts, so
the orchestrator's URLs work again at once.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from devnet.hosts import Host
from devnet.placement import Placement
from devnet.processes import spawn, wait_healthy
from devnet.state import ManagedProcess
from intellect.net import stable_port

BUCKET = "intellect-devnet"
REGION = "us-east-1"
# moto checks no signatures by default, but boto3 signs nothing without credentials: dummy ones, for
# the orchestrator (recorded with it in devnet.json, so `devnet restart orchestrator` has them too).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "devnet", "AWS_SECRET_ACCESS_KEY": "devnet", "AWS_DEFAULT_REGION": REGION}
INSTALL = "pip install 'moto[server]'"


class StorageUnavailable(RuntimeError):
    """The storage host cannot be started here; the message names what to install or read."""


def require_moto() -> None:
    """One line naming the package, before any host is made for a server that could not start."""
    try:
        import moto.server  # noqa: F401  (its Flask app: the part the standalone server needs)
    except ImportError as exc:
        raise StorageUnavailable(f"`up --hosts` keeps uploads on a storage host, an S3 server from moto "
                                 f"({exc.name} is missing): {INSTALL}") from None


def start_storage(
    where: Placement, env: dict[str, str], directory: Path, progress: Callable[[str], None]
) -> tuple[ManagedProcess, dict[str, str]]:
    """Start the S3 server on the host `storage` and wait until its bucket answers from here (the
    devnet command's leg on the world's internet). Returns the process and the orchestrator's
    environment for it: the bucket, the endpoint (the storage host's address, so the URLs it signs
    point there) and the credentials."""
    require_moto()
    progress("starting the storage host (S3)")
    host: Host | None = where.host("storage")
    port = stable_port()
    url = f"http://{where.address(host)}:{port}"
    argv = [sys.executable, "-m", "devnet.storage", where.bind(host), str(port)]
    storage = spawn("storage", where.wrap(host, argv), env, directory, url)
    wait_healthy(storage, timeout=60)
    _wait_bucket(storage, url)
    orchestrator_env = {
        "INTELLECT_ORCH_S3_BUCKET": BUCKET,
        "INTELLECT_ORCH_S3_ENDPOINT_URL": url,
        "INTELLECT_ORCH_S3_REGION": REGION,
        **CREDENTIALS,
    }
    return storage, orchestrator_env


def _client(url: str):  # noqa: ANN202  (boto3's client type is generated at run time)
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name=REGION,
                        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip


def _wait_bucket(storage: ManagedProcess, url: str, timeout: float = 30.0) -> None:
    """`serve` makes the bucket right after it listens: wait for it, so the orchestrator's first
    grant never meets a store without one."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = _client(url)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.head_bucket(Bucket=BUCKET)
            return
        except (BotoCoreError, ClientError) as exc:
            if not storage.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the storage host has no bucket {BUCKET!r} ({exc}); "
                                   f"see {storage.log}") from None
            time.sleep(0.1)


def serve(bind: str, port: int) -> None:
    """moto's S3 server on `bind:port`, with the devnet's bucket made as soon as it listens."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(bind, port, verbose=False)
    server.start()
    _client(f"http://127.0.0.1:{port}").create_bucket(Bucket=BUCKET)
    print(f"storage: S3 on {bind}:{port}, bucket {BUCKET}", flush=True)
    while True:  # the server runs in a daemon thread; SIGTERM (devnet down) ends the process
        time.sleep(3600)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
