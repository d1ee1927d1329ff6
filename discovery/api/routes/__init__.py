"""One module-level `router` per resource, included by `discovery.server.create_app`."""

from discovery.api.routes import health, nodes, pools

__all__ = ["health", "nodes", "pools"]
