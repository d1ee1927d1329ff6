"""A pool's hardware requirements, carried in the pool's on-chain `dataURI`, and the check against a node.

Accepted `dataURI` forms (parsed tolerantly: anything else means "no requirements"):
  - inline JSON: `{"requirements": {...}}` or the requirements object itself;
  - `data:application/json,<percent-encoded JSON>` or `data:application/json;base64,<base64>`.
Requirements object (every key optional, unknown keys ignored so pools can carry more data):
  {"gpu": {"count": 1, "memory_mb": 40000, "models": ["H100", "A100"]},
   "cpu_cores": 4, "ram_mb": 16000, "disk_free_mb": 50000, "docker": true}
`gpu.memory_mb` is per GPU; `gpu.models` matches case-insensitively as a substring of the GPU model.
"""

from __future__ import annotations

import base64
import json
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from intellect.wire.nodes import ComputeSpecs


class _Tolerant(BaseModel):
    model_config = ConfigDict(extra="ignore")


class GpuRequirement(_Tolerant):
    count: int = Field(default=0, ge=0)
    memory_mb: int = Field(default=0, ge=0)
    models: list[str] = Field(default_factory=list)


class PoolRequirements(_Tolerant):
    gpu: GpuRequirement | None = None
    cpu_cores: int = Field(default=0, ge=0)
    ram_mb: int = Field(default=0, ge=0)
    disk_free_mb: int = Field(default=0, ge=0)
    docker: bool = False

    def mismatches(self, specs: ComputeSpecs) -> list[str]:
        """Human-readable reasons `specs` does not meet these requirements (empty: it does)."""
        problems: list[str] = []
        if self.gpu and (self.gpu.count or self.gpu.memory_mb or self.gpu.models):
            fitting = [
                g
                for g in specs.gpus
                if g.memory_mb >= self.gpu.memory_mb
                and (not self.gpu.models or any(m.lower() in g.model.lower() for m in self.gpu.models))
            ]
            have = sum(g.count for g in fitting)
            need = max(self.gpu.count, 1)
            if have < need:
                what = f"{need} GPU(s)"
                if self.gpu.memory_mb:
                    what += f" with >= {self.gpu.memory_mb} MB each"
                if self.gpu.models:
                    what += f" of model {'/'.join(self.gpu.models)}"
                problems.append(f"needs {what}, has {have} matching")
        if specs.cpu_cores < self.cpu_cores:
            problems.append(f"needs {self.cpu_cores} CPU cores, has {specs.cpu_cores}")
        if specs.ram_mb < self.ram_mb:
            problems.append(f"needs {self.ram_mb} MB RAM, has {specs.ram_mb}")
        if specs.disk_free_mb < self.disk_free_mb:
            problems.append(f"needs {self.disk_free_mb} MB free disk, has {specs.disk_free_mb}")
        if self.docker and not specs.docker_available:
            problems.append("needs a reachable Docker engine")
        return problems


def _json_payload(data_uri: str) -> object | None:
    text = data_uri.strip()
    if text.startswith("data:"):
        header, _, payload = text[5:].partition(",")
        if "json" not in header.lower():
            return None
        if header.lower().endswith(";base64"):
            try:
                text = base64.b64decode(payload).decode()
            except (ValueError, UnicodeDecodeError):
                return None
        else:
            text = unquote(payload)
    try:
        decoded: object = json.loads(text)
    except ValueError:
        return None
    return decoded


def parse_pool_requirements(data_uri: str | None) -> PoolRequirements:
    """Requirements from a pool's dataURI; a URI we cannot read yields no requirements, never an error."""
    payload = _json_payload(data_uri or "")
    if not isinstance(payload, dict):
        return PoolRequirements()
    inner = payload.get("requirements", payload)
    try:
        return PoolRequirements.model_validate(inner if isinstance(inner, dict) else {})
    except ValidationError:
        return PoolRequirements()


def requirements_data_uri(requirements: PoolRequirements) -> str:
    """The canonical dataURI for a pool: inline JSON, what `intellect-pool create-pool` should store."""
    return json.dumps({"requirements": requirements.model_dump(exclude_defaults=True)}, separators=(",", ":"))
