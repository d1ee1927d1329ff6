"""HTTP clients the orchestrator uses: discovery (pool's nodes) and workers (invite, logs, restart,
hardware challenges).

Every call is signed with the manager key, has a timeout, and retries transport errors and 5xx
(tenacity, exponential back-off); a 4xx is an answer, never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from intellect.errors import PeerRefused, PeerUnreachable
from intellect.identity import Wallet
from intellect.signing import SignedAuth
from intellect.wire.hardware import (
    MAX_ANSWER_BYTES,
    HardwareAnswer,
    HardwareChallenge,
    HardwareCommitment,
    HardwareReveal,
)
from intellect.wire.invites import InviteRequest, InviteResponse
from intellect.wire.nodes import DiscoveredNode


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code >= 500


class SignedClient:
    def __init__(self, manager: Wallet, timeout: float, retries: int) -> None:
        self.http = httpx.AsyncClient(auth=SignedAuth(manager), timeout=timeout)
        self.retries = retries

    async def request(self, method: str, url: str, **kwargs: object) -> httpx.Response:
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.retries), wait=wait_exponential(multiplier=0.2, max=3),
                retry=retry_if_exception(_retryable), reraise=True,
            ):
                with attempt:
                    response = await self.http.request(method, url, **kwargs)  # type: ignore[arg-type]
                    if response.status_code >= 500:
                        response.raise_for_status()
        except httpx.HTTPStatusError as exc:
            raise PeerRefused.from_response(exc.response, url) from None
        except httpx.HTTPError as exc:
            raise PeerUnreachable(url, f"{type(exc).__name__} {exc}") from None
        if response.status_code >= 400:
            raise PeerRefused.from_response(response, url)
        return response

    async def pool_nodes(self, discovery_url: str, pool_id: int) -> list[DiscoveredNode]:
        response = await self.request("GET", f"{discovery_url.rstrip('/')}/pools/{pool_id}/nodes")
        return [DiscoveredNode.model_validate(item) for item in response.json()]

    async def invite(self, worker_url: str, invite: InviteRequest) -> InviteResponse:
        response = await self.request("POST", f"{worker_url}/invite", content=invite.model_dump_json(),
                                      headers={"Content-Type": "application/json"})
        return InviteResponse.model_validate(response.json())

    async def leave_invite(self, discovery_url: str, invite: InviteRequest) -> None:
        """Leave the invite at discovery for a node whose API cannot be reached (behind NAT)."""
        await self.request("PUT", f"{discovery_url.rstrip('/')}/nodes/{invite.node_address}/invite",
                           content=invite.model_dump_json(), headers={"Content-Type": "application/json"})

    async def logs(self, worker_url: str, tail: int) -> list[str]:
        response = await self.request("GET", f"{worker_url}/logs", params={"tail": tail})
        return [str(line) for line in response.json().get("lines", [])]

    async def restart(self, worker_url: str) -> dict[str, object]:
        return (await self.request("POST", f"{worker_url}/restart")).json()

    async def round_trip(self, worker_url: str, tries: int = 3) -> float:
        """The shortest round trip to the worker, in seconds: of `tries` TCP handshakes (answered by
        the node's kernel) and `tries` GET /health (no retries: a retry's wait is not the link's).

        Shown with the node's hardware figure and used as a bound on its links in placement; never
        subtracted from the challenge's time (orchestrator/hardware/challenger.py): the node answers
        these probes itself and could delay them, which gained it up to 2× when it was (issue 56). The
        shortest of both kinds is kept."""
        url = httpx.URL(worker_url)
        host, port = url.host, url.port or (443 if url.scheme == "https" else 80)
        best = float("inf")
        for _ in range(tries):
            started = time.perf_counter()
            try:
                connecting = asyncio.open_connection(host, port)
                # briefly: a node behind NAT never answers, and its invite then goes to discovery
                _, writer = await asyncio.wait_for(connecting, min(self.http.timeout.connect or 3.0, 3.0))
            except (OSError, TimeoutError) as exc:
                raise PeerUnreachable(worker_url, f"TCP connect: {type(exc).__name__} {exc}") from None
            best = min(best, time.perf_counter() - started)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        for _ in range(tries):
            started = time.perf_counter()
            try:
                response = await self.http.get(f"{worker_url}/health")
            except httpx.HTTPError as exc:
                raise PeerUnreachable(worker_url, f"{type(exc).__name__} {exc}") from None
            if response.status_code >= 400:
                raise PeerRefused.from_response(response, worker_url)
            best = min(best, time.perf_counter() - started)
        return best

    async def _once(self, url: str, body: str, timeout: float) -> bytes:
        """One signed POST, never retried (a hardware challenge is timed, and a retry would restart
        it); the reply read up to MAX_ANSWER_BYTES, refused past it before anything is parsed."""
        try:
            posting = self.http.stream("POST", url, content=body, timeout=timeout,
                                       headers={"Content-Type": "application/json"})  # fmt: skip
            async with posting as response:
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise PeerRefused(413, f"reply over {MAX_ANSWER_BYTES} bytes", url)
                    chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise PeerUnreachable(url, f"{type(exc).__name__} {exc}") from None
        content = b"".join(chunks)
        if response.status_code >= 400:
            raise PeerRefused.from_response(httpx.Response(response.status_code, content=content), url)
        return content

    async def hardware_challenge(self, worker_url: str, challenge: HardwareChallenge,
                                 timeout: float) -> HardwareCommitment:  # fmt: skip
        content = await self._once(f"{worker_url}/hardware/challenge", challenge.model_dump_json(), timeout)
        return HardwareCommitment.model_validate_json(content)

    async def hardware_reveal(self, worker_url: str, reveal: HardwareReveal,
                              timeout: float) -> HardwareAnswer:  # fmt: skip
        content = await self._once(f"{worker_url}/hardware/reveal", reveal.model_dump_json(), timeout)
        return HardwareAnswer.model_validate_json(content)

    async def aclose(self) -> None:
        await self.http.aclose()
