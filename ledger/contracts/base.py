"""The plumbing every contract wrapper shares: one web3 connection, the deployment's contract
objects, the optional wallet and its lazily created `TxSender`, and decoding of receipt logs.

It lives apart from the wrappers so that each of them holds only the calls to its own contract,
and so that they all send through one sender (one nonce lock per wallet) and one topic index."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eth_utils import to_checksum_address
from web3 import Web3
from web3.contract import Contract

from intellect.identity import Wallet
from ledger.artifacts import abi, event_topics
from ledger.deploy import DEPLOY_ORDER, Deployment
from ledger.errors import LedgerConfigError, LedgerError
from ledger.models import TxEvent, TxResult
from ledger.tx import TxSender, call_view


class ContractBase:
    """One deployment on one chain, optionally with a wallet for transactions."""

    def __init__(
        self,
        rpc_url: str,
        deployment: Deployment | str | Path,
        wallet: Wallet | None = None,
        *,
        timeout: float = 60.0,
        check: bool = True,
    ):
        if not isinstance(deployment, Deployment):
            deployment = Deployment.load(deployment)
        self.rpc_url = rpc_url
        self.deployment = deployment
        self.wallet = wallet
        self.timeout = timeout
        self.w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": timeout}))
        self.contracts: dict[str, Contract] = {
            name: self.w3.eth.contract(address=to_checksum_address(deployment.address(name)), abi=abi(name))
            for name in DEPLOY_ORDER
        }
        # Each wrapper calls its contract by what it is to the protocol, not by its Solidity name.
        self.token = self.contracts["IntellectToken"]
        self.registry = self.contracts["ComputeRegistry"]
        self.domains = self.contracts["DomainRegistry"]
        self.pools = self.contracts["ComputePool"]
        self._topic_index: dict[bytes, tuple[str, str]] | None = None
        self._sender: TxSender | None = None
        if check:
            self.check()

    def check(self) -> None:
        """Refuse a chain other than the deployment's, or addresses with no contract code."""
        try:
            chain_id = self.w3.eth.chain_id
        except Exception as exc:
            raise LedgerConfigError(f"cannot reach the chain at {self.rpc_url}: {exc}") from None
        if chain_id != self.deployment.chain_id:
            raise LedgerConfigError(
                f"chain id {chain_id} at {self.rpc_url} does not match the deployment's "
                f"{self.deployment.chain_id}: wrong --rpc-url or --deployment"
            )
        for name, contract in self.contracts.items():
            if len(self.w3.eth.get_code(contract.address)) == 0:
                raise LedgerConfigError(
                    f"no contract code for {name} at {contract.address} on {self.rpc_url}"
                )

    @property
    def address(self) -> str:
        return self._require_wallet().address

    def _require_wallet(self) -> Wallet:
        if self.wallet is None:
            raise LedgerConfigError(
                "this action sends a transaction: give a key (--keystore or INTELLECT_PRIVATE_KEY)"
            )
        return self.wallet

    def _tx(self, contract: Contract, fn: str, *args: Any, min_gas: int | None = None) -> TxResult:
        if self._sender is None:
            self._sender = TxSender(
                self.w3,
                self._require_wallet(),
                chain_key=f"{self.deployment.chain_id}:{self.rpc_url}",
                timeout=self.timeout,
            )
        receipt = self._sender.send(contract.address, contract.encode_abi(fn, list(args)), min_gas=min_gas)
        return TxResult(
            tx_hash="0x" + bytes(receipt["transactionHash"]).hex(),
            block_number=receipt["blockNumber"],
            gas_used=receipt["gasUsed"],
            status=receipt["status"],
            events=self.decode_logs(receipt["logs"]),
        )

    def _call(self, contract: Contract, fn: str, *args: Any) -> Any:
        return call_view(lambda: contract.functions[fn](*args).call())

    @staticmethod
    def _created_id(result: TxResult, event: str, field: str) -> int:
        """The id a create call announced in `event` (the contracts emit it on every success)."""
        created = result.event(event)
        if created is None:
            raise LedgerError(f"transaction {result.tx_hash} emitted no {event}")
        return int(created.args[field])

    def decode_logs(self, logs: Sequence[Any]) -> list[TxEvent]:
        if self._topic_index is None:
            self._topic_index = {
                topic: (cname, event)
                for cname in self.contracts
                for topic, event in event_topics(cname).items()
            }
        out = []
        for log in logs:
            if not log["topics"]:
                continue
            hit = self._topic_index.get(bytes(log["topics"][0]))
            if hit is None or to_checksum_address(log["address"]) != self.contracts[hit[0]].address:
                continue
            data = getattr(self.contracts[hit[0]].events, hit[1])().process_log(log)
            out.append(
                TxEvent(
                    name=hit[1],
                    address=data["address"],
                    log_index=data["logIndex"],
                    args={k: _plain(v) for k, v in data["args"].items()},
                )
            )
        return out

    def block_number(self) -> int:
        return self.w3.eth.block_number

    def timestamp(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])


def struct(fields: str, values: Sequence[Any]) -> dict[str, Any]:
    """A struct a view returned, as keyword arguments for its model: `fields` names its members in
    the contract's order, so each struct's layout is written down once, next to its view."""
    return dict(zip(fields.split(), values, strict=True))


def _plain(value: Any) -> Any:
    """Event args as JSON-friendly values (bytes -> 0x hex)."""
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    return value
