"""Signed requests: the wire format every node, operator and service speaks.

canonical string = METHOD \\n path-with-query exactly as sent \\n sha256(body) hex \\n timestamp \\n nonce
signature        = EIP-191 personal_sign of the canonical string's UTF-8 bytes, 0x-prefixed hex
headers          = X-Intellect-Address, X-Intellect-Signature, X-Intellect-Timestamp, X-Intellect-Nonce

The identity of a request is the address recovered from the signature; the address header only has
to agree with it. See docs/signed-requests.md for a worked example.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from functools import lru_cache

import httpx
from eth_utils import is_address, to_checksum_address

from intellect.identity import IdentityError, Wallet, recover_address_bytes

HEADER_ADDRESS = "X-Intellect-Address"
HEADER_SIGNATURE = "X-Intellect-Signature"
HEADER_TIMESTAMP = "X-Intellect-Timestamp"
HEADER_NONCE = "X-Intellect-Nonce"

NONCE_PATTERN = re.compile(r"^[A-Za-z0-9-]{16,64}$")
DEFAULT_MAX_SKEW_SECONDS = 60


class SignatureRejected(Exception):
    """Why a signed request was refused; `status` is the HTTP code a server should answer with."""

    def __init__(self, reason: str, status: int = 401) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def canonical_string(method: str, path_with_query: str, body: bytes, timestamp: int, nonce: str) -> str:
    return "\n".join([method.upper(), path_with_query, body_digest(body), str(timestamp), nonce])


def new_nonce() -> str:
    return secrets.token_hex(16)


def sign_request(
    wallet: Wallet,
    method: str,
    path_with_query: str,
    body: bytes = b"",
    *,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The four headers that authenticate one request."""
    ts = int(time.time()) if timestamp is None else timestamp
    nonce = nonce or new_nonce()
    signature = wallet.sign_message(canonical_string(method, path_with_query, body, ts, nonce))
    return {
        HEADER_ADDRESS: wallet.address,
        HEADER_SIGNATURE: signature,
        HEADER_TIMESTAMP: str(ts),
        HEADER_NONCE: nonce,
    }


def path_with_query(url: httpx.URL) -> str:
    """The request target exactly as it goes on the wire (raw path plus raw query)."""
    return url.raw_path.decode("ascii")


class SignedAuth(httpx.Auth):
    """httpx auth that signs every request with `wallet` (works for sync and async clients)."""

    requires_request_body = True

    def __init__(self, wallet: Wallet) -> None:
        self.wallet = wallet

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        headers = sign_request(self.wallet, request.method, path_with_query(request.url), request.content)
        request.headers.update(headers)
        yield request


@lru_cache(maxsize=65536)
def _checksum(raw_address: bytes) -> str:
    # EIP-55 costs a keccak; a server sees the same few thousand node addresses over and over.
    return to_checksum_address(raw_address)


# Half the order of secp256k1: a signature (r, s) and (r, n - s) both verify, so only the low-s
# form is accepted (EIP-2), and v must be 27 or 28 as personal_sign produces. Otherwise one signed
# request has several valid encodings, and a replay filter keyed on the signature could be dodged.
SECP256K1_HALF_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0
SIGNATURE_PATTERN = re.compile(r"0x[0-9a-fA-F]{130}")


def require_canonical_signature(signature: str) -> None:
    """Refuse every encoding of a signature but the canonical one: 0x + 130 hex, v 27/28, low s."""
    if not SIGNATURE_PATTERN.fullmatch(signature):
        raise SignatureRejected(f"{HEADER_SIGNATURE} must be 0x followed by 130 hex characters", 400)
    raw = bytes.fromhex(signature[2:])
    if raw[64] not in (27, 28):
        raise SignatureRejected(f"{HEADER_SIGNATURE} must have v = 27 or 28 (personal_sign)", 400)
    if int.from_bytes(raw[32:64], "big") > SECP256K1_HALF_ORDER:
        raise SignatureRejected(f"{HEADER_SIGNATURE} is not canonical: its s value is in the upper half", 400)


@dataclass(frozen=True)
class SignedRequest:
    """A verified request's identity and replay-protection fields."""

    address: str
    timestamp: int
    nonce: str


def verify_signed_request(
    method: str,
    path_with_query: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float | None = None,
    max_skew_seconds: int = DEFAULT_MAX_SKEW_SECONDS,
) -> SignedRequest:
    """Check the headers against the request; raise SignatureRejected naming what is wrong.

    Nonce single-use is the caller's job (it needs shared state): see `intellect.auth`.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    missing = [
        h
        for h in (HEADER_ADDRESS, HEADER_SIGNATURE, HEADER_TIMESTAMP, HEADER_NONCE)
        if h.lower() not in lowered
    ]
    if missing:
        raise SignatureRejected(f"missing signature headers: {', '.join(missing)}")
    address = lowered[HEADER_ADDRESS.lower()]
    signature = lowered[HEADER_SIGNATURE.lower()]
    nonce = lowered[HEADER_NONCE.lower()]
    if not is_address(address):
        raise SignatureRejected(f"{HEADER_ADDRESS} is not an Ethereum address", 400)
    if not NONCE_PATTERN.match(nonce):
        raise SignatureRejected(f"{HEADER_NONCE} must be 16 to 64 characters of [A-Za-z0-9-]", 400)
    try:
        timestamp = int(lowered[HEADER_TIMESTAMP.lower()])
    except ValueError:
        raise SignatureRejected(f"{HEADER_TIMESTAMP} must be unix seconds", 400) from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > max_skew_seconds:
        raise SignatureRejected(
            f"timestamp is {int(current - timestamp)}s off the server clock (max skew {max_skew_seconds}s)"
        )
    require_canonical_signature(signature)
    message = canonical_string(method, path_with_query, body, timestamp, nonce)
    try:
        recovered = recover_address_bytes(message, signature)
    except IdentityError:
        raise SignatureRejected("malformed signature") from None
    # The header may be checksummed or not (is_address does not insist); compare the raw bytes.
    if recovered.hex() != address.removeprefix("0x").removeprefix("0X").lower():
        raise SignatureRejected("signature does not match the address and request")
    return SignedRequest(address=_checksum(recovered), timestamp=timestamp, nonce=nonce)
