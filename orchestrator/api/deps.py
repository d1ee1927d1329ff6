"""FastAPI dependencies of the orchestrator's routes: everything is read from `request.app.state`.

Why: the routes used to be closures inside `create_app`, reaching their state through local dicts, so
no route could be mounted or tested without the whole service. Now `orchestrator.server` puts each
object on `app.state` (at build time, or in the lifespan for what needs Redis and SQL), and a route
names what it needs with one of the `Annotated` aliases below. A test mounts a router on a bare app
and replaces any of these functions through `app.dependency_overrides`.

What is on `app.state` (see `orchestrator.server.create_app`):
  settings   OrchestratorSettings                   build time
  admin      AdminAccess (bearer token or signer)   build time
  storage    StorageBackend                         build time
  uploads    UploadService                          build time
  ctx        Context                                lifespan
  heartbeat  HeartbeatHandler                       lifespan
  groups     GroupKeeper                            lifespan
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from intellect.app_state import from_app_state
from orchestrator.context import Context
from orchestrator.groups.scheduler import GroupKeeper
from orchestrator.heartbeat import HeartbeatHandler
from orchestrator.settings import OrchestratorSettings
from orchestrator.store.nodes import NodeBook
from orchestrator.store.tasks import TaskStore
from orchestrator.uploads import UploadService

get_settings = from_app_state("settings", OrchestratorSettings)
get_context = from_app_state("ctx", Context)
get_uploads = from_app_state("uploads", UploadService)
# Called by the heartbeat route itself, not through `Depends`: that route is served ahead of FastAPI's
# machinery (orchestrator/api/hot_path.py).
get_heartbeat_handler = from_app_state("heartbeat", HeartbeatHandler)


def get_task_store(ctx: Annotated[Context, Depends(get_context)]) -> TaskStore:
    """Through the Context, so a test can override either this alone or the whole Context."""
    return ctx.tasks


def get_node_book(ctx: Annotated[Context, Depends(get_context)]) -> NodeBook:
    return ctx.book


def get_group_keeper(request: Request) -> GroupKeeper | None:
    """None until the lifespan has built it (requests are served only after that, in practice)."""
    keeper: GroupKeeper | None = getattr(request.app.state, "groups", None)
    return keeper


async def require_admin(request: Request) -> str:
    """The admin bearer token, or a request signed by the pool manager or an allowed signer; returns
    "admin" or the signer's address. 401/403 otherwise (see `orchestrator.access.AdminAccess`)."""
    caller: str = await request.app.state.admin(request)
    return caller


async def require_reader(request: Request) -> str:
    """Admin access, or a request signed by an address with the on-chain validator role: validators
    read the task a file belongs to (and where the file is) to judge it by that task."""
    uploads: UploadService = request.app.state.uploads
    admin = request.app.state.admin
    caller: str = await uploads.authorise_reader(request, also=frozenset(admin.signers))
    return caller


SettingsDep = Annotated[OrchestratorSettings, Depends(get_settings)]
ContextDep = Annotated[Context, Depends(get_context)]
TaskStoreDep = Annotated[TaskStore, Depends(get_task_store)]
NodeBookDep = Annotated[NodeBook, Depends(get_node_book)]
GroupKeeperDep = Annotated[GroupKeeper | None, Depends(get_group_keeper)]
UploadsDep = Annotated[UploadService, Depends(get_uploads)]
AdminDep = Annotated[str, Depends(require_admin)]
# For `APIRouter(dependencies=ADMIN_ONLY)` / route `dependencies=`: admin access without a parameter.
ADMIN_ONLY = [Depends(require_admin)]
READERS = [Depends(require_reader)]
