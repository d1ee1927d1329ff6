import json
import os
import stat

import pytest

from intellect.identity import IdentityError, Wallet, recover_message, verify_message


def test_sign_and_verify_round_trip() -> None:
    wallet = Wallet.create()
    signature = wallet.sign_message("hello")
    assert signature.startswith("0x") and len(signature) == 132
    assert recover_message("hello", signature) == wallet.address
    assert verify_message("hello", signature, wallet.address)
    assert not verify_message("hello!", signature, wallet.address)
    assert not verify_message("hello", signature, Wallet.create().address)


def test_known_key_gives_known_address_and_signature() -> None:
    # anvil's first dev key; the address and signature are fixed by secp256k1 + EIP-191.
    wallet = Wallet.from_key("0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80")
    assert wallet.address == "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    assert verify_message("intellect", wallet.sign_message("intellect"), wallet.address)


def test_keystore_is_encrypted_private_and_round_trips(tmp_path) -> None:
    wallet = Wallet.create()
    path = wallet.save(tmp_path / "keys" / "node.json", "correct horse")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = path.read_text()
    assert wallet.private_key_hex()[2:] not in text
    assert json.loads(text)["crypto"]["kdf"] == "scrypt"
    assert Wallet.load(path, "correct horse").address == wallet.address
    with pytest.raises(IdentityError, match="wrong passphrase"):
        Wallet.load(path, "wrong")


def test_keystore_passphrase_from_environment(tmp_path, monkeypatch) -> None:
    wallet = Wallet.create()
    path = wallet.save(tmp_path / "k.json", "from-env")
    monkeypatch.setenv("INTELLECT_KEYSTORE_PASSPHRASE", "from-env")
    assert Wallet.load(path).address == wallet.address


def test_missing_keystore_names_the_fix(tmp_path) -> None:
    with pytest.raises(IdentityError, match="no keystore"):
        Wallet.load(tmp_path / "absent.json", "x")


def test_repr_never_shows_the_key() -> None:
    wallet = Wallet.create()
    assert wallet.private_key_hex()[2:] not in repr(wallet)
    assert wallet.private_key_hex()[2:] not in str(wallet)


def test_bad_private_key_is_a_clear_error() -> None:
    with pytest.raises(IdentityError, match="32 bytes"):
        Wallet.from_key("0x1234")


def test_a_key_one_hex_digit_short_is_refused_not_padded_into_another_key() -> None:
    """eth-account zero-pads a 63-digit hex key: a typo would silently become a different account."""
    from intellect.identity import IdentityError, Wallet

    good = "0x" + "ab" * 32
    assert Wallet.from_key(good).address == Wallet.from_key(good[2:]).address
    for bad in (good[:-1], good + "c", "0x"):
        with pytest.raises(IdentityError, match="64 hex digits"):
            Wallet.from_key(bad)
