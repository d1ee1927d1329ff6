"""Topology configs. A name like "2x640GB" means groups of 2 nodes with >= 640 GB of GPU memory each.

Pools configure topologies explicitly (settings) or by name only, in which case the name is parsed.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

from intellect.wire.nodes import ComputeSpecs
from intellect.wire.requirements import PoolRequirements

NAME = re.compile(r"^(?P<size>\d+)x(?P<mem>\d+)(?P<unit>GB|MB)$", re.IGNORECASE)


class Topology(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    min_size: int = Field(ge=1)
    max_size: int = Field(ge=1)
    gpu_memory_mb_per_node: int = Field(default=0, ge=0, description="sum over the node's GPUs")
    requirements: PoolRequirements = Field(default_factory=PoolRequirements)

    @model_validator(mode="after")
    def _sizes(self) -> Topology:
        if self.min_size > self.max_size:
            raise ValueError(f"topology {self.name}: min_size {self.min_size} > max_size {self.max_size}")
        return self

    def mismatches(self, specs: ComputeSpecs) -> list[str]:
        problems = self.requirements.mismatches(specs)
        total = sum(g.count * g.memory_mb for g in specs.gpus)
        if total < self.gpu_memory_mb_per_node:
            problems.append(f"needs {self.gpu_memory_mb_per_node} MB of GPU memory, has {total}")
        return problems

    def fits(self, specs: ComputeSpecs) -> bool:
        return not self.mismatches(specs)


def parse_topology_name(name: str) -> Topology:
    """ "2x640GB" → exactly 2 nodes, each with >= 640 GB of GPU memory ("1x0GB": any single node)."""
    match = NAME.match(name.strip())
    if not match:
        raise ValueError(f"topology {name!r} is not of the form <nodes>x<memory>GB, e.g. 2x640GB")
    size = int(match["size"])
    if size < 1:
        raise ValueError(f"topology {name!r} needs at least one node")
    memory = int(match["mem"]) * (1024 if match["unit"].upper() == "GB" else 1)
    return Topology(name=name.strip(), min_size=size, max_size=size, gpu_memory_mb_per_node=memory)
