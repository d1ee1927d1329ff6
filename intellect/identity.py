"""Wallets: create, save and load as encrypted JSON keystores, sign and verify EIP-191 messages.

Private keys never appear in logs or reprs; `Wallet.private_key_hex()` is the one explicit way out.
"""

from __future__ import annotations

import getpass
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import coincurve
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

PASSPHRASE_ENV = "INTELLECT_KEYSTORE_PASSPHRASE"


class IdentityError(Exception):
    """A keystore or signature problem, with a message that names what to fix."""


@dataclass(frozen=True)
class Wallet:
    """A local signing key. The repr shows only the address."""

    account: LocalAccount = field(repr=False)

    @property
    def address(self) -> str:
        return self.account.address

    @classmethod
    def create(cls) -> Wallet:
        return cls(Account.create())

    @classmethod
    def from_key(cls, private_key: str | bytes) -> Wallet:
        if isinstance(private_key, str):
            digits = private_key.strip().removeprefix("0x").removeprefix("0X")
            if len(digits) != 64:
                # eth-account pads a short hex string: 63 digits would silently become another key
                raise IdentityError(
                    f"not a valid private key: expected 32 bytes (64 hex digits), got {len(digits)} digits"
                )
        try:
            return cls(Account.from_key(private_key))
        except (ValueError, TypeError):
            raise IdentityError("not a valid private key: expected 32 bytes of hex") from None

    def private_key_hex(self) -> str:
        """The raw key, for a user who explicitly asked to export it."""
        return "0x" + bytes(self.account.key).hex()

    def sign_message(self, message: str | bytes) -> str:
        """EIP-191 personal_sign; returns 0x-prefixed hex of the 65-byte signature."""
        data = message.encode() if isinstance(message, str) else message
        signed = self.account.sign_message(encode_defunct(primitive=data))
        return "0x" + bytes(signed.signature).hex()

    def sign_hash(self, digest: bytes) -> str:
        """EIP-191 over a 32-byte digest (what Solidity's toEthSignedMessageHash checks)."""
        if len(digest) != 32:
            raise IdentityError("sign_hash takes a 32-byte digest")
        return self.sign_message(digest)

    def save(self, path: str | Path, passphrase: str) -> Path:
        """Write an encrypted keystore (scrypt, v3 JSON) with file mode 0600."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = json.dumps(Account.encrypt(self.account.key, passphrase))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(blob)
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
        return path

    @classmethod
    def load(cls, path: str | Path, passphrase: str | None = None) -> Wallet:
        """Read a keystore; the passphrase comes from the argument, the environment, or a prompt."""
        path = Path(path)
        if not path.exists():
            raise IdentityError(f"no keystore at {path}: create one with `intellect-worker wallet create`")
        if passphrase is None:
            passphrase = resolve_passphrase(f"Passphrase for {path.name}: ")
        try:
            key = Account.decrypt(json.loads(path.read_text()), passphrase)
        except ValueError:
            raise IdentityError(f"wrong passphrase for keystore {path}") from None
        except json.JSONDecodeError:
            raise IdentityError(f"{path} is not a JSON keystore") from None
        return cls(Account.from_key(key))


def resolve_passphrase(prompt: str = "Keystore passphrase: ") -> str:
    env = os.environ.get(PASSPHRASE_ENV)
    if env is not None:
        return env
    try:
        return getpass.getpass(prompt)
    except (EOFError, OSError):
        raise IdentityError(f"no passphrase: set {PASSPHRASE_ENV} or run interactively") from None


try:  # eth-hash's C backend (safe-pysha3): the same hash, ~2.6 us a call against ~19 us through pycryptodome
    from eth_hash.backends.pysha3 import backend as _keccak_backend
    from eth_hash.main import Keccak256

    keccak = Keccak256(_keccak_backend)
except ImportError:  # pragma: no cover - the lock installs it; eth-hash's default backend otherwise
    from eth_hash.auto import keccak

_EIP191_PREFIX = b"\x19Ethereum Signed Message:\n"
_STANDARD_V = {27: 0, 28: 1, 0: 0, 1: 1}


def eip191_hash(data: bytes) -> bytes:
    """keccak256 of the EIP-191 personal_sign envelope (what `personal_sign` signs)."""
    return keccak(_EIP191_PREFIX + str(len(data)).encode() + data)


def recover_address_bytes(message: str | bytes, signature: str | bytes) -> bytes:
    """The 20 raw address bytes that signed `message` with EIP-191 (servers' hot path).

    Canonical signatures (65 bytes, or 0x + 130 hex characters, v in 0, 1, 27, 28) go straight to
    libsecp256k1 through coincurve: the same call eth-keys' coincurve backend makes, without its
    object layers and checksum encoding. Anything else takes eth-account's own path, so every input,
    odd ones included (e.g. EIP-155 style v >= 35), gets exactly eth-account's answer.
    """
    data = message.encode() if isinstance(message, str) else message
    raw: bytes | None = None
    if isinstance(signature, str):
        if len(signature) == 132 and signature.startswith("0x"):
            try:
                raw = bytes.fromhex(signature[2:])
            except ValueError:
                raw = None
    elif isinstance(signature, bytes | bytearray) and len(signature) == 65:
        raw = bytes(signature)
    v = _STANDARD_V.get(raw[64]) if raw is not None and len(raw) == 65 else None
    if raw is None or v is None:
        try:
            address = Account.recover_message(encode_defunct(primitive=data), signature=signature)
        except Exception:
            raise IdentityError("malformed signature") from None
        return bytes.fromhex(address[2:])
    try:  # rejects r or s out of range, or a point that does not recover, as eth-keys does
        public = coincurve.PublicKey.from_signature_and_message(raw[:64] + bytes((v,)), eip191_hash(data),
                                                                hasher=None)
    except Exception:
        raise IdentityError("malformed signature") from None
    return keccak(public.format(compressed=False)[1:])[-20:]


def recover_message(message: str | bytes, signature: str | bytes) -> str:
    """The checksummed address that signed `message` with EIP-191."""
    return to_checksum_address(recover_address_bytes(message, signature))


def verify_message(message: str | bytes, signature: str | bytes, address: str) -> bool:
    try:
        return recover_message(message, signature) == to_checksum_address(address)
    except (IdentityError, ValueError):
        return False
