"""`/tasks` (admin): create, list, read and delete tasks. Rows are written by `TaskStore` only.
Reading one task is also open to validators (signed by an address with the on-chain validator role):
they judge each file by the task it belongs to.

A `TaskSpec` is validated by its pydantic model (422 naming each bad field); then by the workload
plug-in that judges its files (`intellect.workloads`: its settings, 422 naming the setting), which
also renders what the workers run (image, entry point, settings as env vars). That plug-in is the one
the task names, or, naming none, the one that claims its program as its raw form (`claimant`): the
stored spec then names it, so every validator judges it. A task nobody claims is accepted marked
*unjudged* (`Task.judged` False, with a warning naming the installed workloads), or refused with a 422
when the pool owner set `refuse_unjudged`: its files would never be judged or paid. The one check
that needs the service's settings, that every `allowed_topologies` name is configured here, is made
below.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from fastapi.concurrency import run_in_threadpool

from intellect.wire.tasks import Task, TaskSpec, WorkloadRef
from intellect.workloads import (
    UnknownWorkload,
    WorkloadSettingsError,
    claimant,
    settings_for,
    unjudged_warning,
)
from orchestrator.api.deps import ADMIN_ONLY, READERS, SettingsDep, TaskStoreDep
from orchestrator.groups.reconcile import UnknownTopology, resolve_topology
from orchestrator.settings import OrchestratorSettings
from orchestrator.store.tasks import TaskNotFound

router = APIRouter(tags=["tasks"])

TOPOLOGIES_FIELD = "scheduling_config.plugins.node_groups.allowed_topologies"


def check_topologies(spec: TaskSpec, settings: OrchestratorSettings) -> None:
    """422 when the task asks for a topology this orchestrator has no config for."""
    configured = settings.topology_configs()
    for name in spec.allowed_topologies:
        try:
            resolve_topology(name, configured)
        except UnknownTopology as exc:
            raise HTTPException(422, f"{TOPOLOGIES_FIELD}: {exc}") from None


def not_found(exc: TaskNotFound) -> HTTPException:
    return HTTPException(404, str(exc))


def render_workload(spec: TaskSpec, refuse_unjudged: bool = False) -> TaskSpec:
    """The spec as the workers will run it, after its workload plug-in checked its settings (the
    plug-in and settings found as every validator finds them: `intellect.workloads.settings_for`)."""
    name = claimant(spec)
    if name is None:
        if refuse_unjudged:  # a 422, not work nobody will pay for
            raise HTTPException(422, f"workload.type: this pool refuses unjudged tasks. {unjudged_warning()}")
        return spec
    if spec.workload is None:  # stored naming its claimant, so every validator judges it by that one
        spec = spec.model_copy(update={"workload": WorkloadRef(type=name)})
    try:
        plugin, settings = settings_for(spec)
        return plugin.render(spec, settings)
    except UnknownWorkload as exc:
        raise HTTPException(422, f"workload.type: {exc}") from None
    except WorkloadSettingsError as exc:
        raise HTTPException(422, str(exc)) from None


@router.post("/tasks", response_model=Task, status_code=status.HTTP_201_CREATED, dependencies=ADMIN_ONLY)
async def create_task(spec: TaskSpec, settings: SettingsDep, store: TaskStoreDep) -> Task:
    check_topologies(spec, settings)
    rendered = await run_in_threadpool(render_workload, spec, settings.refuse_unjudged)
    task = await store.create(rendered)
    if not task.judged:
        task.warnings.append(unjudged_warning())
    return task


@router.get("/tasks", response_model=list[Task], dependencies=ADMIN_ONLY)
async def list_tasks(store: TaskStoreDep, include_deleted: bool = False) -> list[Task]:
    return await store.list(include_deleted)


@router.get("/tasks/{task_id}", response_model=Task, dependencies=READERS)
async def get_task(task_id: str, store: TaskStoreDep, include_deleted: bool = False) -> Task:
    """A deleted task is gone (404) unless `include_deleted=true`, as in the list."""
    try:
        task = await store.get(task_id)
    except TaskNotFound as exc:
        raise not_found(exc) from None
    if task.deleted and not include_deleted:
        raise HTTPException(404, f"task {task_id} was deleted; ?include_deleted=true shows it")
    return task


@router.delete("/tasks/{task_id}", response_model=Task, dependencies=ADMIN_ONLY)
async def delete_task(task_id: str, store: TaskStoreDep) -> Task:
    try:
        return await store.delete(task_id)
    except TaskNotFound as exc:
        raise not_found(exc) from None
