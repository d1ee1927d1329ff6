"""Who may use the admin API (tasks, node actions, file reads): the admin bearer token, or a request
signed by the pool manager's key or by one of the addresses in `INTELLECT_ORCH_ADMIN_SIGNERS` (a
trainer with its own key posts tasks without ever holding the shared token)."""

from __future__ import annotations

from collections.abc import Callable

from eth_utils import is_address, to_checksum_address
from fastapi import HTTPException, Request

from intellect.auth import AdminToken, RedisNonceStore, RequestVerifier
from intellect.signing import HEADER_SIGNATURE
from orchestrator.context import Context


class AdminAccess:
    """FastAPI dependency: returns "admin" for the token, or the signer's checksummed address.

    Signed requests need Redis for the nonce; by default it is the running Context's, read from
    `request.app.state.ctx` (put there by the server's lifespan). `ctx` overrides that lookup for
    callers that hold a Context some other way.
    """

    def __init__(
        self, token: AdminToken, signers: list[str], ctx: Callable[[], Context] | None = None,
        max_skew_seconds: int = 60,
    ) -> None:
        bad = [s for s in signers if not is_address(s)]
        if bad:
            raise ValueError(f"admin_signers: {bad} are not 0x-prefixed 20-byte addresses")
        self.token = token
        self.signers = {to_checksum_address(s) for s in signers}
        self.ctx = ctx
        self.max_skew_seconds = max_skew_seconds

    def allow(self, address: str) -> None:
        """Also accept requests signed by `address` (the pool manager, once its key is loaded)."""
        self.signers.add(to_checksum_address(address))

    async def __call__(self, request: Request) -> str:
        if request.headers.get("authorization") or not request.headers.get(HEADER_SIGNATURE):
            await self.token(request)  # 401 without credentials, 403 for a wrong token
            return "admin"
        ctx: Context = self.ctx() if self.ctx is not None else request.app.state.ctx
        verifier = RequestVerifier(
            RedisNonceStore(ctx.redis, "orch:nonce"), max_skew_seconds=self.max_skew_seconds
        )
        caller = await verifier.verify(request)
        if caller not in self.signers:
            raise HTTPException(
                403, f"{caller} may not use the admin API: sign with the pool manager's key, or add the "
                "address to INTELLECT_ORCH_ADMIN_SIGNERS",
            )  # fmt: skip
        return caller
