"""Node groups: topologies (e.g. "2x640GB"), forming groups from healthy nodes, dissolving, merging.

`formation`/`topology` are pure; `reconcile` keeps the groups in SQL; `scheduler` turns them into the
per-node Plan the heartbeat hands out and runs the reconcile loop.
"""

from orchestrator.groups.formation import Candidate, ProposedGroup, form_groups, merge_candidates
from orchestrator.groups.topology import Topology, parse_topology_name

__all__ = ["Candidate", "ProposedGroup", "Topology", "form_groups", "merge_candidates", "parse_topology_name"]
