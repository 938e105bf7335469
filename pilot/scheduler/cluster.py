"""The matcher's picture of the allocation: each node as matching reads it (features, typed values,
consumable capacities) and the cluster of them, with a version that invalidates cached verdicts.

Load values pass: whether a job can *ever* run is judged on :func:`idle_cluster`, the nodes as they
would measure idle, so a node busy for a moment never gets a job refused at submit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pilot.model.node import NodeConfigured
from pilot.scheduler.attributes import (
    AttributeDefinition,
    AttributeRegistry,
    AttributeValues,
    Relop,
    Value,
    parse_load,
)

#: Load values that are a free share of a total: on an idle node the whole total is free.
IDLE_TOTALS: Final = {
    "mem_free": "mem_total",
    "swap_free": "swap_total",
    "virtual_free": "virtual_total",
    "free_proc": "num_proc",
}

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
        facts: dict[str, str | float | bool] = {"num_proc": len(node.processors), "mem_total": node.memory}
        facts["hostname"] = node.hostname or node.name
        if node.architecture:
            facts["arch"] = node.architecture
        if node.os:
            facts["opsys"] = node.os
        if node.clock_mhz > 0:  # 0: the agent could not read it (psutil has no cpu_freq in some containers)
            facts["clock_mhz"] = node.clock_mhz
        m.values.report_facts(registry, facts)
        m.configured = {"Processors": float(len(node.processors)), "Memory": float(node.memory)}
        if node.gpus:
            m.configured["Resource:GPU"] = float(len(node.gpus))
        for k, v in (consumables or {}).items():
            m.configured[k] = float(v)
        return m

    def report_load(self, registry: AttributeRegistry, values: Mapping[str, str | float | bool]) -> None:
        """A heartbeat's load values, plus ``free_proc``: the processors the last minute's load leaves
        free (JRDL minFreeCPU), ``num_proc x (1 - np_load_short)``."""
        self.values.report_parsed_load(self.parsed_load(registry, values))

    def parsed_load(self, registry: AttributeRegistry, values: Mapping[str, str | float | bool]) -> dict[str, Value]:
        """What :meth:`report_load` keeps of ``values``: the same for every node of one machine with as
        many processors (``num_proc``)."""
        load = values.get("np_load_short")
        n = self.values.facts.get("num_proc")
        if isinstance(load, int | float) and isinstance(n, int | float) and not isinstance(load, bool):
            values = {**values, "free_proc": max(0.0, float(n) * (1.0 - float(load)))}
        return parse_load(registry, values)


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

    @property
    def forced(self) -> list[AttributeDefinition]:
        """The attributes a job must request to run where they are offered (requestable = FORCED)."""
        return self.registry.forced

    def offers_attribute(self, name: str, node: MatchNode) -> bool:
        """Whether ``node`` (or the allocation as a whole) is configured with attribute ``name``: a
        fixed value or a consumable capacity (typed ones, ``name:type``, count as ``name``)."""
        if name in self.global_values.fixed or name in node.values.fixed:
            return True
        keys = (*self.global_capacity, *node.configured)
        return any(k.startswith("Resource:") and attribute_name(self.registry, k) == name for k in keys)


def consumable_definition(registry: AttributeRegistry, key: str) -> AttributeDefinition | None:
    """The attribute a consumable key stands for: ``Resource:License:ESSL2`` is attribute
    ``License:ESSL2`` when one is defined so, else ``License`` (a typed resource of it)."""
    name = key.removeprefix("Resource:")
    d = registry.get(name)
    if d is None and ":" in name:
        d = registry.get(name.split(":", 1)[0])
    return d


def attribute_name(registry: AttributeRegistry, key: str) -> str:
    """The name of the attribute ``key`` stands for (its own name when none is defined)."""
    d = consumable_definition(registry, key)
    return d.name if d is not None else key.removeprefix("Resource:")


def idle_cluster(cluster: Cluster) -> Cluster:
    """The cluster with every node's load values as an idle node would measure them: a share that is
    free is the whole total, a load or amount in use is 0; a load value with no known bound (disk_free)
    stays as measured. Fixed values from the config still hold (they only restrict)."""
    registry = cluster.registry
    nodes: dict[str, MatchNode] = {}
    for name, node in cluster.nodes.items():
        v = node.values
        measured = {**v.load, **v.facts}
        load: dict[str, Value] = {}
        for key, value in v.load.items():
            d = registry.get(key)
            load[key] = 0.0 if d is not None and d.type.numeric and d.relop in (Relop.GE, Relop.GT) else value
        for key, of in IDLE_TOTALS.items():  # even one not measured yet: its total is known
            total = measured.get(of)
            if total is not None and not isinstance(total, bool | str):
                load[key] = total
        idle = AttributeValues(fixed=dict(v.fixed), load=load, facts=dict(v.facts))
        nodes[name] = MatchNode(node.name, node.hostname, node.features, idle, dict(node.configured))
    return Cluster(registry, cluster.global_values, dict(cluster.global_capacity), dict(cluster.context), nodes)
