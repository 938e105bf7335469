"""What the site config says about the allocation, as SSS matching sees it: the attribute registry,
the allocation-wide (global) values and consumables, and each node's features, values and
consumables (``[global]`` and ``[nodes."<pattern>"]`` in the pilot config)."""

from __future__ import annotations

import getpass
import socket

from pilot.config import SIZED_CONSUMABLES, Config
from pilot.model.node import NodeConfigured
from pilot.scheduler.attributes import AttributeRegistry
from pilot.scheduler.cluster import Cluster, MatchNode


def resource_key(name: str) -> str:
    """A consumable's key in matching and ledgers: an SSS ``<Resource name=... [type=...]>``
    (``name:type`` in the config), or SSS's own ``Disk``, ``Swap``, ``Network``."""
    return name if name in SIZED_CONSUMABLES else "Resource:" + name


def cluster(config: Config, *, lrm_kind: str) -> Cluster:
    registry = AttributeRegistry.from_config(config.attributes, source=config.source)  # checked at load
    g = config.global_level
    c = Cluster(registry=registry)
    c.global_values.set_fixed(registry, g.attributes, level="[global]")
    c.global_capacity = {resource_key(k): v for k, v in g.consumables.items()}
    options = config.allocation.options
    context = {"User": getpass.getuser(), "Machine": socket.gethostname(), "ResourceManagerType": lrm_kind}
    for key, name in (("partition", "Queue"), ("queue", "Queue"), ("account", "Account"), ("project", "Project")):
        if isinstance(options.get(key), str):
            context[name] = options[key]
    context.update(g.context)
    c.context = context
    return c


def match_node(config: Config, registry: AttributeRegistry, node: NodeConfigured) -> MatchNode:
    """A registered node as matching sees it: what its agent reported plus what the config gives it."""
    level = config.node_level(node.name)
    m = MatchNode.from_configured(
        node,
        registry,
        fixed=level.attributes,
        consumables={resource_key(k): v for k, v in level.consumables.items()},
    )
    m.features = frozenset(node.features) | frozenset(level.features)
    return m


def node_capacity(config: Config, node: str) -> dict[str, float]:
    """The node's own consumables (other than cores, GPUs and memory, which NodeSlots hold)."""
    return {resource_key(k): v for k, v in config.node_level(node).consumables.items()}
