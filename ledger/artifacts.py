"""Compiled contract artifacts (committed under contracts/artifacts) and custom-error decoding."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import keccak, to_checksum_address

from intellect.settings import PROJECT_ROOT

ARTIFACTS_DIR = PROJECT_ROOT / "contracts" / "artifacts"
CONTRACTS = ("IntellectToken", "ComputeRegistry", "DomainRegistry", "ComputePool")


@cache
def load_artifact(name: str) -> dict[str, Any]:
    path = Path(ARTIFACTS_DIR) / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no artifact {path}: run `make compile`")
    return json.loads(path.read_text())


def abi(name: str) -> list[dict[str, Any]]:
    return load_artifact(name)["abi"]


def event_topics(name: str) -> dict[bytes, str]:
    """topic0 -> event name over one contract's events: how receipts and log readers tell them apart."""
    topics: dict[bytes, str] = {}
    for item in abi(name):
        if item.get("type") == "event":
            signature = f"{item['name']}({','.join(i['type'] for i in item['inputs'])})"
            topics[keccak(text=signature)] = item["name"]
    return topics


def _signature_types(inputs: list[dict[str, Any]]) -> list[str]:
    out = []
    for item in inputs:
        t = item["type"]
        if t.startswith("tuple"):
            t = "(" + ",".join(_signature_types(item["components"])) + ")" + t[len("tuple") :]
        out.append(t)
    return out


@cache
def error_table() -> dict[bytes, tuple[str, list[str], list[str]]]:
    """selector -> (error name, argument names, argument types) over every contract's ABI."""
    table: dict[bytes, tuple[str, list[str], list[str]]] = {
        keccak(text="Error(string)")[:4]: ("Error", ["message"], ["string"]),
        keccak(text="Panic(uint256)")[:4]: ("Panic", ["code"], ["uint256"]),
    }
    for name in CONTRACTS:
        for item in abi(name):
            if item.get("type") != "error":
                continue
            types = _signature_types(item["inputs"])
            selector = keccak(text=f"{item['name']}({','.join(types)})")[:4]
            table[selector] = (
                item["name"],
                [i["name"] or f"arg{n}" for n, i in enumerate(item["inputs"])],
                types,
            )
    return table


def decode_error(data: str | bytes | None) -> tuple[str, dict[str, Any]] | None:
    """Decode revert data into (error name, args); None when it is not a known error."""
    if data is None:
        return None
    if isinstance(data, str):
        text = data[2:] if data.startswith("0x") else data
        try:
            data = bytes.fromhex(text)
        except ValueError:
            return None
    if len(data) < 4:
        return None
    entry = error_table().get(bytes(data[:4]))
    if entry is None:
        return None
    name, names, types = entry
    try:
        values = abi_decode(types, bytes(data[4:]))
    except Exception:
        return name, {}
    return name, {k: _normalise(t, v) for k, t, v in zip(names, types, values, strict=True)}


def _normalise(abi_type: str, value: Any) -> Any:
    if abi_type == "address":
        return to_checksum_address(value)
    if abi_type.startswith("bytes") and isinstance(value, bytes):
        return "0x" + value.hex()
    return value
