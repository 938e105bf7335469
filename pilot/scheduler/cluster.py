"""The matcher's picture of the allocation: each node as matching reads it (features, typed values,
consumable capacities) and the cluster of them, with a version that invalidates cached verdicts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pilot.model.node import NodeConfigured
from pilot.scheduler.attributes import (
    AttributeRegistry,
    AttributeValues,
)

# -- nodes and the cluster ------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class MatchNode:
    """What matching reads of one node. Call :meth:`Cluster.touch` after changing it."""

    name: str
    hostname: str = ""
    features: frozenset[str] = frozenset()
    values: AttributeValues = field(default_factory=AttributeValues)
    configured: dict[str, float] = field(default_factory=dict)  # consumable capacities
    revision: int = 0

    @property
    def version(self) -> tuple[int, int]:
        return (self.revision, self.values.version)

    @classmethod
    def from_configured(
        cls,
        node: NodeConfigured,
        registry: AttributeRegistry,
        *,
        fixed: Mapping[str, str | float | bool] | None = None,
        consumables: Mapping[str, float] | None = None,
    ) -> MatchNode:
        """A node as an agent registered it, with the site's fixed values and extra consumables."""
        m = cls(node.name, node.hostname, frozenset(node.features))
        m.values.set_fixed(registry, dict(fixed or {}), level=f"node {node.name!r}")
        load: dict[str, str | float | bool] = {"num_proc": len(node.processors), "mem_total": node.memory}
        load["hostname"] = node.hostname or node.name
        if node.architecture:
            load["arch"] = node.architecture
        if node.os:
            load["opsys"] = node.os
        m.values.report_load(registry, load)
        m.configured = {"Processors": float(len(node.processors)), "Memory": float(node.memory)}
        if node.gpus:
            m.configured["Resource:GPU"] = float(len(node.gpus))
        for k, v in (consumables or {}).items():
            m.configured[k] = float(v)
        return m


@dataclass(slots=True)
class Cluster:
    """The matcher's picture of the allocation: nodes, global values and global consumables."""

    registry: AttributeRegistry = field(default_factory=AttributeRegistry)
    global_values: AttributeValues = field(default_factory=AttributeValues)
    global_capacity: dict[str, float] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)  # Machine, Queue, User, Project, ...
    nodes: dict[str, MatchNode] = field(default_factory=dict)
    epoch: int = 0

    def add(self, node: MatchNode) -> None:
        self.nodes[node.name] = node
        self.touch()

    def remove(self, name: str) -> None:
        if self.nodes.pop(name, None) is not None:
            self.touch()

    def touch(self, node: MatchNode | None = None) -> None:
        """Something changed (a node's values, or the node set): cached verdicts are re-checked."""
        if node is not None:
            node.revision += 1
        self.epoch += 1

    def offers(self, key: str) -> bool:
        return key in self.global_capacity or any(key in n.configured for n in self.nodes.values())
