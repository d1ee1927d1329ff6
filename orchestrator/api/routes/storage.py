"""`/storage` upload grants and file lookups (the rules are in `orchestrator.uploads`).

`POST /storage/request-upload` is signed by the node; `GET /storage/files/{sha256}` takes the admin
bearer or a validator's signature. Both authenticate inside `UploadService`, which reads the raw body
itself (the signature covers the bytes), hence `Request` parameters and an explicit OpenAPI schema.
The signed-URL object routes of the embedded disk backend are `orchestrator.storage.storage_router`,
included by the server only when that backend is in use.
"""

from __future__ import annotations

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import RedirectResponse

from intellect.wire.storage import StoredFile, UploadGrant, UploadRequest
from orchestrator.api.deps import UploadsDep

router = APIRouter(prefix="/storage", tags=["storage"])

_SCHEMA = {"requestBody": {"content": {"application/json": {"schema": UploadRequest.model_json_schema()}},
                           "required": True}}
SHA256_HEX = "^[0-9a-f]{64}$"


@router.post("/request-upload", response_model=UploadGrant, openapi_extra=_SCHEMA,
             description="Signed by the node key; the node must be Healthy and assigned the task.")
async def request_upload(request: Request, uploads: UploadsDep) -> UploadGrant:
    return await uploads.request_upload(request)


@router.get("/files/{sha256}", response_model=StoredFile,
            description="Admin bearer, or signed by a validator: where the file with this sha256 is.")
async def stored_file(request: Request, uploads: UploadsDep,
                      sha256: str = Path(pattern=SHA256_HEX, description="the file's sha256, lowercase hex"),
                      redirect: bool = Query(False, description="307 to the URL instead of JSON"),
                      ) -> StoredFile | RedirectResponse:
    return await uploads.stored_file(request, sha256, redirect)
