"""SQL writers of the orchestrator, one per table family.

Why: before this package the task rows were written inside route closures, so nothing but a full app
with Redis and a chain could exercise them. A store takes a session factory and nothing else, so a
test (or a loop) can use it against a bare SQLite database.
"""

from orchestrator.store.nodes import NodeBook, audit, may_heartbeat, to_record
from orchestrator.store.tasks import TaskNotFound, TaskStore

__all__ = ["NodeBook", "TaskNotFound", "TaskStore", "audit", "may_heartbeat", "to_record"]
