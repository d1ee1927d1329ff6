"""Moved to `orchestrator.store.nodes`; re-exported so existing imports keep working."""

from orchestrator.store.nodes import NodeBook, audit, may_heartbeat, to_record

__all__ = ["NodeBook", "audit", "may_heartbeat", "to_record"]
