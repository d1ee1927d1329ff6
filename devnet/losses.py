"""What a devnet run lost, counted twice or punished wrongly: the books of a run after partitions.

Read from the run's own records, each the only writer of its part: every honest worker's file record
(`worker.files`: what it made and what became of it), the chain (`WorkSubmitted`, invalidations,
votes and payouts, through `ledger.audit.Auditor`) and every validator's `/verdicts`.

- lost: a file an honest worker made that never reached the chain, or was refused by its uploader;
  a file on chain that some validator never judged;
- duplicated: a file judged twice by one validator, a vote cast twice by one validator on one file,
  a work key in two payouts;
- wrongly punished: an honest file dropped, invalidated or soft-invalidated on chain (its pay gone),
  a vote to slash (`invalidate`) an honest file by any validator, an honest node out of the pool;
- stale: an honest file the quorum soft-invalidated only for freshness (it reached the validators
  after the trainer had moved past its step): not paid by policy, never slashed; counted apart;
- framed: an honest member's file of a group batch that failed end to end, the quorum naming another
  member to blame (`group: … this member is not to blame`): nobody is paid for a broken batch, by
  policy, and the honest member is never slashed (docs/pipeline.md); counted apart;
- soft votes: one validator's `soft_invalidate` on an honest file (it could not judge it: behind the
  trainer, cut from storage). Counted apart: a soft vote costs nothing below the pool's quorum; what
  it took is under "wrongly" (on chain).

Only files made before `cutoff` count: the run may still be going, and a file made a second ago is
in flight, not lost. `drain` seconds are given for what was made before it to get through.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from ledger.audit import AuditedWork, Auditor
from ledger.client import LedgerClient
from worker.files import FILES_DB, FileState, WorkerFile, WorkerFiles

SETTLED = (FileState.SUBMITTED, FileState.REFUSED)  # a file's fate known: on chain, or refused (a finding)


@dataclass(frozen=True)
class Finding:
    kind: str  # lost | duplicated | wrongly | stale | soft_vote
    at: float  # unix time of the event (when the file was made, submitted or judged)
    what: str


@dataclass
class Worker:
    name: str  # w1, w2…
    node: str  # its node address
    state_dir: Path  # the worker's state folder (holds its file record, bridge/files.sqlite)


def all_verdicts(url: str) -> list[dict]:
    """Every verdict a validator's API lists, page by page."""
    items: list[dict] = []
    while True:
        after = items[-1]["cursor"] if items else 0
        page = httpx.get(f"{url}/verdicts", params={"after": after, "limit": 1000}, timeout=10)
        page.raise_for_status()
        new = page.json().get("items", [])
        if not new:
            return items
        items.extend(new)


def _unpaid_kind(work: AuditedWork) -> str:
    """"stale" when the quorum that took the file's pay found only that it came too late for the
    trainer (made or delivered after the trainer moved past its step: not trained on, so not paid, by
    policy, and never slashed); "framed" when it found only that the file's group batch failed end to end
    through another member; otherwise "wrongly"."""
    reasons = [r for v in work.verdicts if v.verdict == "soft_invalidate" for r in v.reasons]
    if work.status == "soft_invalidated" and reasons and all(r.startswith("freshness:") for r in reasons):
        return "stale"
    if work.status == "soft_invalidated" and reasons and all(
            r.startswith("group:") and "this member is not to blame" in r for r in reasons):
        return "framed"
    return "wrongly"


