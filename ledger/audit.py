"""The reward audit: for every payout of a node, the work it pays, and for each work key the tx that
submitted it, the validators' votes (tx hashes) and verdicts (reasons), and the claim that paid it.

Everything is rebuilt from the chain's events, replaying `ComputePool`'s reward rules:
- `WorkSubmitted` locks `units × rewardPerUnit` (read at that block) until `timestamp + lock period`;
  a `WorkBatchSubmitted` does the same for each of its files (one lock on chain holds their sum);
- `WorkInvalidated` drops every still-locked reward of the node; `WorkSoftInvalidated` drops that
  work's reward if still locked (a `WorkPardoned` locks it again);
- `RewardsClaimed` at time T pays every lock matured by T that was neither paid nor dropped.

Each payout is then reconciled: the sum of the locks it pays must equal the amount the chain minted.
A payout that does not reconcile is reported as such: nothing the protocol pays stays untraceable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx
from eth_utils import to_checksum_address
from pydantic import BaseModel, Field
from web3.exceptions import Web3Exception

from ledger.client import LedgerClient


class Verdict(BaseModel):
    validator: str
    verdict: str
    reasons: list[str] = Field(default_factory=list)
    tx_hash: str | None = None


class AuditedWork(BaseModel):
    pool_id: int
    work_key: str
    node: str
    units: int
    reward: int
    submitted_tx: str
    submitted_block: int
    batch_index: int | None = Field(None, description="the submitWorkBatch it came in (None: alone)")
    unlock_at: int
    status: str = "submitted"  # submitted | paid | dropped | invalidated | soft_invalidated
    invalidated_tx: str | None = Field(
        None, description="the transaction that invalidated it (slash or soft); if its reward had already "
        "matured, the chain still pays it",
    )
    dropped_tx: str | None = None
    paid_tx: str | None = None
    votes: list[Verdict] = Field(default_factory=list, description="on chain: InvalidationVoted")
    verdicts: list[Verdict] = Field(default_factory=list, description="from the validators' APIs")


class Payout(BaseModel):
    node: str
    provider: str
    amount: int
    tx_hash: str
    block: int
    timestamp: int
    work: list[AuditedWork]
    reconciled: bool = Field(description="the paid locks add up to the minted amount")


class Audit(BaseModel):
    node: str
    payouts: list[Payout]
    unpaid: list[AuditedWork] = Field(description="work not (yet) paid: locked, dropped or claimable")
    notes: list[str] = Field(default_factory=list, description="what the chain node could not show, and "
                             "what the audit read instead")


def _hex(value: Any) -> str:
    return "0x" + bytes(value).hex()


def _logs(event: Any, start: int, filters: dict[str, Any]) -> list[Any]:
    return list(event.get_logs(from_block=start, argument_filters=filters))


class Auditor:
    def __init__(self, client: LedgerClient, validator_urls: Iterable[str] = (), timeout: float = 10.0):
        self.c = client
        self.validator_urls = [u.rstrip("/") for u in validator_urls]
        self.timeout = timeout
        self._times: dict[int, int] = {}
        self._stateless: set[int] = set()  # blocks whose state the node no longer holds
        self._notes_missing = ""
        self._submitters: dict[str, str] | None = None

    def _timestamp(self, block: int) -> int:
        if block not in self._times:
            self._times[block] = int(self.c.w3.eth.get_block(block)["timestamp"])
        return self._times[block]

    def _at(self, call: Any, block: int) -> Any:
        """`call` as of `block`; the latest value when the node holds no state for that block (a node
        restarted from a state file, or a pruned one keeps logs but not old state): said in the notes."""
        try:
            return call.call(block_identifier=block)
        except (Web3Exception, ValueError) as exc:
            if block not in self._stateless:
                self._stateless.add(block)
                self._notes_missing = f"{exc}"[:200]
            return call.call(block_identifier="latest")

    def _param(self, name: str, block: int) -> int:
        return int(self._at(getattr(self.c.pools.functions, name)(), block))

    def _lock(self, pool_id: int, block: int) -> int:
        """How long a reward submitted at `block` stays locked: the lock period, or the pool's voting
        window if that is longer (the contract never unlocks a reward before its window closes)."""
        policy = self._at(self.c.pools.functions.slashingPolicies(pool_id), block)
        window = int(policy[1]) or self._param("invalidationWindow", block)
        return max(self._param("rewardLockPeriod", block), window)

    def _notes(self) -> list[str]:
        if not self._stateless:
            return []
        blocks = sorted(self._stateless)
        shown = ", ".join(str(b) for b in blocks[:5])
        if len(blocks) > 5:
            shown += f" and {len(blocks) - 5} more"
        return [
            f"the chain node holds no state for block(s) {shown} (restarted from a state file, or pruned): "
            "rewards per unit, lock periods and voting windows were read at the latest block instead, which "
            f"is exact unless the pool's parameters changed since ({self._notes_missing})"
        ]

    def node(self, node: str) -> Audit:
        node = to_checksum_address(node)
        start = self.c.deployment.block
        ev = self.c.pools.events
        timeline: list[tuple[int, int, str, Any]] = []
        for name in ("WorkSubmitted", "WorkBatchSubmitted", "WorkInvalidated", "WorkSoftInvalidated",
                     "WorkPardoned"):
            for log in _logs(getattr(ev, name)(), start, {"node": node}):
                timeline.append((log["blockNumber"], log["logIndex"], name, log))
        for log in _logs(ev.RewardsClaimed(), start, {"node": node}):
            timeline.append((log["blockNumber"], log["logIndex"], "RewardsClaimed", log))
        timeline.sort(key=lambda t: (t[0], t[1]))

        works: dict[tuple[int, str], AuditedWork] = {}
        order: list[AuditedWork] = []
        payouts: list[Payout] = []
        for block, _, name, log in timeline:
            args, tx = log["args"], _hex(log["transactionHash"])
            now = self._timestamp(block)
            if name in ("WorkSubmitted", "WorkBatchSubmitted"):
                batch = name == "WorkBatchSubmitted"
                files = zip(args["workKeys"], args["units"], strict=True) if batch else [(args["workKey"],
                                                                                          args["units"])]
                for work_key, units in files:
                    w = AuditedWork(
                        pool_id=args["poolId"],
                        work_key=_hex(work_key),
                        node=node,
                        units=units,
                        reward=units * self._param("rewardPerUnit", block),
                        submitted_tx=tx,
                        submitted_block=block,
                        batch_index=args["batchIndex"] if batch else None,
                        unlock_at=args["timestamp"] + self._lock(args["poolId"], block),
                    )
                    works[(w.pool_id, w.work_key)] = w
                    order.append(w)
            elif name == "WorkInvalidated":
                for w in order:  # the node's every still-locked reward is dropped
                    if w.status == "submitted" and w.unlock_at > now:
                        w.status, w.dropped_tx = "dropped", tx
                hit = works.get((args["poolId"], _hex(args["workKey"])))
                if hit is not None:
                    hit.invalidated_tx = tx  # matured already? then the chain still pays it
                    if hit.status == "dropped":
                        hit.status = "invalidated"
            elif name == "WorkSoftInvalidated":
                hit = works.get((args["poolId"], _hex(args["workKey"])))
                if hit is not None:
                    hit.invalidated_tx = tx
                    if hit.status == "submitted" and hit.unlock_at > now:
                        hit.status, hit.dropped_tx = "soft_invalidated", tx
            elif name == "WorkPardoned":
                hit = works.get((args["poolId"], _hex(args["workKey"])))
                if hit is not None and hit.status == "soft_invalidated":
                    hit.status, hit.dropped_tx = "submitted", None
            else:  # RewardsClaimed: every matured, unpaid, undropped lock
                paid = [w for w in order if w.status == "submitted" and w.unlock_at <= now]
                for w in paid:
                    w.status, w.paid_tx = "paid", tx
                payouts.append(
                    Payout(
                        node=node,
                        provider=args["provider"],
                        amount=args["amount"],
                        tx_hash=tx,
                        block=block,
                        timestamp=now,
                        work=paid,
                        reconciled=sum(w.reward for w in paid) == args["amount"],
                    )
                )
        self._attach_votes(order)
        self._attach_verdicts(order, node)
        return Audit(node=node, payouts=payouts, unpaid=[w for w in order if w.status != "paid"],
                     notes=self._notes())

    def work_key(self, work_key: str) -> tuple[Audit, AuditedWork]:
        """The audit of the node that submitted `work_key`, and that work's own entry."""
        key = work_key.lower()
        ev, start = self.c.pools.events, self.c.deployment.block
        logs = [log for log in _logs(ev.WorkSubmitted(), start, {}) if _hex(log["args"]["workKey"]) == key]
        logs += [
            log for log in _logs(ev.WorkBatchSubmitted(), start, {})
            if key in {_hex(k) for k in log["args"]["workKeys"]}
        ]  # fmt: skip
        if not logs:
            raise LookupError(f"no WorkSubmitted for {work_key} on this chain")
        audit = self.node(logs[0]["args"]["node"])
        entry = next(
            w for w in [*audit.unpaid, *(w for p in audit.payouts for w in p.work)] if w.work_key == key
        )
        return audit, entry

    def submitter(self, work_key: str) -> str | None:
        """The node that submitted `work_key` (alone or in a batch), None if the chain never took it. The
        submissions are read once per auditor."""
        if self._submitters is None:
            ev, start = self.c.pools.events, self.c.deployment.block
            found: dict[str, str] = {}
            for log in _logs(ev.WorkSubmitted(), start, {}):
                found.setdefault(_hex(log["args"]["workKey"]), log["args"]["node"])
            for log in _logs(ev.WorkBatchSubmitted(), start, {}):
                for key in log["args"]["workKeys"]:
                    found.setdefault(_hex(key), log["args"]["node"])
            self._submitters = found
        return self._submitters.get(work_key.lower())

    def _attach_votes(self, works: list[AuditedWork]) -> None:
        by_key = {(w.pool_id, w.work_key): w for w in works}
        for pool in {w.pool_id for w in works}:
            for log in _logs(
                self.c.pools.events.InvalidationVoted(), self.c.deployment.block, {"poolId": pool}
            ):
                w = by_key.get((pool, _hex(log["args"]["workKey"])))
                if w is not None:
                    w.votes.append(
                        Verdict(
                            validator=log["args"]["validator"],
                            verdict="soft" if log["args"]["soft"] else "invalidate",
                            tx_hash=_hex(log["transactionHash"]),
                        )
                    )

    def _attach_verdicts(self, works: list[AuditedWork], node: str) -> None:
        by_key = {w.work_key: w for w in works}
        for url in self.validator_urls:
            after = 0
            while True:
                try:
                    page = httpx.get(
                        f"{url}/verdicts", params={"after": after, "limit": 1000}, timeout=self.timeout
                    )
                    page.raise_for_status()
                    items = page.json().get("items", [])
                except (httpx.HTTPError, ValueError) as exc:
                    raise ConnectionError(f"validator {url} unreachable: {exc}") from None
                if not items:
                    break
                for item in items:
                    w = by_key.get(str(item.get("work_key", "")).lower())
                    if w is not None and str(item.get("node", "")).lower() == node.lower():
                        w.verdicts.append(
                            Verdict(
                                validator=url,
                                verdict=item["verdict"],
                                reasons=item.get("reasons") or [],
                                tx_hash=item.get("tx_hash"),
                            )
                        )
                after = items[-1]["cursor"]
        for w in works:  # a vote's reasons are those of the verdict its validator sent it for
            reasons = {v.tx_hash.lower(): v.reasons for v in w.verdicts if v.tx_hash}
            for vote in w.votes:
                if not vote.reasons and (vote.tx_hash or "").lower() in reasons:
                    vote.reasons = reasons[(vote.tx_hash or "").lower()]
