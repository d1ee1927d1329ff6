"""From the worker's file record to storage and the chain: upload each announced file, then
`submitWork` once.

Per file (`worker.files`: one record per file, announced → uploaded → sending → submitted | refused):
1. upload: `POST /storage/request-upload` signed by the node key (`intellect.client`) → `UploadGrant`
   → PUT the file to the signed URL (tenacity retries on network errors and 5xx; a 4xx is never
   retried). A 409 "already uploaded" means an earlier run finished the PUT: the file counts as uploaded.
2. submit: `ComputePool.submitWork(pool, node, sha256, units)` sent with the **provider key** (the
   contract accepts the provider or the node; the provider holds the gas, the node key only signs).
   Exactly once, even across worker restarts: the intent (`sending`) is written to the file's record
   before the transaction is sent. An intent without a result means "maybe sent": the chain is asked
   (`getWork`) before anything is sent again, and a `WorkAlreadySubmitted` revert for a key the chain
   records under our node is success (its transaction hash is read from the `WorkSubmitted` event).
A file that can never succeed (the orchestrator refuses it for good, the key belongs to another node,
zero work units) is recorded as `refused` with the reason and is not retried.

Batched (`batch_files` > 1): uploaded files wait until `batch_files` of them are ready, or the oldest
has waited `batch_age` seconds since its upload, then go out in one `submitWorkBatch` (in upload order,
under a standard Merkle root, ledger/merkle.py). The intent is written for every file of the batch
before the transaction; a file left "maybe sent" is looked up on chain alone before it joins a batch
again, and the contract refuses any key already counted, so a crash between send and record can
neither lose a file nor count it twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import httpx
import structlog
from eth_utils import to_checksum_address
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from intellect.client import OrchestratorClient, TaskApiError
from intellect.identity import Wallet
from intellect.wire.storage import UploadGrant, UploadRequest
from ledger.client import LedgerClient
from ledger.errors import ContractRevert, LedgerError
from ledger.events import EventReader, WorkSubmittedEvent
from ledger.merkle import MAX_BATCH
from worker.files import FileState, WorkerFile, WorkerFiles

log = structlog.get_logger("intellect.worker.uploader")

# Reverts that will never turn into success by retrying.
FINAL_REVERTS = {"WorkKeyInvalidated", "ZeroWorkUnits"}


class UploadRefused(Exception):
    """The orchestrator or the store said no with a 4xx: `final` when asking again cannot help."""

    def __init__(self, reason: str, final: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.final = final


class WorkChain(Protocol):
    """What the uploader needs from the ledger (a `LedgerClient` with the provider key, see `LedgerWork`).

    `node` and `pool_id` are read-only properties: the uploader only reads them, and an implementation
    may hold a narrower type (`LedgerWork.node` is a `ChecksumAddress`)."""

    @property
    def node(self) -> str: ...
    @property
    def pool_id(self) -> int: ...

    def submit(self, work_key: str, units: int) -> str: ...
    def submit_batch(self, files: list[tuple[str, int]]) -> str: ...
    def owner_of(self, work_key: str) -> str | None: ...
    def submission_tx(self, work_key: str) -> str | None: ...


class LedgerWork:
    """`WorkChain` over the ledger client: submits as the client's wallet (the provider)."""

    def __init__(self, client: LedgerClient, pool_id: int, node: str) -> None:
        self.client = client
        self.pool_id = pool_id
        self.node = to_checksum_address(node)

    def submit(self, work_key: str, units: int) -> str:
        return self.client.submit_work(self.pool_id, self.node, "0x" + work_key, units).tx_hash

    def submit_batch(self, files: list[tuple[str, int]]) -> str:
        batch = [("0x" + k, u) for k, u in files]
        return self.client.submit_work_batch(self.pool_id, self.node, batch).tx_hash

    def owner_of(self, work_key: str) -> str | None:
        record = self.client.get_work(self.pool_id, "0x" + work_key)
        return to_checksum_address(record.node) if record else None

    def submission_tx(self, work_key: str) -> str | None:
        reader = EventReader(self.client, pool_id=self.pool_id, kinds=("WorkSubmitted",))
        for event in reader.read(self.client.deployment.block).events:
            if isinstance(event, WorkSubmittedEvent) and event.work_key == "0x" + work_key \
                    and event.node == self.node:
                return event.tx_hash
        return None