class Books:
    def __init__(self, ledger: LedgerClient, pool_id: int, workers: list[Worker], validators: dict[str, str],
                 cheater: str = "") -> None:  # fmt: skip
        self.ledger = ledger
        self.pool_id = pool_id
        self.workers = workers
        self.validators = validators  # name → URL
        self.cheater = cheater.lower()
        self.auditor = Auditor(ledger, list(validators.values()))
        self._stamps: dict[int, float] = {}

    def _when(self, block: int) -> float:
        if block not in self._stamps:
            self._stamps[block] = float(self.ledger.w3.eth.get_block(block)["timestamp"])
        return self._stamps[block]

    @staticmethod
    def _files(worker: Worker) -> list[WorkerFile]:
        return [f for db in worker.state_dir.rglob(FILES_DB) for f in WorkerFiles(db).all()]

    def _made(self, worker: Worker, cutoff: float) -> list[WorkerFile]:
        """Each file the worker made before `cutoff`."""
        return [f for f in self._files(worker) if f.announced_at.timestamp() <= cutoff]

    def _works(self, worker: Worker, cutoff: float) -> tuple[list[AuditedWork], list[list[str]]]:
        audit = self.auditor.node(worker.node)
        works = [x for x in [*audit.unpaid, *(y for p in audit.payouts for y in p.work)]
                 if self._when(x.submitted_block) <= cutoff]  # fmt: skip
        return works, [[y.work_key for y in p.work] for p in audit.payouts]

    def settled(self, cutoff: float) -> bool:
        """Every file made before `cutoff` is on chain and judged by every validator."""
        for worker in self.workers:
            if any(f.state not in SETTLED for f in self._made(worker, cutoff)):
                return False
            works, _ = self._works(worker, cutoff)
            if any(len({v.validator for v in x.verdicts}) < len(self.validators) for x in works):
                return False
        return True

    def findings(self, cutoff: float, drain: float = 0.0) -> tuple[list[Finding], dict[str, int]]:
        """Wait up to `drain` s for the books to settle, then every finding and the counts it read."""
        deadline = time.time() + drain
        while time.time() < deadline and not self.settled(cutoff):
            time.sleep(5)
        found: list[Finding] = []
        made = on_chain = 0
        for worker in self.workers:
            files = self._made(worker, cutoff)
            made += len(files)
            found += [Finding("lost", f.announced_at.timestamp(), f"{worker.name} file {f.sha256[:10]} made "
                              "but not on chain") for f in files if f.state not in SETTLED]  # fmt: skip
            found += [Finding("lost", (f.updated_at or f.announced_at).timestamp(),
                              f"{worker.name} file {f.sha256[:10]} rejected: {f.reason}")
                      for f in files if f.state == FileState.REFUSED]  # fmt: skip
            works, payouts = self._works(worker, cutoff)
            on_chain += len(works)
            for x in works:
                at, file = self._when(x.submitted_block), f"{worker.name} file {x.work_key[:10]}"
                judged_by = {v.validator for v in x.verdicts}
                if len(judged_by) < len(self.validators):
                    found.append(Finding("lost", at, f"{file} judged by {len(judged_by)} of "
                                                     f"{len(self.validators)} validators"))  # fmt: skip
                if x.status in ("invalidated", "dropped", "soft_invalidated"):
                    found.append(Finding(_unpaid_kind(x), at, f"{file} {x.status}"))
                if any(n > 1 for n in Counter(v.validator for v in x.votes).values()):
                    found.append(Finding("duplicated", at, f"{file} voted twice"))
            for key, n in Counter(k for keys in payouts for k in keys).items():
                if n > 1:
                    found.append(Finding("duplicated", time.time(),
                                         f"{worker.name} work {key[:10]} paid {n} times"))
            if not self.ledger.is_node_in_pool(self.pool_id, worker.node):
                found.append(Finding("wrongly", time.time(), f"{worker.name} out of the pool"))
        honest = {w.node.lower() for w in self.workers}
        for name, url in self.validators.items():
            items = all_verdicts(url)
            for key, n in Counter(v["work_key"] for v in items).items():
                if n > 1:
                    at = max(v["decided_at"] for v in items if v["work_key"] == key)
                    found.append(Finding("duplicated", at, f"{name} judged {key[:10]} {n} times"))
            for v in items:
                node = str(v["node"]).lower()
                if node in honest and node != self.cheater and v["verdict"] != "accept":
                    kind = "wrongly" if v["verdict"] == "invalidate" else "soft_vote"
                    found.append(Finding(kind, v["decided_at"], f"{name}: {v['verdict']} on an honest "
                                         f"file: {(v.get('reasons') or [''])[0][:100]}"))  # fmt: skip
        return found, {"honest_files_made": made, "honest_files_on_chain": on_chain}
