from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_lone_surrogate(v) for v in value)
    return False


class WireModel(BaseModel):
    """Strict by default: unknown fields are a client error, not silently dropped. Text that is not
    valid Unicode (a lone surrogate such as "\\ud800", legal in JSON escapes) is refused too: it
    could never be stored, logged or sent on as UTF-8."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if _has_lone_surrogate(data):
            raise ValueError("text must be valid Unicode: lone surrogates (e.g. \\ud800) are refused")
        return data
