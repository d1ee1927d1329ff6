"""Upload grants: a node asks for a signed URL to PUT one finished file; validators ask where it is.

`POST /storage/request-upload` (signed by the node) checks, in order: signature and nonce, the
per-node rate limit, the body, that the node is Healthy, the size limit, that the node is currently
assigned the task; then renders the task's `storage_config.file_name_template`, records the upload
in SQL (through `orchestrator/store/uploads.py`, the only writer of upload rows and file counters)
and returns an expiring URL from the storage backend (local disk served here, or S3).

One file content (sha256 = the on-chain work key) has one upload record:
- same node, not yet completed → the same grant again (same upload id and name; a fresh expiry once
  the old one passed), so a worker that lost the reply simply asks again;
- same node, completed → 409 "already uploaded as <name>": nothing to PUT;
- another node → 409: the work key is taken (the chain would refuse a second submission anyway).

`GET /storage/files/{sha256}` (admin bearer, or signed by an address with the on-chain validator
role) → `StoredFile` with an expiring download URL, or a 307 redirect to it with `?redirect=true`.

The routes themselves are in `orchestrator/api/routes/storage.py`; they reach the service through
`app.state.uploads`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from fastapi import HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from pydantic import ValidationError

from intellect.auth import (
    AdminToken,
    RedisNonceStore,
    RedisRateLimiter,
    RequestVerifier,
    load_or_create_admin_token,
)
from intellect.wire.nodes import NodeState
from intellect.wire.storage import StoredFile, UploadGrant, UploadRequest
from intellect.wire.tasks import AssignedTask, TaskSpec
from intellect.wire.templates import UnknownTemplateVariable, expand
from orchestrator.access import AdminAccess
from orchestrator.context import Context
from orchestrator.live import as_text
from orchestrator.models import UploadRow, utcnow
from orchestrator.settings import OrchestratorSettings
from orchestrator.storage import (
    LocalDiskStorage,
    ObjectInfo,
    StorageBackend,
    StorageError,
    UrlSigner,
    object_key,
)
from orchestrator.store.uploads import COMPLETED, NameFor, UnusableName, UploadConflict

log = structlog.get_logger("intellect.orchestrator.uploads")

DEFAULT_TEMPLATE = "${TASK_ID}/${NODE_ADDRESS}/${CURRENT_FILE_INDEX}-${ORIGINAL_NAME}"


def storage_secret(settings: OrchestratorSettings) -> str:
    """`storage_secret`, else one generated once into `state_dir` (mode 0600): replicas sharing a disk
    share it, others must configure one. It keys the local storage URLs and, through a sub-key
    (`orchestrator.server.group_secret_key`), node groups' secrets."""
    if settings.storage_secret is not None:
        return settings.storage_secret.get_secret_value()
    return load_or_create_admin_token(settings.state_dir / "storage-secret")


def make_storage(settings: OrchestratorSettings) -> StorageBackend:
    """S3 when a bucket is configured, else local disk served by this orchestrator."""
    if settings.s3_bucket:
        from orchestrator.storage.s3 import S3Storage

        return S3Storage(settings.s3_bucket, settings.s3_endpoint_url, settings.s3_region, settings.s3_prefix)
    return LocalDiskStorage(settings.effective_storage_dir, settings.effective_public_url,
                            UrlSigner(storage_secret(settings).encode()))


def aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def file_name_values(node: str, assigned: AssignedTask, index: int, original: str) -> dict[str, str]:
    """What `${...}` in a file name template means for this upload (no group: no `${*GROUP*}`)."""
    values = {"TASK_ID": assigned.task.id, "NODE_ADDRESS": node, "CURRENT_FILE_INDEX": str(index),
              "ORIGINAL_NAME": original, "TIMESTAMP": str(int(time.time()))}
    group = assigned.group
    if group is not None:
        for prefix in ("", "NODE_"):
            values |= {f"{prefix}GROUP_ID": group.group_id, f"{prefix}GROUP_INDEX": str(group.group_index),
                       f"{prefix}GROUP_SIZE": str(group.group_size)}
        if group.next_p2p_address:
            values["NEXT_P2P_ADDRESS"] = group.next_p2p_address
    return values


