"""A local anvil chain from the project's own node_modules on a free 127.0.0.1 port (embedded default)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx
from eth_account import Account

from intellect.net import free_port
from intellect.processes import stop_process
from intellect.settings import PROJECT_ROOT
from ledger.errors import LedgerError

ANVIL_BIN = PROJECT_ROOT / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEFAULT_ACCOUNTS = 10
# Anvil moves old block states out of memory into a cache folder (by default under ~/.foundry/anvil/tmp,
# shared by every anvil of the machine, and left behind by one that is killed): over the test
# sessions of one machine that reached 67 GB and filled the disk. Each anvil here gets a cache of its
# own, removed when it stops, and keeps at most this many states there.
MAX_PERSISTED_STATES = 256


def dev_keys(count: int = DEFAULT_ACCOUNTS, mnemonic: str = DEV_MNEMONIC) -> list[str]:
    """The private keys anvil funds at start (BIP-44 path m/44'/60'/0'/0/i of its mnemonic)."""
    Account.enable_unaudited_hdwallet_features()
    return [
        "0x" + bytes(Account.from_mnemonic(mnemonic, account_path=f"m/44'/60'/0'/0/{i}").key).hex()
        for i in range(count)
    ]


class Anvil:
    """A running anvil process. Use `Anvil.start()` (or `with Anvil.start() as chain:`)."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, accounts: int, log_path: Path | None,
                 address: str = "127.0.0.1", cache: Path | None = None):  # fmt: skip
        self.process = process
        self._cache = cache  # this anvil's own state cache, removed by `stop` (None: not ours to remove)
        self.port = port
        self.rpc_url = f"http://{address}:{port}"
        self.dev_keys: list[str] = dev_keys(accounts)
        self._log_path = log_path
        self._http = httpx.Client(timeout=10)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def command(self) -> list[str]:
        """anvil's command line, as the devnet records it to recognise the process later. `start`
        always passes a list; `Popen.args` is typed for every form Popen accepts, a lone path too."""
        args = self.process.args
        if isinstance(args, str | bytes | os.PathLike):
            return [os.fsdecode(args)]
        return [str(a) for a in args]

    @classmethod
    def start(
        cls,
        port: int | None = None,
        *,
        chain_id: int = 31337,
        accounts: int = DEFAULT_ACCOUNTS,
        block_time: float | None = None,
        state_path: Path | None = None,
        cache_path: Path | None = None,
        log_path: Path | None = None,
        timeout: float = 20.0,
        host: str = "127.0.0.1",
        address: str | None = None,
        wrap: list[str] | None = None,
    ) -> Anvil:
        """`host`: the bind address; `address`: where clients reach it (default `host`); `wrap`: a
        command prefix it runs under (a network namespace of the multi-host devnet); `cache_path`: where
        it keeps old states (the devnet's own folder; default a temporary folder `stop` removes)."""
        if not ANVIL_BIN.exists():
            raise LedgerError(f"anvil not found at {ANVIL_BIN}: run `make install` (npm ci)")
        attempts = 1 if port is not None else 3  # a random free port can be taken between probe and bind
        last_error = ""
        for _ in range(attempts):
            chosen = port if port is not None else free_port()
            cmd = [
                *(wrap or []),
                str(ANVIL_BIN),
                "--host",
                host,
                "--port",
                str(chosen),
                "--chain-id",
                str(chain_id),
                "--accounts",
                str(accounts),
                "--mnemonic",
                DEV_MNEMONIC,
                "--silent",
            ]
            if block_time:
                cmd += ["--block-time", str(block_time)]
            cache = None if cache_path else Path(tempfile.mkdtemp(prefix="intellect-anvil-"))
            cmd += ["--cache-path", str(cache_path or cache),
                    "--max-persisted-states", str(MAX_PERSISTED_STATES)]
            if state_path:
                # Loaded at start, dumped on exit and every second: a kill -9 loses at most the last
                # second of blocks (the window the devnet documents and its fault test measures).
                cmd += ["--state", str(state_path), "--state-interval", "1"]
            out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            chain = cls(proc, chosen, accounts, log_path, address or host, cache)
            if chain._wait_ready(timeout):
                return chain
            last_error = f"exit code {proc.poll()}"
            chain.stop()
        raise LedgerError(f"anvil did not start ({last_error})")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                self.rpc("eth_chainId")
                return True
            except (httpx.HTTPError, LedgerError):
                time.sleep(0.05)
        return False

    def rpc(self, method: str, params: list | None = None) -> object:
        resp = self._http.post(
            self.rpc_url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}
        )
        body = resp.json()
        if "error" in body:
            raise LedgerError(f"{method}: {body['error'].get('message')}")
        return body["result"]

    def increase_time(self, seconds: int) -> None:
        """Advance the chain clock and mine a block so that `block.timestamp` moves."""
        self.rpc("evm_increaseTime", [int(seconds)])
        self.rpc("evm_mine")

    def mine(self, blocks: int = 1) -> None:
        self.rpc("anvil_mine", [hex(blocks)])

    def snapshot(self) -> str:
        return str(self.rpc("evm_snapshot"))

    def revert(self, snapshot_id: str) -> None:
        if not self.rpc("evm_revert", [snapshot_id]):
            raise LedgerError(f"evm_revert failed for snapshot {snapshot_id}")

    def stop(self) -> None:
        stop_process(self.process, grace=5)
        self._http.close()
        if self._cache is not None:
            shutil.rmtree(self._cache, ignore_errors=True)

    def __enter__(self) -> Anvil:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
