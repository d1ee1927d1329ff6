"""Helpers to start the project's real pieces from a test: uvicorn servers in threads and a devnet.

Used by the discovery, orchestrator and end-to-end tests. Everything runs on 127.0.0.1 free ports and
is stopped by the caller (servers by flag, anvil by pid).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from intellect.http_server import server_options
from intellect.identity import Wallet
from intellect.net import free_port


class ServerThread:
    """A real uvicorn server on a free loopback port, in a thread of this process."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=10, **server_options())  # as the services run
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name=f"uvicorn-{self.port}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:  # set after lifespan start-up and socket bind
            if not self.thread.is_alive():
                raise RuntimeError("server thread exited during start-up (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on port {self.port} did not start in {timeout}s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server and its lifespan; raise if its thread outlives `timeout` even when forced.

        A thread left running keeps the app's background loops alive after the test's Redis and
        chain are gone: they then wrote errors into every later test's captured output (seen in CI).
        """
        self.server.should_exit = True
        self.thread.join(timeout=timeout)
        if self.thread.is_alive():  # open connections or a slow shutdown: stop waiting for them
            self.server.force_exit = True
            self.thread.join(timeout=timeout)
        if self.thread.is_alive():
            raise RuntimeError(
                f"server on port {self.port} did not stop in {2 * timeout:.0f}s; its threads now:\n"
                + _stacks()
            )

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stacks() -> str:
    """Every thread's current stack: where a server that will not stop is stuck."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"--- {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    )


def serve_in_thread(app: Any, port: int | None = None) -> ServerThread:
    return ServerThread(app, port).start()


def wait_for(predicate: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    """`predicate()`'s first truthy value, asked every 0.1 s (AssertionError after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Devnet:
    """A fresh anvil with the contracts deployed, one domain and one started pool.

    `owner` deployed everything (admin roles, minter); `manager` is the pool's manager key.
    """

    anvil: Any
    deployment: Any
    owner: Wallet
    manager: Wallet
    domain_id: int
    pool_id: int
    spare_keys: list[str] = field(default_factory=list)

    @property
    def rpc_url(self) -> str:
        return str(self.anvil.rpc_url)

    def client(self, wallet: Wallet | None = None) -> Any:
        from ledger.client import LedgerClient

        return LedgerClient(self.rpc_url, self.deployment, wallet)

    def new_provider(self, whitelist: bool = True, tokens: int = 1000) -> Wallet:
        """A funded, registered (and by default whitelisted) provider on one of anvil's dev accounts."""
        from ledger.models import ONE_TOKEN

        if not self.spare_keys:
            raise RuntimeError("no more funded dev accounts: start anvil with more accounts")
        provider = Wallet.from_key(self.spare_keys.pop(0))
        owner = self.client(self.owner)
        owner.mint(provider.address, tokens * ONE_TOKEN)
        self.client(provider).register_provider(tokens // 2 * ONE_TOKEN)
        if whitelist:
            owner.whitelist_provider(provider.address)
        return provider

    def new_node(self, provider: Wallet, compute_units: int = 1) -> Wallet:
        node = Wallet.create()
        self.client(provider).add_node(node, compute_units)
        return node

    def join(self, provider: Wallet, node: Wallet) -> None:
        """Join the pool with a fresh invite from the manager (what a worker does on /invite)."""
        import secrets

        from ledger.invites import sign_invite

        invite = sign_invite(
            self.manager,
            self.domain_id,
            self.pool_id,
            node.address,
            int.from_bytes(secrets.token_bytes(32), "big"),
            int(time.time()) + 3600,
        )
        self.client(provider).join_pool(self.pool_id, node.address, invite)

    def stop(self) -> None:
        self.anvil.stop()


def start_devnet(pool_data_uri: str = "", accounts: int = 20) -> Devnet:
    """anvil + the devnet's own pool starter (`devnet.bootstrap.start_pool_on_chain`): contracts, a
    domain and a started pool; the caller stops it (`devnet.stop()`)."""
    from devnet.bootstrap import start_pool_on_chain
    from ledger.dev.anvil import Anvil

    anvil = Anvil.start(accounts=accounts)
    try:
        keys = list(anvil.dev_keys)
        owner = Wallet.from_key(keys.pop(0))
        manager = Wallet.from_key(keys.pop(0))
        # The owner creates the pool (creator rights: end, eject, slashing policy); the manager signs invites.
        chain = start_pool_on_chain(anvil.rpc_url, owner, manager, creator=owner, pool_data_uri=pool_data_uri)
        return Devnet(anvil, chain.deployment, owner, manager, chain.domain_id, chain.pool_id, keys)
    except BaseException:
        anvil.stop()
        raise


def docker_problem(image: str) -> str | None:
    """Why Docker tests cannot run here (no SDK, no engine, no `image`), or None when they can."""
    try:
        import docker
        from docker.errors import DockerException, ImageNotFound
    except ImportError:
        return "the docker SDK is not installed"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except DockerException as exc:
        return f"no Docker engine reachable ({exc}); run scripts/ci-docker.sh"
    try:
        client.images.get(image)
    except ImageNotFound:
        return f"test image {image} missing; run images/build.sh"
    finally:
        client.close()
    return None
