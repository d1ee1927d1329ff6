"""HMAC-SHA256 signatures over everything an upload URL allows: method, key, id, size, hash, expiry."""

from __future__ import annotations

import hashlib
import hmac
import time


class UrlSigner:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("storage URL secret must be at least 16 bytes")
        self._secret = secret

    def _mac(self, method: str, key: str, upload_id: str, size: int, sha256: str, expires: int) -> str:
        message = "\n".join([method.upper(), key, upload_id, str(size), sha256, str(expires)])
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()

    def sign(self, method: str, key: str, upload_id: str, size: int, sha256: str, expires: int) -> str:
        return self._mac(method, key, upload_id, size, sha256, expires)

    def valid(
        self,
        signature: str,
        method: str,
        key: str,
        upload_id: str,
        size: int,
        sha256: str,
        expires: int,
        now: float | None = None,
    ) -> tuple[bool, str]:
        expected = self._mac(method, key, upload_id, size, sha256, expires)
        # As bytes: compare_digest refuses str with non-ASCII characters (a 500 found by schemathesis).
        if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "surrogatepass")):
            return False, "URL signature does not match (tampered or for another file)"
        if (time.time() if now is None else now) > expires:
            return False, "upload URL expired: request a new one"
        return True, ""
