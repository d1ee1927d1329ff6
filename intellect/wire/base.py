from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator


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


class TooLarge(ValueError):
    """A file over the size a reader accepts; `str()` names both sizes."""


def read_capped(path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of `path`, refused before they are read when over `max_bytes` (`TooLarge`, naming `what`
    the file should be); an unreadable file raises OSError. A file that grows while read is cut at one
    byte over the cap, so a parser still sees it is too large."""
    size = path.stat().st_size
    if size > max_bytes:
        raise TooLarge(f"{size} bytes, over the {max_bytes}-byte limit of {what}")
    with path.open("rb") as fh:
        return fh.read(max_bytes + 1)


def first_error(exc: ValidationError) -> str:
    """`where: why` of a validation error's first problem, as a user reads it."""
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc']) or 'file'}: {err['msg']}"
