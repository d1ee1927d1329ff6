"""Where the dashboard's figures come from: the orchestrator, the validator, the trainer and the chain.

Each source is read over its public interface (HTTP or the ledger) and answers a `Section`: its rows,
or the reason it is unavailable. One dead upstream greys out its own panel, never the page.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, Field

from intellect.wire.admin import hardware_summary
from intellect.workloads import UNJUDGED
from ledger.client import LedgerClient
from ledger.models import ONE_TOKEN

MANIFEST_MAX_BYTES = 1 << 20  # a step manifest is a few kB (metrics and file hashes)



def proven_text(hardware: dict | None) -> str | None:
    """A node's latest hardware challenge in a cell: `12.3 GFLOP/s fp32, 0.8 ms` or why nothing was proven
    (docs/hardware.md)."""
    return hardware_summary(hardware) if hardware else None

class Section(BaseModel):
    """One panel's data: rows of plain values, or why there are none."""

    rows: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None
    fetched_at: float = Field(default_factory=time.time)
    note: str | None = Field(None, description="shown quietly beside data that is there (an offline source)")
    offline_since: float | None = Field(None, description="when its source stopped answering (rows kept)")


class Source(Protocol):
    name: str

    def read(self) -> dict[str, Section]: ...


def _fail(names: list[str], reason: str) -> dict[str, Section]:
    return {n: Section(error=reason) for n in names}


def _get(client: httpx.Client, url: str, **params: Any) -> Any:
    response = client.get(url, params={k: v for k, v in params.items() if v is not None})
    if response.status_code >= 400:
        try:
            reason = response.json().get("detail", response.text)
        except ValueError:
            reason = response.text
        raise RuntimeError(f"{response.status_code} from {url}: {str(reason)[:200]}")
    return response.json()


class OrchestratorSource:
    """Nodes (state, last heartbeat, task), tasks and groups, with the admin token kept here."""

    name = "orchestrator"
    sections = ["nodes", "tasks", "groups"]

    def __init__(self, url: str, token: str, timeout: float) -> None:
        self.client = httpx.Client(
            base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )

    def read(self) -> dict[str, Section]:
        try:
            nodes = _get(self.client, "/nodes")
            tasks = _get(self.client, "/tasks", include_deleted="true")  # an ended task stays, marked
        except (httpx.HTTPError, RuntimeError) as exc:
            return _fail(self.sections, f"orchestrator: {exc}")
        node_rows = [
            {
                "address": n["address"],
                "state": n["state"],
                "joined_via": n.get("joined_via"),
                "proven": proven_text(n.get("hardware")),
                "last_heartbeat": n.get("last_heartbeat_at"),
                "task": (n.get("task") or {}).get("task_id"),
                "task_state": (n.get("task") or {}).get("state"),
                "reason": n.get("reason"),
            }
            for n in nodes.get("nodes", [])
        ]
        per_task: dict[str, dict[str, int]] = {}
        for n in node_rows:
            if n["task"]:
                states = per_task.setdefault(n["task"], {})
                states[n["task_state"]] = states.get(n["task_state"], 0) + 1
        task_rows = [
            {
                "id": t["id"],
                "name": t["spec"]["name"],
                "image": t["spec"]["image"],
                "created": t["created_at"],
                "state": "ended (deleted)" if t.get("deleted") else "active",
                "judged": _judged(t),
                "nodes": ", ".join(f"{k} {v}" for k, v in sorted(per_task.get(t["id"], {}).items())) or "-",
            }
            for t in sorted(tasks, key=lambda t: bool(t.get("deleted")))  # active first, stable
        ]
        out = {"nodes": Section(rows=node_rows), "tasks": Section(rows=task_rows)}
        try:
            groups = _get(self.client, "/groups")
            items = groups.get("groups", groups) if isinstance(groups, dict) else groups
            out["groups"] = Section(
                rows=[
                    {
                        "id": g.get("id") or g.get("group_id"),
                        "topology": g.get("topology"),
                        "nodes": ", ".join(g.get("nodes", [])),
                        "task": g.get("task_id"),
                    }
                    for g in items
                ]
            )
        except (httpx.HTTPError, RuntimeError) as exc:
            out["groups"] = Section(error=f"groups: {exc}")
        return out