@dataclass
class PassReport:
    uploaded: list[str] = field(default_factory=list)  # sha256
    submitted: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    retry_later: list[str] = field(default_factory=list)


def _say_retrying(state: RetryCallState) -> None:
    """One line per failed attempt: an upload stuck behind a cut link (storage or orchestrator) is
    otherwise silent until every attempt has timed out."""
    error = state.outcome.exception() if state.outcome is not None else None
    log.warning("upload attempt failed, retrying", attempt=state.attempt_number,
                error=f"{type(error).__name__}: {error}"[:200] if error else None,
                retry_in=round(state.next_action.sleep, 1) if state.next_action else None)  # fmt: skip


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, TaskApiError):  # the orchestrator unreachable (0), overloaded or failing
        return exc.status == 0 or exc.status >= 500 or exc.status == 429
    return isinstance(exc, httpx.HTTPStatusError) and (exc.response.status_code >= 500
                                                       or exc.response.status_code == 429)


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail") or response.text)
    except ValueError:
        return response.text[:500]


class Uploader:
    def __init__(self, node: Wallet, files: WorkerFiles, chain: WorkChain,
                 orchestrator_url: Callable[[], str | None], *, timeout: float = 30.0, attempts: int = 4,
                 backoff: float = 0.5, batch_files: int = 1, batch_age: float = 30.0) -> None:  # fmt: skip
        if not 1 <= batch_files <= MAX_BATCH:
            raise ValueError(f"batch_files must be 1..{MAX_BATCH} (the contract's limit), got {batch_files}")
        self.node = node
        self.files = files
        self.chain = chain
        self.orchestrator_url = orchestrator_url
        self.timeout = timeout
        self._client: httpx.Client | None = None  # for the PUTs to storage
        self._orchestrator: OrchestratorClient | None = None
        self.batch_files = batch_files
        self.batch_age = batch_age
        # A template: each call runs on a copy (a Retrying keeps per-call statistics).
        self.retrying = Retrying(retry=retry_if_exception(_retryable), stop=stop_after_attempt(attempts),
                                 wait=wait_exponential(multiplier=backoff, max=10), reraise=True,
                                 before_sleep=_say_retrying)  # fmt: skip

    # ---- upload ----

    def _orchestrator_at(self, base: str) -> OrchestratorClient:
        """One signed client per orchestrator (kept while the node's orchestrator stays the same); it
        tries once, the retries are this uploader's (`retrying`, which says each failed attempt)."""
        if self._orchestrator is None or self._orchestrator.url != base.rstrip("/"):
            if self._orchestrator is not None:
                self._orchestrator.close()
            self._orchestrator = OrchestratorClient(base, wallet=self.node, timeout=self.timeout, retries=1)
        return self._orchestrator

    def _request_grant(self, base: str, item: WorkerFile) -> UploadGrant | None:
        request = UploadRequest(task_id=item.task_id, original_name=item.relative_path,
                                size_bytes=item.size_bytes, sha256=item.sha256, work_units=item.work_units)
        orchestrator = self._orchestrator_at(base)
        try:
            return self.retrying.copy()(orchestrator.request_upload, request)
        except TaskApiError as exc:
            if exc.status == 409 and exc.reason.startswith("already uploaded"):
                return None
            if _retryable(exc):
                raise  # the pass counts it as "retry later"
            # 403 (not Healthy / not assigned: may change) and 404 are worth asking again later.
            final = exc.status in (400, 409, 413, 422)
            raise UploadRefused(f"upload request refused ({exc.status}): {exc.reason}", final) from None

    def _put(self, client: httpx.Client, grant: UploadGrant, item: WorkerFile) -> None:
        def put() -> None:
            with item.path.open("rb") as handle:
                response = client.request(grant.method, grant.url, content=handle,
                                          headers={**grant.headers, "Content-Length": str(item.size_bytes)})
            if response.status_code == 409 and "already used" in _detail(response):
                return  # an earlier PUT of ours completed (its reply was lost)
            if response.status_code >= 400:
                if response.status_code >= 500:
                    response.raise_for_status()
                raise UploadRefused(f"storage refused the PUT ({response.status_code}): {_detail(response)}",
                                    final=response.status_code not in (403, 408))  # 403: expired URL

        self.retrying.copy()(put)

    def upload(self, client: httpx.Client, base: str, item: WorkerFile) -> None:
        if not item.path.is_file():
            raise UploadRefused(f"{item.path} is gone from the data directory", final=True)
        grant = self._request_grant(base, item)
        if grant is not None:
            self._put(client, grant, item)
            ref = grant.file_name
        else:
            ref = None
        self.files.mark_uploaded(item.id, ref)
        log.info("uploaded", file=item.relative_path, sha256=item.sha256[:12], bytes=item.size_bytes, ref=ref)

    # ---- submit ----

    def _refuse(self, item: WorkerFile, reason: str) -> None:
        self.files.mark_refused(item.id, reason)

    def submit(self, item: WorkerFile) -> str | None:
        """Exactly-once `submitWork`: the tx hash ("" when on chain but its tx is not found), or None
        when the file was refused for good (the reason in its record)."""
        current = self.files.get(item.id)
        if current.state == FileState.SUBMITTED:
            return current.tx_hash or ""
        if current.state == FileState.REFUSED:
            return None
        if item.work_units == 0:
            self._refuse(item, "zero work units: nothing to submit on chain")
            return None
        if current.state == FileState.SENDING:  # a previous run may have sent it: the chain decides
            found, tx = self._on_chain(item)
            if found:
                return tx
        self.files.mark_sending(item.id)  # the intent, before anything leaves
        try:
            tx = self.chain.submit(item.sha256, item.work_units)
        except ContractRevert as exc:
            if exc.error_name == "WorkAlreadySubmitted":
                found, tx = self._on_chain(item)
                if found:
                    return tx
            if exc.error_name in FINAL_REVERTS:
                self._refuse(item, str(exc))
                return None
            raise
        self.files.mark_submitted(item.id, tx)
        log.info("work submitted", work_key=item.sha256[:12], work_units=item.work_units, tx=tx)
        return tx

    def _on_chain(self, item: WorkerFile) -> tuple[bool, str | None]:
        """(False, None): not on chain. (True, tx hash or ""): ours. (True, None): another node's."""
        key = item.sha256
        owner = self.chain.owner_of(key)
        if owner is None:
            return False, None
        if owner != to_checksum_address(self.chain.node):
            self._refuse(item, f"work key already submitted by node {owner}")
            return True, None
        tx = self.chain.submission_tx(key) or ""
        self.files.mark_submitted(item.id, tx)
        log.info("work was already on chain for this node", work_key=key[:12], tx=tx or "unknown")
        return True, tx

    # ---- one pass ----

    def _upload_pending(self, base: str, report: PassReport) -> None:
        """Every announced file not yet uploaded, through one client kept for the uploader's life (built
        when a file first waits: a client per pass built an SSL context, 27 ms of CPU, files or not)."""
        pending = self.files.pending_upload()
        if not pending:
            return
        if self._client is None or self._client.is_closed:
            self._client = httpx.Client(timeout=self.timeout)
        client = self._client
        for item in pending:
            try:
                self.upload(client, base, item)
                report.uploaded.append(item.sha256)
            except UploadRefused as exc:
                log.warning(
                    "upload refused", file=item.relative_path, reason=exc.reason, final=exc.final
                )
                if exc.final:
                    self._refuse(item, exc.reason)
                    report.rejected.append(item.sha256)
                else:
                    report.retry_later.append(item.sha256)
            except (httpx.HTTPError, TaskApiError) as exc:
                log.warning("upload failed, retrying later", file=item.relative_path, error=str(exc))
                report.retry_later.append(item.sha256)

    def run_once(self) -> PassReport:
        report = PassReport()
        base = self.orchestrator_url()
        if base:
            self._upload_pending(base.rstrip("/"), report)
        waiting = self.files.pending_submission()
        if self.batch_files > 1:
            self._submit_batches(waiting, report)
            return report
        for item in waiting:
            try:
                tx = self.submit(item)
            except LedgerError as exc:
                log.warning("submitWork failed, retrying later", sha256=item.sha256[:12], error=str(exc))
                report.retry_later.append(item.sha256)
                continue
            if tx is None:
                reason = self.files.get(item.id).reason
                log.error("work not submitted", sha256=item.sha256[:12], reason=reason)
                report.rejected.append(item.sha256)
            else:
                report.submitted.append(item.sha256)
        return report

    # ---- batched ----

    def _settled(self, item: WorkerFile, report: PassReport) -> bool:
        """Whether the file's fate is already known (submitted, on chain, or refused for good)."""
        current = self.files.get(item.id)
        tx: str | None = None
        if current.state == FileState.SUBMITTED:
            tx = current.tx_hash or ""
        elif current.state == FileState.REFUSED:
            pass
        elif item.work_units == 0:
            self._refuse(item, "zero work units: nothing to submit on chain")
        elif current.state == FileState.SENDING:  # maybe in a batch sent before a crash: the chain decides
            found, tx = self._on_chain(item)
            if not found:
                return False
        else:
            return False
        (report.rejected if tx is None else report.submitted).append(item.sha256)
        return True

    def _submit_batches(self, items: list[WorkerFile], report: PassReport) -> None:
        try:
            ready = [item for item in items if not self._settled(item, report)]
        except LedgerError as exc:
            log.warning("chain lookup failed, retrying later", error=str(exc))
            report.retry_later.extend(item.sha256 for item in items)
            return
        now = datetime.now(UTC)
        while ready:
            oldest = min((item.uploaded_at or now) for item in ready)
            if len(ready) < self.batch_files and (now - oldest).total_seconds() < self.batch_age:
                return  # not full and nobody waited long enough: wait for more files
            chunk, ready = ready[: self.batch_files], ready[self.batch_files:]
            for item in chunk:
                self.files.mark_sending(item.id)  # the intent, before anything leaves
            try:
                tx = self.chain.submit_batch([(item.sha256, item.work_units) for item in chunk])
            except ContractRevert as exc:
                self._batch_refused(exc, chunk, report)
                return
            except LedgerError as exc:
                log.warning("submitWorkBatch failed, retrying later", files=len(chunk), error=str(exc))
                report.retry_later.extend(item.sha256 for item in chunk)
                return
            for item in chunk:
                self.files.mark_submitted(item.id, tx)
                report.submitted.append(item.sha256)
            units = sum(i.work_units for i in chunk)
            log.info("work batch submitted", files=len(chunk), work_units=units, tx=tx)

    def _batch_refused(self, exc: ContractRevert, chunk: list[WorkerFile], report: PassReport) -> None:
        """A batch is all or nothing: settle the file the revert names, the rest goes out next pass."""
        named = exc.error_args.get("workKey")
        if isinstance(named, bytes | bytearray):
            key = bytes(named).hex()
        else:
            key = str(named or "").removeprefix("0x")
        culprit = next((item for item in chunk if item.sha256 == key), None)
        if culprit is not None and exc.error_name == "WorkAlreadySubmitted":
            found, _ = self._on_chain(culprit)
            if found:
                self._settled(culprit, report)
        elif culprit is not None and exc.error_name in FINAL_REVERTS:
            self._refuse(culprit, str(exc))
            self._settled(culprit, report)
        log.warning("submitWorkBatch refused, retrying the others next pass", error=str(exc))
        report.retry_later.extend(item.sha256 for item in chunk if item is not culprit)
