"""The worked example in docs/signed-requests.md is what the code produces and accepts."""

from __future__ import annotations

import re
from pathlib import Path

from intellect.identity import Wallet
from intellect.signing import body_digest, canonical_string, sign_request, verify_signed_request

DOC = Path(__file__).resolve().parents[2] / "docs" / "signed-requests.md"
BODY = b'{"metrics":{"tokens_per_s":123.5}}'
TS, NONCE, TARGET = 1767225600, "0123456789abcdef0123456789abcdef", "/heartbeat?pool=1"


def test_worked_example_matches_code():
    text = DOC.read_text()
    wallet = Wallet.from_key("0x" + "11" * 32)
    headers = sign_request(wallet, "POST", TARGET, BODY, timestamp=TS, nonce=NONCE)
    assert body_digest(BODY) in text
    assert canonical_string("POST", TARGET, BODY, TS, NONCE) in text
    for name, value in headers.items():
        assert f"{name}: {value}" in text, name
    signed = verify_signed_request("POST", TARGET, BODY, headers, now=TS + 1)
    assert signed.address == wallet.address
    # the documented signature is 65 bytes of hex
    assert re.fullmatch(r"0x[0-9a-f]{130}", headers["X-Intellect-Signature"])
