"""One module-level `router` per resource, included by `orchestrator.server.create_app` in this order
(the order only matters for the OpenAPI document: no two routes overlap)."""

from orchestrator.api.routes import admin, health, heartbeat, nodes, storage, tasks

__all__ = ["admin", "health", "heartbeat", "nodes", "storage", "tasks"]
