"""The coincurve recovery path must give exactly eth-account's answer, and refuse what it refuses."""

from __future__ import annotations

import os
import random

import pytest
from eth_account import Account
from eth_account.messages import encode_defunct

from intellect.identity import IdentityError, Wallet, recover_address_bytes, recover_message
from intellect.signing import SignatureRejected, sign_request, verify_signed_request

N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def reference(message: bytes, signature: str | bytes) -> str | None:
    """eth-account's own answer; None where it refuses the signature."""
    try:
        return Account.recover_message(encode_defunct(primitive=message), signature=signature)
    except Exception:
        return None


def ours(message: bytes, signature: str | bytes) -> str | None:
    try:
        return recover_message(message, signature)
    except IdentityError:
        return None


def test_agrees_with_eth_account_on_random_keys_and_messages() -> None:
    rng = random.Random(7)
    for _ in range(60):
        wallet = Wallet.from_key(rng.randbytes(31) + b"\x01")
        message = rng.randbytes(rng.randrange(0, 300))
        signature = wallet.sign_message(message)
        raw = bytes.fromhex(signature[2:])
        assert ours(message, signature) == reference(message, signature) == wallet.address
        assert recover_address_bytes(message, signature).hex() == wallet.address[2:].lower()
        # the same signature as bytes, and with v as 0/1 instead of 27/28
        assert ours(message, raw) == wallet.address
        low_v = raw[:64] + bytes((raw[64] - 27,))
        assert ours(message, low_v) == reference(message, low_v) == wallet.address
        # the malleable twin (s -> N - s, v flipped) is accepted by both, for the same signer
        r, s, v = raw[:32], int.from_bytes(raw[32:64], "big"), raw[64]
        twin = r + (N - s).to_bytes(32, "big") + bytes((55 - v,))
        assert ours(message, twin) == reference(message, twin) == wallet.address
        # a different message recovers someone else, identically in both
        assert ours(message + b"!", signature) == reference(message + b"!", signature) != wallet.address


def test_odd_shapes_take_eth_accounts_path_and_agree() -> None:
    wallet = Wallet.create()
    message = b"GET\n/x\n" + os.urandom(8)
    raw = bytes.fromhex(wallet.sign_message(message)[2:])
    eip155_v = raw[:64] + bytes((37 + raw[64] - 27,))  # eth-account reads v >= 35 as EIP-155
    for signature in (eip155_v, "0x" + eip155_v.hex(), raw.hex(), "0X" + raw.hex().upper()):
        assert ours(message, signature) == reference(message, signature)


@pytest.mark.parametrize("mangle", [
    lambda raw: raw[:64],                                  # too short
    lambda raw: raw + b"\x00",                             # too long
    lambda raw: bytes(32) + raw[32:],                      # r = 0
    lambda raw: raw[:32] + bytes(32) + raw[64:],           # s = 0
    lambda raw: N.to_bytes(32, "big") + raw[32:],          # r = N (out of range)
    lambda raw: raw[:32] + (N + 1).to_bytes(32, "big") + raw[64:],  # s > N
    lambda raw: b"\xff" * 64 + raw[64:],                   # r, s way out of range
    lambda raw: raw[:64] + b"\x02",                        # v not 0, 1, 27, 28 or >= 35
    lambda raw: raw[:64] + b"\x1d",                        # v = 29
])
def test_malformed_signatures_are_refused_by_both(mangle) -> None:
    wallet = Wallet.create()
    message = b"hello"
    raw = bytes.fromhex(wallet.sign_message(message)[2:])
    bad = mangle(raw)
    for form in (bad, "0x" + bad.hex()):
        assert reference(message, form) is None
        with pytest.raises(IdentityError, match="malformed"):
            recover_message(message, form)


def test_random_bytes_give_the_same_verdict() -> None:
    rng = random.Random(11)
    for _ in range(200):
        sig = rng.randbytes(64) + bytes((rng.choice([0, 1, 27, 28]),))
        assert ours(b"m", sig) == reference(b"m", sig)
    for text in ("0x" + "zz" * 65, "0x" + " " * 130, "0x" + "ab" * 64 + " 1c"):
        assert ours(b"m", text) == reference(b"m", text) is None


def test_verified_request_names_the_checksummed_signer_whatever_the_header_case() -> None:
    wallet = Wallet.create()
    body = b'{"metrics":{}}'
    headers = sign_request(wallet, "POST", "/heartbeat", body)
    for address in (wallet.address, wallet.address.lower(), "0x" + wallet.address[2:].upper()):
        signed = verify_signed_request("POST", "/heartbeat", body,
                                       {**headers, "X-Intellect-Address": address})
        assert signed.address == wallet.address
    with pytest.raises(SignatureRejected, match="does not match"):
        verify_signed_request("POST", "/heartbeat", body,
                              {**headers, "X-Intellect-Address": Wallet.create().address})
    with pytest.raises(SignatureRejected, match="malformed"):
        verify_signed_request("POST", "/heartbeat", body,
                              {**headers, "X-Intellect-Signature": "0x" + "00" * 64 + "1b"})
