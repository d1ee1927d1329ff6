"""The trainer's HTTP face: the step counter and the checkpoints it names.

`GET /step` → {"step", "async_level", "checkpoints": {step: {"url", "sha256"}}}: `step` is the
smallest step that still lacks enough accepted rollouts (what inference should generate for now);
`checkpoints` lists every step a worker may still use (step − async level … step; 0 is the base
model, which every worker already has). The inference workload polls it (`INTELLECT_INFER_STEP_URL`)
and fetches `/checkpoints/{step}.safetensors` (+ `.sha256`) unless a broadcast relay serves it.
`GET /step?at=<unix time>`: the same for the step in force then (the newest step whose checkpoint was
written by that time): validators judge a file's freshness at its submission's block time, so a
validator that reads the chain late, or restarts, gives the same verdict.
Also `GET /history` (per-step metrics: the reward curve), `/health`, `/metrics`.
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from intellect.http_guard import guard
from workloads.model.loading import base_checkpoint_sha256
from workloads.trainer.checkpoints import CheckpointDir


class TrainerView(Protocol):
    """What the server reads of the running trainer."""

    step: int
    async_level: int
    model_name: str
    checkpoints: CheckpointDir
    registry: CollectorRegistry
    public_url: str


def get_view(request: Request) -> TrainerView:
    view: TrainerView = request.app.state.view
    return view


View = Annotated[TrainerView, Depends(get_view)]
router = APIRouter()


@router.get("/step", summary="the step to generate for, and the checkpoints still usable")
def step(
    view: View,
    at: Annotated[float | None, Query(ge=0, description="unix time: the step in force then instead of "
                                      "now (validators judge a file against its submission's time)")] = None,
) -> dict[str, Any]:
    current = view.step if at is None else min(view.step, view.checkpoints.step_at(at))
    usable: dict[str, dict[str, str | None]] = {}
    on_disk = set(view.checkpoints.steps())
    for s in range(max(0, current - view.async_level), current + 1):
        if s == 0:
            usable["0"] = {"url": None, "sha256": base_checkpoint_sha256(view.model_name)}
        elif s in on_disk:
            usable[str(s)] = {"url": f"{view.public_url}/checkpoints/{s}.safetensors",
                              "sha256": view.checkpoints.manifest(s).sha256}  # fmt: skip
    body: dict[str, Any] = {"step": current, "async_level": view.async_level, "checkpoints": usable}
    if at is not None:
        body["at"] = at
    return body


@router.get("/checkpoints/{step}.safetensors", response_class=FileResponse, summary="weights of a step")
def weights(step: int, view: View) -> FileResponse:
    path = view.checkpoints.weights(step)
    if step < 1 or step not in view.checkpoints.steps() or not path.exists():
        raise HTTPException(404, f"no checkpoint of step {step} (kept: {view.checkpoints.steps()})")
    return FileResponse(path, media_type="application/octet-stream", filename=path.name)


@router.get("/checkpoints/{step}.safetensors.sha256", response_class=PlainTextResponse)
def sidecar(step: int, view: View) -> str:
    if step < 1 or step not in view.checkpoints.steps():
        raise HTTPException(404, f"no checkpoint of step {step}")
    return f"{view.checkpoints.manifest(step).sha256}  step_{step}.safetensors\n"


@router.get("/history", summary="per-step metrics: the reward curve")
def history(view: View) -> dict[str, Any]:
    items = [
        {"step": h["step"], "reward": h.get("task_reward_mean"), **h} for h in view.checkpoints.history()
    ]
    return {"items": items}


@router.get("/health")
def health(view: View) -> dict[str, Any]:
    return {"status": "ok", "step": view.step}


@router.get("/metrics", response_class=Response)
def metrics(view: View) -> Response:
    return Response(generate_latest(view.registry), media_type=CONTENT_TYPE_LATEST)


def create_app(view: TrainerView) -> FastAPI:
    app = FastAPI(title="Intellect trainer", version="1", description=__doc__)
    app.state.view = view
    app.include_router(router)
    return guard(app, max_body=1024)
