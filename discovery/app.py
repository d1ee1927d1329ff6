"""Kept for existing imports (`from discovery.app import create_app`): the service is assembled in
`discovery.server`, its routes are in `discovery.api.routes`."""

from discovery.api.deps import Caller
from discovery.server import create_app, ledger_chain_view, lifespan

__all__ = ["Caller", "create_app", "ledger_chain_view", "lifespan"]
