"""Deploy every contract in order, wire the roles between them, and record the result in a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eth_abi import encode as abi_encode
from eth_typing import ChecksumAddress
from eth_utils import keccak, to_checksum_address
from pydantic import BaseModel, Field
from web3 import Web3

from intellect.identity import Wallet
from ledger.artifacts import abi, load_artifact
from ledger.errors import LedgerConfigError
from ledger.models import ONE_TOKEN
from ledger.tx import TxSender

DEPLOY_ORDER = ("IntellectToken", "ComputeRegistry", "DomainRegistry", "ComputePool")


class DeployParams(BaseModel):
    """Protocol settings fixed at deployment (the admin can change them later)."""

    stake_minimum: int = Field(10 * ONE_TOKEN, ge=0, description="stake per compute unit, base units")
    unbonding_period: int = Field(7 * 24 * 3600, ge=0, description="seconds")
    reward_per_unit: int = Field(ONE_TOKEN, ge=0, description="reward per accepted work unit, base units")
    reward_lock_period: int = Field(24 * 3600, ge=0, description="seconds rewards stay locked")
    invalidation_window: int = Field(24 * 3600, ge=0, description="seconds a validator may invalidate work")
    slash_penalty: int = Field(
        200 * ONE_TOKEN, ge=0, description="stake slashed per invalidation, base units"
    )
    whitelist_required: bool = False
    validators: list[str] = Field(default_factory=list, description="addresses granted VALIDATOR_ROLE")


class Deployment(BaseModel):
    chain_id: int
    block: int
    deployer: str
    addresses: dict[str, str]
    params: DeployParams = Field(default_factory=DeployParams)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Deployment:
        path = Path(path)
        if not path.exists():
            raise LedgerConfigError(
                f"no deployment file at {path}: run `intellect-pool deploy` or pass --deployment"
            )
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except (json.JSONDecodeError, ValueError) as exc:
            raise LedgerConfigError(f"{path} is not a deployment file: {exc}") from None

    def address(self, name: str) -> str:
        try:
            return self.addresses[name]
        except KeyError:
            raise LedgerConfigError(f"deployment has no {name} address") from None


def role(name: str) -> bytes:
    return keccak(text=name)


def _constructor_data(name: str, args: list[object]) -> str:
    art = load_artifact(name)
    ctor: dict[str, Any] = next((i for i in art["abi"] if i["type"] == "constructor"), {"inputs": []})
    types = [i["type"] for i in ctor["inputs"]]
    return art["bytecode"] + abi_encode(types, args).hex()


def deploy_all(
    rpc_url: str, deployer: Wallet, params: DeployParams | None = None, timeout: float = 60.0
) -> Deployment:
    params = params or DeployParams()
    w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": timeout}))
    chain_id = w3.eth.chain_id
    sender = TxSender(w3, deployer, chain_key=f"{chain_id}:{rpc_url}", timeout=timeout)
    admin = deployer.address

    blocks: list[int] = []

    def deploy(name: str, *args: object) -> ChecksumAddress:
        receipt = sender.send(None, _constructor_data(name, list(args)))
        blocks.append(int(receipt["blockNumber"]))
        return to_checksum_address(receipt["contractAddress"])

    token = deploy("IntellectToken", admin)
    registry = deploy("ComputeRegistry", admin, token, params.stake_minimum)
    domains = deploy("DomainRegistry", admin)
    pool = deploy("ComputePool", admin, token, registry, domains, params.reward_per_unit)
    first_block = blocks[0]  # event readers start here

    def call(name: str, address: ChecksumAddress, fn: str, *args: object) -> None:
        contract = w3.eth.contract(address=address, abi=abi(name))
        sender.send(address, contract.encode_abi(fn, list(args)))

    # Wiring: the pool records memberships and slashes in the registry, and mints rewards.
    call("ComputeRegistry", registry, "grantRole", role("POOL_ROLE"), pool)
    call("IntellectToken", token, "grantRole", role("MINTER_ROLE"), pool)
    defaults = DeployParams()
    if (params.reward_lock_period, params.invalidation_window, params.slash_penalty) != (
        defaults.reward_lock_period,
        defaults.invalidation_window,
        defaults.slash_penalty,
    ):
        call(
            "ComputePool",
            pool,
            "setParameters",
            params.reward_per_unit,
            params.reward_lock_period,
            params.invalidation_window,
            params.slash_penalty,
        )
    if params.unbonding_period != defaults.unbonding_period:
        call("ComputeRegistry", registry, "setUnbondingPeriod", params.unbonding_period)
    if params.whitelist_required:
        call("ComputePool", pool, "setWhitelistRequired", True)
    for validator in params.validators:
        call("ComputePool", pool, "grantRole", role("VALIDATOR_ROLE"), to_checksum_address(validator))
        call("ComputeRegistry", registry, "grantRole", role("VALIDATOR_ROLE"), to_checksum_address(validator))
    return Deployment(
        chain_id=chain_id,
        block=first_block,
        deployer=admin,
        addresses={
            "IntellectToken": token,
            "ComputeRegistry": registry,
            "DomainRegistry": domains,
            "ComputePool": pool,
        },
        params=params,
    )
