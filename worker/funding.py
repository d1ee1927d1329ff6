"""What `intellect-worker check` says about money, so that a green check means `start` will work: the
provider's ETH for gas, its tokens against the stake the registry asks, and its standing (registered,
whitelisted). The provider address comes from the raw key setting or the keystore file's plain
`address` field: no passphrase is asked for a check.
"""

from __future__ import annotations

import json

from intellect.identity import Wallet
from ledger.client import LedgerClient
from worker.hardware import Check
from worker.keys import keystore_path
from worker.settings import WorkerSettings

# Registration, adding the node and joining a pool take three transactions; 0.01 ETH pays for them
# many times over on any chain this runs on today.
MIN_GAS_WEI = 10**16


def provider_address(settings: WorkerSettings) -> str | None:
    if settings.provider_key is not None:
        return Wallet.from_key(settings.provider_key.get_secret_value()).address
    path = keystore_path(settings, "provider")
    try:
        raw = json.loads(path.read_text()).get("address")
    except (OSError, ValueError):
        return None
    return ("0x" + raw.removeprefix("0x")) if isinstance(raw, str) and raw else None


def funding_checks(client: LedgerClient, address: str, stake: int | None) -> list[Check]:
    """Gas, stake and standing of `address`; `stake`: what `start --stake` will lock (None: the minimum)."""
    provider = client.get_provider(address)
    eth = client.w3.eth.get_balance(client.w3.to_checksum_address(address))
    tokens = client.balance_of(address)
    minimum = client.stake_minimum()
    fund = f"on a devnet: `intellect devnet fund {address}`"
    checks = []
    if provider.registered:
        staked = provider.stake / 10**18
        checks.append(Check("provider", True, f"{address} registered, stake {staked:g} tokens"))
    else:
        checks.append(Check("provider", True, f"{address} not registered yet: `start` registers it",
                            blocking=False))
    needs_gas = not provider.registered or provider.node_count == 0
    gas = f"{eth / 10**18:.4f} ETH"
    if eth < MIN_GAS_WEI:
        gas += f"; registering needs at least {MIN_GAS_WEI / 10**18:g} ETH for gas ({fund})"
    checks.append(Check("gas", eth >= MIN_GAS_WEI or not needs_gas, gas, blocking=needs_gas))
    if not provider.registered:
        want = max(stake or 0, minimum)
        checks.append(Check(
            "stake", tokens >= want,
            f"{tokens / 10**18:g} tokens; the registry asks a stake of {want / 10**18:g}"
            + ("" if tokens >= want else f" (get tokens from the pool owner; {fund})"),
        ))
    checks.append(Check(
        "whitelist", provider.whitelisted,
        "whitelisted" if provider.whitelisted else
        "not whitelisted: pools that require it refuse this provider's nodes until the owner runs "
        f"`intellect-pool whitelist-provider {address}`",
        blocking=False,
    ))
    return checks
