"""Node groups: topologies (e.g. "2x640GB"), forming groups from healthy nodes, dissolving, merging."""

from orchestrator.groups.formation import Candidate, ProposedGroup, form_groups, merge_candidates
from orchestrator.groups.topology import Topology, parse_topology_name

__all__ = ["Candidate", "ProposedGroup", "Topology", "form_groups", "merge_candidates", "parse_topology_name"]
