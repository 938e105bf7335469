"""The SSS node object (``../shared/specs/sss-node-object-3.1.txt``): a node's Configured, Available
and Utilized resources, built from what the agent reports and what the scheduler holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from pilot.model.node import NodeConfigured
from pilot.model.sss.job import Property, amount

CATEGORIES: Final = ("Configured", "Available", "Utilized")
MiB: Final = 2**20


@dataclass(slots=True)
class NodeObject:
    """An SSS Node: uncategorized properties (Id, Name, Opsys, Arch, Feature, ...) and the three categories."""

    properties: list[Property] = field(default_factory=list)
    configured: list[Property] | None = None
    available: list[Property] | None = None
    utilized: list[Property] | None = None
    line: int | None = field(default=None, compare=False)

    def text(self, name: str) -> str | None:
        for p in self.properties:
            if p.name == name:
                return p.value
        return None

    @property
    def id(self) -> str | None:
        return self.text("Id")

    @property
    def features(self) -> list[str]:
        """Every Feature, whether repeated (the spec's example) or comma-delimited (its table)."""
        out: list[str] = []
        for p in self.properties:
            if p.name == "Feature":
                out += [f.strip() for f in p.value.split(",") if f.strip()]
        return out

    def category(self, name: str) -> list[Property]:
        return {"Configured": self.configured, "Available": self.available, "Utilized": self.utilized}[name] or []

    def amount(self, category: str, name: str, resource: str | None = None) -> float | None:
        """A consumable of a category in base units (bytes for memory-like), or None when absent."""
        for p in self.category(category):
            if p.name == name and (resource is None or p.get("name") == resource):
                return amount(p)
        return None


def _mb(n: float) -> str:
    v = n / MiB
    return str(int(v)) if float(v).is_integer() else repr(v)


def node_object(
    node: NodeConfigured,
    *,
    state: str | None = None,
    description: str | None = None,
    free_processors: int | None = None,
    free_gpus: int | None = None,
    free_memory: int | None = None,
    utilized: Mapping[str, float] | None = None,
    resources: Mapping[str, tuple[float, float]] | None = None,
    attributes: Mapping[str, str | float | bool] | None = None,
    features: Sequence[str] | None = None,
) -> NodeObject:
    """The SSS Node of one agent's node.

    ``free_*`` are what the scheduler holds unallocated (Available); ``utilized`` what the agent
    measured with psutil (keys ``processors`` busy cores, ``memory``/``swap``/``disk`` bytes used,
    ``wall_duration`` seconds the measure covers); ``resources`` other consumables (name or
    ``name:type`` -> (capacity, free), or Disk/Swap/Network in bytes); ``attributes`` the typed
    attribute values (load values and site values) as Extensions.
    """
    props = [Property.of("Id", node.name)]
    if node.hostname and node.hostname != node.name:
        props.append(Property.of("Name", node.hostname))
    if node.os:
        props.append(Property.of("Opsys", node.os))
    if node.architecture:
        props.append(Property.of("Arch", node.architecture))
    if description:
        props.append(Property.of("Description", description))
    if state:
        props.append(Property.of("State", state))
    for f in features if features is not None else node.features:
        props.append(Property.of("Feature", f))
    for name, value in sorted((attributes or {}).items()):
        props.append(Property.of("Extension", value, name=name, type="Attribute"))
    configured = [
        Property.of("Processors", len(node.processors)),
        Property.of("Memory", _mb(node.memory), units="MB"),
    ]
    if node.gpus:
        configured.append(Property.of("Resource", len(node.gpus), name="GPU"))
    available: list[Property] = []
    if free_processors is not None:
        available.append(Property.of("Processors", free_processors))
    if free_memory is not None:
        available.append(Property.of("Memory", _mb(free_memory), units="MB"))
    if free_gpus is not None and node.gpus:
        available.append(Property.of("Resource", free_gpus, name="GPU"))
    for name, (cap, free) in sorted((resources or {}).items()):
        if name in ("Disk", "Swap", "Network"):  # the Node object's own sized consumables
            configured.append(Property.of(name, _mb(cap), units="MB"))
            available.append(Property.of(name, _mb(free), units="MB"))
            continue
        base, _, kind = name.partition(":")  # a typed resource: name:type
        configured.append(Property.of("Resource", cap, name=base, type=kind or None))
        available.append(Property.of("Resource", free, name=base, type=kind or None))
    used: list[Property] | None = None
    if utilized is not None:
        wall = utilized.get("wall_duration")
        used = []
        if "processors" in utilized:
            used.append(Property.of("Processors", utilized["processors"], wallDuration=wall))
        for key, tag in (("memory", "Memory"), ("swap", "Swap"), ("disk", "Disk")):
            if key in utilized:
                used.append(Property.of(tag, _mb(utilized[key]), units="MB", metric="Instantaneous"))
    return NodeObject(props, configured, available or None, used)
