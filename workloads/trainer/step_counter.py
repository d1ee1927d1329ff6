"""The trainer's HTTP face: the step counter and the checkpoints it names.

`GET /step` → {"step", "async_level", "checkpoints": {step: {"url", "sha256"}}}: `step` is the
smallest step that still lacks enough accepted rollouts (what inference should generate for now);
`checkpoints` lists every step a worker may still use (step − async level … step; 0 is the base
model, which every worker already has). The inference workload polls it (`INTELLECT_INFER_STEP_URL`)
and fetches `/checkpoints/{step}.safetensors` (+ `.sha256`) unless a broadcast relay serves it.
`GET /step?at=<unix time>`: the same for the step in force then (the newest step whose checkpoint was
written by that time): validators judge a file's freshness at its submission's block time, so a
validator that reads the chain late, or restarts, gives the same verdict.
`GET /checkpoints/{step}` → {"step", "url", "sha256"} for any step whose weights the trainer still
keeps, listed or not: a validator that lags more than the async level behind the trainer (or judges
after the last step) finds there the checkpoint a file names, for as long as that file may be judged
(the trainer keeps it that long: `workloads/trainer/checkpoints.py`, `vote_window_seconds`).
Also `GET /history` (per-step metrics: the reward curve), `/health`, `/metrics`.

The app records when it was last asked for a step or a checkpoint (`app.state.last_asked`, unix time):
a trainer past its last step serves on until nobody has asked for a vote window (`linger`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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


def asked(request: Request) -> None:
    """Workers and validators asked for a step or a checkpoint (a monitor's /health or /metrics does
    not keep a finished trainer serving)."""
    request.app.state.last_asked = time.time()


View = Annotated[TrainerView, Depends(get_view)]
ASKED = [Depends(asked)]
router = APIRouter()


@router.get("/step", dependencies=ASKED, summary="the step to generate for, and the checkpoints usable")
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


@router.get("/checkpoints/{step}.safetensors", dependencies=ASKED, response_class=FileResponse,
            summary="weights of a step")
def weights(step: int, view: View) -> FileResponse:
    path = view.checkpoints.weights(step)
    if step < 1 or step not in view.checkpoints.steps() or not path.exists():
        raise HTTPException(404, f"no checkpoint of step {step} (kept: {view.checkpoints.steps()})")
    return FileResponse(path, media_type="application/octet-stream", filename=path.name)


@router.get("/checkpoints/{step}.safetensors.sha256", dependencies=ASKED, response_class=PlainTextResponse)
def sidecar(step: int, view: View) -> str:
    if step < 1 or step not in view.checkpoints.steps():
        raise HTTPException(404, f"no checkpoint of step {step}")
    return f"{view.checkpoints.manifest(step).sha256}  step_{step}.safetensors\n"


@router.get("/checkpoints/{step:int}", dependencies=ASKED,
            summary="a kept checkpoint's URL and sha256, listed by /step or not",
            responses={404: {"description": "no checkpoint of that step is kept (never made, or its files' "
                                            "vote window has passed)"}})  # fmt: skip
def checkpoint(step: int, view: View) -> dict[str, Any]:
    if step == 0:
        return {"step": 0, "url": None, "sha256": base_checkpoint_sha256(view.model_name)}
    kept = view.checkpoints.steps()
    if step not in kept:
        raise HTTPException(404, f"no checkpoint of step {step} (kept: {kept})")
    return {"step": step, "url": f"{view.public_url}/checkpoints/{step}.safetensors",
            "sha256": view.checkpoints.manifest(step).sha256}  # fmt: skip


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
    app.state.last_asked = time.time()
    app.include_router(router)
    return guard(app, max_body=1024)


def linger(
    checkpoints: CheckpointDir, last_asked: Callable[[], float], window: float, stop: threading.Event,
    poll: float = 5.0,
) -> None:  # fmt: skip
    """Serve on after the last step (the caller keeps the server up until this returns): files made
    for the trainer's last steps may still be submitted while workers run its task, and judged for a
    vote window after that. Returns once `window` seconds have passed since both the last step and the
    last request for a step or a checkpoint (workers poll the step while they work; each validator
    asks for the step at a submission when it reads it from the chain, and for the checkpoint when it
    judges), or at once when `stop` is set. Meanwhile checkpoints whose files can no longer be judged
    are dropped as during training."""
    steps = checkpoints.all_steps()
    last_step = checkpoints.manifest(steps[-1]).created_at if steps else time.time()
    while not stop.is_set():
        checkpoints.prune()
        quiet_until = max(last_step, last_asked()) + window
        if time.time() >= quiet_until:
            return
        stop.wait(min(poll, max(0.0, quiet_until - time.time())))
