from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    """Strict by default: unknown fields are a client error, not silently dropped."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
