"""Kept for existing imports (`from orchestrator.app import create_app`): the service is assembled in
`orchestrator.server`, its routes are in `orchestrator.api.routes`."""

from orchestrator.server import create_app, ledger_pool_chain, lifespan, load_manager

__all__ = ["create_app", "ledger_pool_chain", "lifespan", "load_manager"]
