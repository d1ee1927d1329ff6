"""SQL writers of the orchestrator: every write of its database goes through one of these, one per table
family, each the only writer of its tables (and each adds its changes' audit rows, `nodes.audit`):

  nodes.py        NodeBook          `nodes` (and the Redis mirror of their states)
  tasks.py        TaskStore         `tasks`
  assignments.py  AssignmentStore   `assignments` (what each node reports of each task)
  uploads.py      UploadStore       `uploads`, `file_counters`
  groups.py       form/dissolve/assign_group   `node_groups`, `group_members` (in the keeper's pass)
  hardware.py     HardwareBook      `hardware_proofs`
  round_trips.py  RoundTripBook     `round_trips`

Why: before this package the task rows were written inside route closures, so nothing but a full app
with Redis and a chain could exercise them. A store takes a session factory (or, inside a pass that
must be one transaction, the session) and nothing else, so a test or a loop can use it against a bare
SQLite database. Reads that build plans or groups stay with their readers, inside their own sessions.
"""

from orchestrator.store.assignments import AssignmentStore
from orchestrator.store.nodes import NodeBook, audit, may_heartbeat, to_record
from orchestrator.store.tasks import TaskNotFound, TaskStore
from orchestrator.store.uploads import UploadStore

__all__ = ["AssignmentStore", "NodeBook", "TaskNotFound", "TaskStore", "UploadStore", "audit",
           "may_heartbeat", "to_record"]
