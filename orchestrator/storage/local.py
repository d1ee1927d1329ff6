"""The embedded storage backend: files on local disk, uploaded and downloaded through signed URLs.

Layout under `root`: `objects/<key>` (finished files), `incoming/<upload_id>.part` (in flight, never
visible as an object), `used/<upload_id>` (single-use marker of a completed upload).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from urllib.parse import quote, urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse

from intellect.wire.storage import UploadGrant
from orchestrator.storage.base import ObjectInfo, StorageError, object_key
from orchestrator.storage.urls import UrlSigner

CHUNK = 1 << 20


class LocalDiskStorage:
    def __init__(self, root: Path, public_url: str, signer: UrlSigner) -> None:
        self.root = Path(root)
        self.public_url = public_url.rstrip("/")
        self.signer = signer
        for sub in ("objects", "incoming", "used"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # ---- URLs ----

    def grant_put(
        self, key: str, upload_id: str, size: int, sha256: str, expires_at: datetime
    ) -> UploadGrant:
        key = object_key(key)
        expires = int(expires_at.timestamp())
        sig = self.signer.sign("PUT", key, upload_id, size, sha256, expires)
        query = urlencode(
            {"upload_id": upload_id, "size": size, "sha256": sha256, "expires": expires, "sig": sig}
        )
        return UploadGrant(
            upload_id=upload_id,
            file_name=key,
            expires_at=expires_at,
            url=f"{self.public_url}/storage/objects/{quote(key)}?{query}",
            headers={"Content-Type": "application/octet-stream"},
        )

    def grant_get(self, key: str, expires_at: datetime) -> str:
        key = object_key(key)
        expires = int(expires_at.timestamp())
        sig = self.signer.sign("GET", key, "", 0, "", expires)
        return f"{self.public_url}/storage/objects/{quote(key)}?{urlencode({'expires': expires, 'sig': sig})}"

    # ---- objects ----

    def path(self, key: str) -> Path:
        return self.root / "objects" / object_key(key)

    def stat(self, key: str) -> ObjectInfo | None:
        path = self.path(key)
        if not path.is_file():
            return None
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
        return ObjectInfo(key=object_key(key), size=path.stat().st_size, sha256=digest.hexdigest())

    async def receive(self, key: str, upload_id: str, size: int, sha256: str, request: Request) -> ObjectInfo:
        """Stream the body to a temp file, check size and sha256, then publish it atomically."""
        key = object_key(key)
        if not upload_id.replace("-", "").isalnum():
            raise StorageError("malformed upload_id")
        used = self.root / "used" / upload_id
        if used.exists():
            raise StorageError("this upload URL was already used: request a new one", 409)
        final = self.path(key)
        if final.exists():
            raise StorageError(f"{key} already exists in storage", 409)
        part = self.root / "incoming" / f"{upload_id}.part"
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise StorageError("an upload with this URL is in progress", 409) from None
        digest = hashlib.sha256()
        received = 0
        try:
            with os.fdopen(fd, "wb") as fh:
                async for chunk in request.stream():
                    received += len(chunk)
                    if received > size:
                        raise StorageError(f"body is larger than the {size} bytes granted", 413)
                    digest.update(chunk)
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            if received != size:
                raise StorageError(f"body has {received} bytes, {size} were granted")
            if digest.hexdigest() != sha256:
                raise StorageError(f"sha256 of the body is {digest.hexdigest()}, the grant says {sha256}")
            final.parent.mkdir(parents=True, exist_ok=True)
            # The used-marker first: a crash between the two leaves a refused URL, never a second file.
            used.touch(exist_ok=False)
            os.replace(part, final)
        finally:
            part.unlink(missing_ok=True)
        return ObjectInfo(key=key, size=size, sha256=sha256)


OnComplete = Callable[[str, ObjectInfo], Awaitable[None]]


def storage_router(storage: LocalDiskStorage, on_complete: OnComplete | None = None) -> APIRouter:
    """PUT and GET of objects through signed URLs; mount it on the orchestrator (or any app).

    `on_complete(upload_id, info)` runs after a PUT was stored (the orchestrator marks its upload
    record completed there); the file is already published when it runs."""
    router = APIRouter(prefix="/storage", tags=["storage"])

    @router.put("/objects/{key:path}", status_code=201)
    async def put_object(
        key: str,
        request: Request,
        upload_id: str = Query(...),
        size: int = Query(..., ge=0),
        sha256: str = Query(..., pattern="^[0-9a-f]{64}$"),
        expires: int = Query(...),
        sig: str = Query(...),
    ) -> dict:
        try:
            key = object_key(key)
        except StorageError as exc:
            raise HTTPException(exc.status, exc.reason) from None
        ok, reason = storage.signer.valid(sig, "PUT", key, upload_id, size, sha256, expires)
        if not ok:
            raise HTTPException(403, reason)
        declared = request.headers.get("content-length")
        if declared is not None and int(declared) > size:
            raise HTTPException(413, f"Content-Length {declared} is larger than the {size} bytes granted")
        try:
            info = await storage.receive(key, upload_id, size, sha256, request)
        except StorageError as exc:
            raise HTTPException(exc.status, exc.reason) from None
        if on_complete is not None:
            await on_complete(upload_id, info)
        return {"key": info.key, "size": info.size, "sha256": info.sha256}

    @router.get("/objects/{key:path}")
    async def get_object(key: str, expires: int = Query(...), sig: str = Query(...)) -> FileResponse:
        try:
            key = object_key(key)
        except StorageError as exc:
            raise HTTPException(exc.status, exc.reason) from None
        ok, reason = storage.signer.valid(sig, "GET", key, "", 0, "", expires)
        if not ok:
            raise HTTPException(403, reason.replace("upload", "download"))
        path = storage.path(key)
        if not path.is_file():
            raise HTTPException(404, f"no object {key}")
        return FileResponse(path, media_type="application/octet-stream")

    return router
