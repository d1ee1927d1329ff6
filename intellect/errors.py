"""Errors every service shares.

A peer (discovery, an orchestrator, a worker, storage) that answers 4xx gives a reason naming what
to fix; before this module each client had its own near-identical "(status, reason)" class. Now
there is one: `PeerRefused`. `PeerUnreachable` is the other way a call to a peer fails (transport
error, no answer); both derive from `PeerError` so a caller that treats them alike catches one type.
"""

from __future__ import annotations

import httpx


class PeerError(Exception):
    """A call to another service failed; `str(exc)` is the user-readable sentence."""


class PeerRefused(PeerError):
    """The peer answered with an error status and a reason (its JSON `detail`, or its body)."""

    def __init__(self, status: int, reason: str, peer: str = "") -> None:
        super().__init__(f"{peer} refused ({status}): {reason}" if peer else reason)
        self.status = status
        self.reason = reason
        self.peer = peer

    @classmethod
    def from_response(cls, response: httpx.Response, peer: str = "") -> PeerRefused:
        return cls(response.status_code, reason_of(response), peer)


class PeerUnreachable(PeerError):
    """The peer could not be reached or did not answer (connection refused, timeout, ...)."""

    def __init__(self, peer: str, detail: str) -> None:
        super().__init__(f"{peer} unreachable: {detail}")
        self.peer = peer
        self.detail = detail


def reason_of(response: httpx.Response) -> str:
    """The reason a service gave: FastAPI's `detail` when the body is JSON, else the raw text."""
    try:
        body = response.json()
    except ValueError:
        return response.text
    detail = body.get("detail", response.text) if isinstance(body, dict) else response.text
    return detail if isinstance(detail, str) else str(detail)
