"""`/groups` (admin): the node groups the orchestrator formed for multi-node tasks, members in order."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from intellect.wire.admin import GroupList
from orchestrator.api.deps import ADMIN_ONLY, ContextDep
from orchestrator.store.groups import list_groups

router = APIRouter(tags=["groups"], dependencies=ADMIN_ONLY)


@router.get("/groups", response_model=GroupList, summary="node groups and their members")
async def groups(ctx: ContextDep) -> GroupList:
    return GroupList(groups=await run_in_threadpool(list_groups, ctx.sessions))
