"""The one client for the orchestrator's API: the trainer's SDK, and what every other caller uses.

Who calls it: trainers and the CLIs (`intellect task`, `intellect-pool hardware`, the devnet) with the
admin token; the worker (`heartbeat`, `request_upload`) and the validator (`stored_file`, `get`) with
their keys, each request signed (docs/signed-requests.md). One class, so a route's path, its auth,
its error reading and its retries are written once.

What a trainer posting RL tasks does every day, in a few calls::

    from intellect.client import OrchestratorClient

    token = open(".devnet/orchestrator/admin-token").read()
    with OrchestratorClient("http://127.0.0.1:8090", token=token) as c:
        task = c.submit({"name": "rollouts", "image": "intellect-workload:latest"})
        c.wait(task.id, "running", timeout=120)
        print(c.logs(task.id))

Requests carry the admin bearer token or, for services that accept them, EIP-191 signed request
headers (`intellect.signing.SignedAuth`). Transient failures (connection errors, 429, 502/503/504)
are retried with exponential backoff (tenacity; `retries=1` for a caller with a retry loop of its
own, as the worker and the validator have); every refusal raises `TaskApiError` carrying the
server's status and its reason, never a bare httpx exception.
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, Field, ValidationError
from tenacity import (
    RetryCallState,
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from intellect.errors import PeerError
from intellect.identity import Wallet
from intellect.signing import SignedAuth
from intellect.wire.admin import HardwareHistory, NodeList
from intellect.wire.heartbeat import HeartbeatRequest, HeartbeatResponse
from intellect.wire.storage import StoredFile, UploadGrant, UploadRequest
from intellect.wire.tasks import Task, TaskSpec, TaskState

RETRY_STATUSES = frozenset({429, 502, 503, 504})


class TaskApiError(PeerError):
    """The orchestrator refused a request, or could not be reached: `status` is the HTTP status
    (0 when no answer came), `reason` the server's own words. (Named for the task API it first
    served; every route raises it.)"""

    def __init__(self, status: int, reason: str, url: str = "") -> None:
        self.status = status
        self.reason = reason
        self.url = url
        where = f" ({url})" if url else ""
        super().__init__(f"{status or 'no answer'}: {reason}{where}")


class TaskTimeout(TaskApiError):
    """`wait` gave up before the task reached the state asked for."""


class NodeTaskState(BaseModel):
    node: str
    state: TaskState
    detail: str | None = None
    exit_code: int | None = None


class TaskProgress(BaseModel):
    """Where a task stands: its record and what each node running it reports."""

    task: Task
    nodes: list[NodeTaskState] = Field(default_factory=list)

    def count(self, state: TaskState) -> int:
        return sum(1 for n in self.nodes if n.state == state)


def load_spec(path: Path) -> TaskSpec:
    """A task spec from a .json or .yaml/.yml file, validated exactly as the orchestrator does."""
    text = path.read_text()
    is_yaml = path.suffix.lower() in (".yaml", ".yml")
    try:
        data = yaml.safe_load(text) if is_yaml else json.loads(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not valid {'YAML' if is_yaml else 'JSON'}: {exc}") from None
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{path}: {_problems(exc.errors())}") from None


def _problems(errors: Any) -> str:
    """Pydantic/FastAPI validation errors as one line: `field.path: message; ...`."""
    parts = []
    for e in errors:
        if isinstance(e, Mapping):
            where = ".".join(str(p) for p in e.get("loc", ())) or "body"
            parts.append(f"{where}: {e.get('msg', e)}")
        else:
            parts.append(str(e))
    return "; ".join(parts)


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        detail = body.get("detail", body.get("reason", body))
        if isinstance(detail, list):  # FastAPI validation errors
            return _problems(detail)
        return detail if isinstance(detail, str) else json.dumps(detail)
    return str(body)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, TaskApiError) and (exc.status == 0 or exc.status in RETRY_STATUSES)


def _reraise_last(state: RetryCallState) -> Any:
    outcome = state.outcome
    assert outcome is not None
    return outcome.result()


class OrchestratorClient:
    """A client for one orchestrator. Thread-safe as httpx.Client is; use as a context manager."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        wallet: Wallet | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if token is not None and wallet is not None:
            raise ValueError("give either an admin token or a wallet to sign with, not both")
        headers = {"Authorization": f"Bearer {token.strip()}"} if token else {}
        auth = SignedAuth(wallet) if wallet is not None else None
        self.url = url.rstrip("/")
        self.retries = max(1, retries)
        self._http = httpx.Client(
            base_url=self.url, headers=headers, auth=auth, timeout=timeout, transport=transport
        )

    # ---- plumbing ------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OrchestratorClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        @retry(
            retry=retry_if_exception(_transient),
            stop=stop_after_attempt(self.retries),
            wait=wait_exponential(multiplier=0.2, max=5),
            retry_error_callback=_reraise_last,
            reraise=True,
        )
        def once() -> Any:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                raise TaskApiError(0, f"cannot reach the orchestrator: {exc}", self.url + path) from None
            if response.status_code >= 400:
                raise TaskApiError(response.status_code, _reason(response), self.url + path)
            return response.json() if response.content else None

        return once()

    def _send(self, method: str, path: str, body: BaseModel) -> Any:
        """A wire model as the request body, its JSON bytes exactly as signed."""
        return self._request(method, path, content=body.model_dump_json().encode(),
                             headers={"Content-Type": "application/json"})  # fmt: skip

    # ---- nodes (signed by the node key) ---------------------------------------------------------
    def heartbeat(self, beat: HeartbeatRequest) -> HeartbeatResponse:
        """`POST /heartbeat`: the node's status in, the task it should run out."""
        return HeartbeatResponse.model_validate(self._send("POST", "/heartbeat", beat))

    def request_upload(self, request: UploadRequest) -> UploadGrant:
        """`POST /storage/request-upload`: a signed URL to PUT one finished file to."""
        return UploadGrant.model_validate(self._send("POST", "/storage/request-upload", request))

    # ---- files (admin, or signed by a validator) ------------------------------------------------
    def stored_file(self, sha256: str, timeout: float | None = None) -> StoredFile:
        """`GET /storage/files/{sha256}`: the upload's record (node, task, size) and a download URL,
        in one answer: all a validator needs of the orchestrator for one file."""
        per_call = {"timeout": timeout} if timeout is not None else {}
        return StoredFile.model_validate(self._request("GET", f"/storage/files/{sha256}", **per_call))

    # ---- tasks ---------------------------------------------------------------------------------
    def submit(self, spec: TaskSpec | Mapping[str, Any]) -> Task:
        """Create a task; the orchestrator validates the spec (a 422 names the bad field)."""
        body = spec.model_dump(mode="json", exclude_none=True) if isinstance(spec, TaskSpec) else dict(spec)
        return Task.model_validate(self._request("POST", "/tasks", json=body))

    def list(self, include_deleted: bool = False) -> list[Task]:
        params = {"include_deleted": "true"} if include_deleted else None
        return [Task.model_validate(t) for t in self._request("GET", "/tasks", params=params)]

    def get(self, task_id: str, include_deleted: bool = False) -> Task:
        """The task; a deleted one raises TaskApiError 404 unless `include_deleted`."""
        params = "?include_deleted=true" if include_deleted else ""
        return Task.model_validate(self._request("GET", f"/tasks/{task_id}{params}"))

    def delete(self, task_id: str) -> Task:
        return Task.model_validate(self._request("DELETE", f"/tasks/{task_id}"))

    def nodes(self) -> NodeList:
        return NodeList.model_validate(self._request("GET", "/nodes"))

    def node_hardware(self, address: str) -> HardwareHistory:
        """A node's hardware challenges, newest first, with the evidence of every wrong answer."""
        return HardwareHistory.model_validate(self._request("GET", f"/nodes/{address}/hardware"))

    def status(self, task_id: str) -> TaskProgress:
        """The task and, per node currently reporting it, the state it reports."""
        task = self.get(task_id)
        reported = [
            NodeTaskState(
                node=n.address, state=n.task.state, detail=n.task.detail, exit_code=n.task.exit_code
            )
            for n in self.nodes().nodes
            if n.task is not None and n.task.task_id == task_id
        ]
        return TaskProgress(task=task, nodes=reported)

    def wait(
        self,
        task_id: str,
        state: TaskState | str,
        *,
        nodes: int = 1,
        timeout: float = 300.0,
        poll: float = 1.0,
    ) -> TaskProgress:
        """Block until at least `nodes` nodes report `state` for the task. A task that every
        reporting node marks failed while another state was asked for ends the wait early."""
        wanted = TaskState(state)
        deadline = time.monotonic() + timeout
        while True:
            progress = self.status(task_id)
            if progress.count(wanted) >= nodes:
                return progress
            if (
                wanted != TaskState.FAILED
                and progress.nodes
                and all(n.state == TaskState.FAILED for n in progress.nodes)
            ):
                details = "; ".join(f"{n.node}: {n.detail or 'failed'}" for n in progress.nodes)
                raise TaskApiError(409, f"task {task_id} failed on every node reporting it: {details}")
            if time.monotonic() >= deadline:
                seen = ", ".join(f"{n.node[:10]}…={n.state.value}" for n in progress.nodes)
                raise TaskTimeout(
                    408,
                    f"task {task_id} did not reach {wanted.value} on {nodes} node(s) in {timeout:g}s"
                    f" ({seen or 'no node reports it'})",
                )
            time.sleep(poll)

    def logs(self, task_id: str, tail: int = 100) -> dict[str, builtins.list[str]]:
        """The last `tail` log lines of the task on each node running it."""
        out: dict[str, builtins.list[str]] = {}
        for n in self.status(task_id).nodes:
            body = self._request("GET", f"/nodes/{n.node}/logs", params={"tail": tail})
            out[n.node] = list(body.get("lines", []))
        return out