class ValidatorSource:
    """The validator's verdicts, newest last, with their reasons."""

    name = "validator"
    sections = ["verdicts"]

    def __init__(self, url: str, pool_id: int, timeout: float, limit: int = 200) -> None:
        self.client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout)
        self.pool_id = pool_id
        self.limit = limit

    def read(self) -> dict[str, Section]:
        try:
            body = _get(self.client, "/verdicts", pool=self.pool_id, limit=self.limit)
        except (httpx.HTTPError, RuntimeError) as exc:
            return _fail(self.sections, f"validator: {exc}")
        rows = [
            {
                "work_key": v.get("work_key"),
                "node": v.get("node"),
                "verdict": v.get("verdict"),
                "reasons": "; ".join(v.get("reasons") or []),
                "rows": v.get("rows"),
                "step": v.get("step"),
                "tx": v.get("tx_hash"),
            }
            for v in body.get("items", [])
        ]
        return {"verdicts": Section(rows=rows[-self.limit :])}


class TrainerSource:
    """The reward curve: one point per trainer step (mean task reward of the rollouts trained on).

    From the trainer's `/history` while it runs; when it does not answer (a run that ended, a restart)
    and `history_dir` names its output folder, from the step manifests it keeps there (a manifest
    outlives its checkpoint's weights: the whole curve), with a quiet note instead of an error."""

    name = "trainer"
    sections = ["rewards"]

    def __init__(self, url: str, timeout: float, history_dir: Path | None = None) -> None:
        self.client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout)
        self.history_dir = history_dir

    def read(self) -> dict[str, Section]:
        try:
            body = _get(self.client, "/history")
        except (httpx.HTTPError, RuntimeError) as exc:
            from_disk = self._from_manifests()
            if from_disk is None:
                return _fail(self.sections, f"trainer: {exc}")
            note = f"trainer not answering ({exc}); the curve from its step manifests in {self.history_dir}"
            return {"rewards": Section(rows=from_disk, note=note)}
        items = body.get("items", body) if isinstance(body, dict) else body
        rows = [
            {"step": int(p["step"]), "reward": float(p["reward"])}
            for p in items
            if p.get("step") is not None and p.get("reward") is not None
        ]
        return {"rewards": Section(rows=sorted(rows, key=lambda r: r["step"]))}

    def _from_manifests(self) -> list[dict[str, Any]] | None:
        """`step_<n>.json` manifests (workloads/trainer/checkpoints.py): step and task_reward_mean.
        None where there is no folder or nothing readable in it."""
        if self.history_dir is None or not self.history_dir.is_dir():
            return None
        rows = []
        for path in self.history_dir.glob("step_*.json"):
            try:
                if path.stat().st_size > MANIFEST_MAX_BYTES:
                    continue
                manifest = json.loads(path.read_text())
                reward = manifest.get("metrics", {}).get("task_reward_mean")
                if reward is not None:
                    rows.append({"step": int(manifest["step"]), "reward": float(reward)})
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # a manifest being written, or not one: skipped
        return sorted(rows, key=lambda r: r["step"]) or None


class ChainSource:
    """Stake and payouts per node of the pool, read from the ledger."""

    name = "chain"
    sections = ["payouts"]

    def __init__(self, ledger: LedgerClient, pool_id: int) -> None:
        self.ledger = ledger
        self.pool_id = pool_id
        self.known: set[str] = set()  # nodes seen elsewhere (an ejected node has left the pool list)

    def read(self) -> dict[str, Section]:
        try:
            rows = []
            members = self.ledger.pool_nodes(self.pool_id)
            for node in members + sorted(self.known - set(members)):
                info = self.ledger.get_node(node)
                provider = self.ledger.get_provider(info.provider) if info else None
                rows.append(
                    {
                        "node": node,
                        "in_pool": node in members,
                        "provider": info.provider if info else None,
                        "stake": provider.stake / ONE_TOKEN if provider else None,
                        "pending": self.ledger.pending_rewards(node) / ONE_TOKEN,
                        "claimable": self.ledger.claimable_rewards(node) / ONE_TOKEN,
                    }
                )
        except Exception as exc:  # any RPC failure greys out this panel only
            return _fail(self.sections, f"chain: {type(exc).__name__}: {exc}")
        return {"payouts": Section(rows=rows)}


def _judged(task: dict[str, Any]) -> str:
    """The workload that judges the task's files, or the plain warning that nobody does."""
    workload = (task.get("spec") or {}).get("workload")
    if task.get("judged") is False or not workload:
        return UNJUDGED
    return f"by {workload.get('type')}"
