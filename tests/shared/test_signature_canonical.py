"""Only the canonical encoding of a signature is accepted: one signed request, one valid encoding."""

from __future__ import annotations

import pytest

from intellect.identity import Wallet
from intellect.signing import (
    HEADER_SIGNATURE,
    SECP256K1_HALF_ORDER,
    SignatureRejected,
    sign_request,
    verify_signed_request,
)

N = 2 * SECP256K1_HALF_ORDER + 1  # the order of secp256k1


def _resign(headers: dict[str, str], raw: bytes) -> dict[str, str]:
    return headers | {HEADER_SIGNATURE: "0x" + raw.hex()}


def test_own_signatures_are_canonical_and_verify() -> None:
    wallet = Wallet.create()
    for i in range(50):  # about half of random signatures would be high-s without normalisation
        headers = sign_request(wallet, "POST", f"/x?{i}", b"{}")
        raw = bytes.fromhex(headers[HEADER_SIGNATURE][2:])
        assert raw[64] in (27, 28)
        assert int.from_bytes(raw[32:64], "big") <= SECP256K1_HALF_ORDER
        assert verify_signed_request("POST", f"/x?{i}", b"{}", headers).address == wallet.address


def test_high_s_twin_of_a_valid_signature_is_refused() -> None:
    wallet = Wallet.create()
    headers = sign_request(wallet, "GET", "/nodes", b"")
    raw = bytes.fromhex(headers[HEADER_SIGNATURE][2:])
    s = int.from_bytes(raw[32:64], "big")
    twin = raw[:32] + (N - s).to_bytes(32, "big") + bytes((55 - raw[64],))  # flip s and the parity of v
    with pytest.raises(SignatureRejected, match="not canonical"):
        verify_signed_request("GET", "/nodes", b"", _resign(headers, twin))


@pytest.mark.parametrize("v", [0, 1, 35, 36])
def test_other_v_encodings_are_refused(v: int) -> None:
    wallet = Wallet.create()
    headers = sign_request(wallet, "GET", "/nodes", b"")
    raw = bytes.fromhex(headers[HEADER_SIGNATURE][2:])
    with pytest.raises(SignatureRejected, match="v = 27 or 28"):
        verify_signed_request("GET", "/nodes", b"", _resign(headers, raw[:64] + bytes((v,))))


@pytest.mark.parametrize("signature", ["0x12", "12" * 65, "0x" + "zz" * 65, "0x" + "00" * 66])
def test_malformed_signature_headers_are_refused_with_400(signature: str) -> None:
    wallet = Wallet.create()
    headers = sign_request(wallet, "GET", "/nodes", b"") | {HEADER_SIGNATURE: signature}
    with pytest.raises(SignatureRejected) as info:
        verify_signed_request("GET", "/nodes", b"", headers)
    assert info.value.status == 400
