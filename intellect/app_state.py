"""FastAPI dependencies that hand a route what its service put on `request.app.state`.

A service builds its objects once (at build time, or in the lifespan for what needs Redis or SQL),
puts each on `app.state`, and names a getter for each with `from_app_state`: a route asks for it
through `Depends`, a test replaces the getter through `app.dependency_overrides`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")


def from_app_state(name: str, kind: type[T]) -> Callable[[Request], T]:
    """A dependency returning `request.app.state.<name>`, typed as a `kind` (not checked)."""

    def get(request: Request) -> T:
        value: T = getattr(request.app.state, name)
        return value

    get.__name__ = get.__qualname__ = f"get_{name}"
    return get