class UploadService:
    """Upload grants and file lookups. Built with the app (the storage routes need its `on_complete`
    before anything runs), so it gets the Context through `ctx`, a getter called at use time: the
    server passes one reading `app.state.ctx`, which the lifespan fills."""

    def __init__(self, settings: OrchestratorSettings, storage: StorageBackend, ctx: Callable[[], Context],
                 admin: AdminToken | AdminAccess) -> None:
        self.settings = settings
        self.storage = storage
        self.ctx = ctx
        self.admin = admin
        self._validators: dict[str, tuple[float, bool]] = {}

    # ---- grants ----

    def _name_for(self, node: str, body: UploadRequest, assigned: AssignedTask) -> NameFor:
        """The storage key of the node's file number `index`, from the task's file name template."""
        spec: TaskSpec = assigned.task.spec
        template = spec.storage_config.file_name_template if spec.storage_config else DEFAULT_TEMPLATE

        def name(index: int) -> str:
            try:
                values = file_name_values(node, assigned, index, body.original_name)
                return object_key(expand(template, values))
            except UnknownTemplateVariable as exc:
                raise UnusableName(f"task {body.task_id}'s storage_config.file_name_template: {exc} "
                                   "for this node") from None
            except StorageError as exc:
                raise UnusableName(f"task {body.task_id}'s storage_config.file_name_template rendered "
                                   f"an unusable name: {exc.reason}") from None

        return name

    def _grant(self, node: str, body: UploadRequest, assigned: AssignedTask) -> UploadRow:
        expires = utcnow() + timedelta(seconds=self.settings.upload_url_ttl_seconds)
        try:
            return self.ctx().uploads.grant(node, body, self._name_for(node, body, assigned), expires,
                                            self._stored_as_granted)
        except UploadConflict as exc:
            raise HTTPException(409, str(exc)) from None
        except UnusableName as exc:
            raise HTTPException(422, str(exc)) from None

    def _worked_on(self, node: str, task_id: str) -> AssignedTask | None:
        """The task as it was assigned, when this node reported working on it and the task is live or was
        deleted less than `upload_grace_seconds` ago. Files are made before they are uploaded: a run
        that ends deletes its task, and a group that dissolves (a member lost or failed, a merge) leaves
        its members unassigned, while their workers still upload what they made; refusing those files
        would leave honest work unpaid. (The group is gone: a file name template that needs the group's
        values is answered 422.)"""
        grace = timedelta(seconds=self.settings.upload_grace_seconds)
        task = self.ctx().assignments.worked_on(node, task_id, grace)
        return AssignedTask(task=task) if task is not None else None

    def _stored_as_granted(self, row: UploadRow) -> bool:
        """S3 sends no completion callback: the store itself is the witness of an upload."""
        info = self.storage.stat(row.key)
        return info is not None and info.matches(row.size, row.sha256)

    async def on_complete(self, upload_id: str, info: ObjectInfo) -> None:
        await run_in_threadpool(self.ctx().uploads.complete, upload_id, info.sha256)

    async def request_upload(self, request: Request) -> UploadGrant:
        ctx, s = self.ctx(), self.settings
        verifier = RequestVerifier(RedisNonceStore(ctx.redis, "orch:nonce"),
                                   RedisRateLimiter(ctx.redis, s.upload_rate_limit_per_minute, 60,
                                                    prefix="orch:upload-rate"),
                                   max_skew_seconds=s.max_skew_seconds)
        try:
            node = await verifier.verify(request)
        except HTTPException as exc:
            if exc.status_code == 429:
                raise HTTPException(429, f"more than {s.upload_rate_limit_per_minute} upload requests a "
                                         "minute from this node: slow down") from None
            raise
        try:
            body = UploadRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None
        raw_state = await ctx.redis.hget(ctx.live.state_key, node)
        if raw_state is None:
            raise HTTPException(404, f"node {node} is not known to this orchestrator (pool {s.pool_id})")
        if as_text(raw_state) != NodeState.HEALTHY.value:
            raise HTTPException(403, f"node {node} is {as_text(raw_state)}, not Healthy: heartbeat first")
        if body.size_bytes > s.upload_max_bytes:
            raise HTTPException(413, f"file is {body.size_bytes} bytes; the limit is {s.upload_max_bytes} "
                                     "(setting upload_max_bytes)")
        version = int(await ctx.redis.get(ctx.live.version_key) or 0)
        assigned = (await ctx.plans.current(version)).task_for(node)
        if assigned is None or assigned.task.id != body.task_id:
            earlier = await run_in_threadpool(self._worked_on, node, body.task_id)
            if earlier is None:
                current = assigned.task.id if assigned else "none"
                raise HTTPException(403, f"node {node} is not assigned task {body.task_id} (its task: "
                                         f"{current}), nor did it work on it (the task live, or deleted less "
                                         f"than {s.upload_grace_seconds} s ago)")  # fmt: skip
            assigned = earlier
        row = await run_in_threadpool(self._grant, node, body, assigned)
        grant = self.storage.grant_put(row.key, row.id, row.size, row.sha256, aware(row.expires_at))
        log.info("upload granted", node=node, task=body.task_id, key=row.key, size=row.size)
        return grant

    # ---- downloads ----

    async def _is_validator(self, address: str) -> bool:
        hit = self._validators.get(address)
        if hit and hit[0] > time.monotonic():
            return hit[1]
        client: Any = getattr(self.ctx().chain, "client", None)
        ok = bool(client is not None and await run_in_threadpool(client.is_validator, address))
        self._validators[address] = (time.monotonic() + 15.0, ok)  # a revoked role counts within 15 s
        return ok

    async def authorise_reader(self, request: Request, also: set[str] | frozenset[str] = frozenset()) -> str:
        """The admin bearer ("admin"), or the signer's address when it holds the on-chain validator role
        or is one of `also` (e.g. the admin signers). One signature check: its nonce is spent once."""
        if request.headers.get("authorization"):
            await self.admin(request)
            return "admin"
        ctx = self.ctx()
        verifier = RequestVerifier(RedisNonceStore(ctx.redis, "orch:nonce"),
                                   max_skew_seconds=self.settings.max_skew_seconds)
        caller = await verifier.verify(request)
        if caller not in also and not await self._is_validator(caller):
            raise HTTPException(403, f"{caller} has no validator role on chain (or use the admin token)")
        return caller

    async def stored_file(self, request: Request, sha256: str,
                          redirect: bool) -> StoredFile | RedirectResponse:
        caller = await self.authorise_reader(request)

        row = await run_in_threadpool(self.ctx().uploads.find, sha256, self._stored_as_granted)
        if row is None:
            raise HTTPException(404, f"no upload with sha256 {sha256}")
        if row.state != COMPLETED:
            raise HTTPException(404, f"{row.key} (sha256 {sha256}) was granted but is not uploaded yet")
        expires = datetime.now(UTC) + timedelta(seconds=self.settings.download_url_ttl_seconds)
        url = self.storage.grant_get(row.key, expires)
        log.info("download granted", caller=caller, key=row.key)
        if redirect:
            return RedirectResponse(url, status_code=307)
        return StoredFile(sha256=row.sha256, file_name=row.key, size_bytes=row.size,
                          work_units=row.work_units, node_address=row.node_address, task_id=row.task_id,
                          url=url, expires_at=expires)
