"""Genesys-style task records: what a dataset row is, whatever its source."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TaskType = Literal["arithmetic", "reverse", "sort", "math", "code"]
SYNTHETIC_TYPES: tuple[str, ...] = ("arithmetic", "reverse", "sort")


class TaskRecord(BaseModel):
    """One problem. `verification_info` carries what the task type's verifier needs:
    synthetic and math: {"answer": str}; code: {"test_cases": [{"input": str, "output": str}], ...}."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    problem_id: str = Field(min_length=1)
    task_type: TaskType
    prompt: str = Field(min_length=1)
    verification_info: dict[str, Any]
