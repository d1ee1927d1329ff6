"""Sending transactions: per-sender nonces safe across threads, receipt wait with timeout, retries
with a fee bump on underpriced / nonce races, a resend when another sender of the same key replaced
the transaction, and reverts decoded to the named custom error."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from eth_typing import ChecksumAddress, Hash32, HexStr
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential
from web3 import Web3
from web3.exceptions import ContractLogicError, TransactionNotFound, Web3RPCError
from web3.types import TxParams, TxReceipt, Wei

from intellect.identity import Wallet
from ledger.artifacts import decode_error
from ledger.errors import ContractRevert, InsufficientFunds, LedgerError, LedgerTimeout

T = TypeVar("T")
log = structlog.get_logger(__name__)

# Messages of RPC errors worth retrying with a fresh nonce and higher fees (geth, anvil, reth, erigon).
_RETRYABLE = (
    "nonce too low",
    "underpriced",
    "already known",
    "replacement",
    "less than block base fee",
    "nonce has already been used",
)
BUMP = 1.25  # fee multiplier per retry (>= 10 % is what nodes require to replace a pending tx)
NONCE_CHECK_SECONDS = 0.5  # how often a receipt wait asks whether its nonce went to another tx
# How long a transaction whose nonce was used but whose receipt is not found yet is still looked for
# before it counts as replaced. A node can show the sender's nonce moved before it serves the receipt
# of the very transaction that moved it (seen with anvil on a busy machine: the transaction was then
# sent again and reverted as a duplicate, WorkAlreadySubmitted / NodeAlreadyRegistered).
REPLACED_GRACE_SECONDS = 3.0


class _Retry(Exception):
    pass


class NonceManager:
    """One lock per (chain, sender) for the whole process.

    The nonce is read as the sender's *pending* count while the lock is held, and the lock is only
    released once the node accepted the transaction, so concurrent threads never reuse a nonce and a
    chain reset (anvil snapshot revert) never leaves a gap.
    """

    _guard = threading.Lock()
    _locks: dict[tuple[str, str], threading.Lock] = {}

    @classmethod
    def lock_for(cls, chain_key: str, address: str) -> threading.Lock:
        key = (chain_key, address.lower())
        with cls._guard:
            return cls._locks.setdefault(key, threading.Lock())


def revert_from(exc: ContractLogicError) -> ContractRevert:
    decoded = decode_error(exc.data if isinstance(exc.data, str | bytes) else None)
    if decoded is not None:
        return ContractRevert(decoded[0], decoded[1], raw=str(exc.data))
    message = str(exc.message or exc) if hasattr(exc, "message") else str(exc)
    return ContractRevert("Unknown", {"message": message}, raw=str(exc.data))


def call_view(fn: Callable[[], T]) -> T:
    """Run an eth_call, turning a revert into ContractRevert."""
    try:
        return fn()
    except ContractLogicError as exc:
        raise revert_from(exc) from None


class TxSender:
    def __init__(self, w3: Web3, wallet: Wallet, chain_key: str, timeout: float = 60.0, attempts: int = 8):
        self.w3 = w3
        self.wallet = wallet
        # web3 wants a ChecksumAddress; the account's own address is one (Wallet.address is it, as str)
        self.address: ChecksumAddress = wallet.account.address
        self.timeout = timeout
        self.attempts = attempts
        self._lock = NonceManager.lock_for(chain_key, wallet.address)

    def _fees(self, attempt: int) -> dict[str, int]:
        base = self.w3.eth.get_block("latest").get("baseFeePerGas") or 0
        try:
            tip = int(self.w3.eth.max_priority_fee)
        except Exception:
            tip = 10**9
        tip = max(tip, 1)
        factor = BUMP**attempt
        return {"maxPriorityFeePerGas": int(tip * factor), "maxFeePerGas": int((2 * base + tip) * factor)}

    def _request(self, to: str | None, data: str, value: int) -> TxParams:
        """A call or estimate of the transaction (without `to`: a contract creation)."""
        tx: TxParams = {"from": self.address, "data": HexStr(data), "value": Wei(value)}
        if to is not None:
            tx["to"] = to
        return tx

    def estimate(self, to: str | None, data: str, value: int = 0) -> int:
        try:
            return int(self.w3.eth.estimate_gas(self._request(to, data, value)))
        except ContractLogicError as exc:
            raise revert_from(exc) from None
        except Web3RPCError as exc:
            raise self._funds_error(exc) or exc from None

    def _funds_error(self, exc: Exception) -> InsufficientFunds | None:
        """The node's "insufficient funds for gas * price + value", said in words, or None."""
        if "insufficient funds" not in str(exc).lower():
            return None
        balance = self.w3.eth.get_balance(self.address)
        return InsufficientFunds(
            f"{self.address} cannot pay for gas: it holds {balance / 10**18:.6f} ETH. Send it some ETH "
            f"(on a devnet: `intellect devnet fund {self.address}`)"
        )

    def send(
        self, to: str | None, data: str, value: int = 0, gas: int | None = None, min_gas: int | None = None
    ) -> dict[str, Any]:
        """Send and wait for the receipt; raises ContractRevert if it reverts (before or after mining).
        `min_gas`: estimate as usual (a revert still names its error), but send at least this much."""
        if gas is None:
            gas = self.estimate(to, data, value)
            gas = int(gas * 1.2) + 10_000
            if min_gas is not None:
                gas = max(gas, min_gas)
        state = {"attempt": 0, "nonce": 0}

        def once() -> Hash32:
            tx: dict[str, Any] = {
                "from": self.wallet.address,
                "data": data,
                "value": value,
                "gas": gas,
                "chainId": self.w3.eth.chain_id,
                "type": 2,
                **self._fees(state["attempt"]),
            }
            if to is not None:
                tx["to"] = to
            state["attempt"] += 1
            with self._lock:
                tx["nonce"] = state["nonce"] = self.w3.eth.get_transaction_count(self.address, "pending")
                signed = self.wallet.account.sign_transaction(tx)
                try:
                    return Hash32(bytes(self.w3.eth.send_raw_transaction(signed.raw_transaction)))
                except Web3RPCError as exc:
                    if any(s in str(exc).lower() for s in _RETRYABLE):
                        log.warning(
                            "retrying nonce", nonce=tx["nonce"], sender=self.wallet.address, error=str(exc)
                        )
                        raise _Retry(str(exc)) from exc
                    raise self._funds_error(exc) or LedgerError(f"transaction rejected: {exc}") from None

        retrying = Retrying(
            retry=retry_if_exception_type(_Retry),
            stop=stop_after_attempt(self.attempts),
            # jittered: processes sharing a key that collided on a nonce must not retry in lockstep
            wait=wait_random_exponential(multiplier=0.05, max=2),
            reraise=True,
        )
        for _ in range(self.attempts):
            try:
                tx_hash = retrying(once)
            except _Retry as exc:
                raise LedgerError(f"transaction not accepted after {self.attempts} attempts: {exc}") from None
            receipt = self._wait(tx_hash, state["nonce"])
            if receipt is not None:
                break
            # Another process with this key took the nonce (its fee-bumped retry replaced ours in the
            # pool, or the node dropped ours): ours was never mined, so sending it again is safe.
            log.warning(
                "transaction replaced; sending it again", tx=f"0x{tx_hash.hex()}", nonce=state["nonce"]
            )
            state["attempt"] = 0  # a fresh nonce needs no higher fee
        else:
            raise LedgerError(f"transaction replaced by another of this sender {self.attempts} times")
        if receipt["status"] != 1:
            raise self._explain_failure(to, data, value, receipt)
        return dict(receipt)

    def _wait(self, tx_hash: Hash32, nonce: int) -> TxReceipt | None:
        """The receipt, or None once the sender's nonce was used by a transaction that is not this one.

        web3's `wait_for_transaction_receipt` would wait out its whole timeout for a transaction that
        was replaced, so the sender's mined nonce is watched too (every half second: a replacement is
        rare, and the receipt poll runs every 50 ms)."""
        deadline = time.monotonic() + self.timeout
        next_nonce_check = 0.0
        while True:
            try:
                return self.w3.eth.get_transaction_receipt(tx_hash)
            except TransactionNotFound:
                pass
            now = time.monotonic()
            if now >= next_nonce_check:
                next_nonce_check = now + NONCE_CHECK_SECONDS
                if self.w3.eth.get_transaction_count(self.address, "latest") > nonce:
                    return self._mined_or_replaced(tx_hash)
            if now > deadline:
                raise LedgerTimeout(f"no receipt for 0x{tx_hash.hex()} within {self.timeout:.0f}s")
            time.sleep(0.05)

    def _mined_or_replaced(self, tx_hash: Hash32) -> TxReceipt | None:
        """The sender's nonce is used: this transaction's receipt if it is the one that used it, else None
        (replaced). It counts as replaced only when the node shows it in no block and no receipt came
        within a grace period: sending a mined transaction again would run it twice."""
        started = time.monotonic()
        while True:
            try:
                return self.w3.eth.get_transaction_receipt(tx_hash)
            except TransactionNotFound:
                pass
            try:
                mined = self.w3.eth.get_transaction(tx_hash).get("blockNumber") is not None
            except TransactionNotFound:
                mined = False
            waited = time.monotonic() - started
            if not mined and waited >= REPLACED_GRACE_SECONDS:
                return None
            if waited > self.timeout:
                raise LedgerTimeout(f"no receipt for 0x{tx_hash.hex()} (mined) within {self.timeout:.0f}s")
            time.sleep(0.05)

    def _explain_failure(self, to: str | None, data: str, value: int, receipt: Any) -> ContractRevert:
        """Replay a mined-but-reverted transaction as a call to recover its custom error."""
        try:
            before = max(receipt["blockNumber"] - 1, 0)
            self.w3.eth.call(self._request(to, data, value), block_identifier=before)
        except ContractLogicError as exc:
            return revert_from(exc)
        except Exception:
            pass
        return ContractRevert("Unknown", {"tx_hash": "0x" + bytes(receipt["transactionHash"]).hex()})
