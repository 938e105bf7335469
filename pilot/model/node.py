"""A node as an agent reports it: the SSS Node object's Configured category."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pilot import wire


@dataclass(slots=True)
class NodeConfigured:
    """What a node offers. ``processors`` are the cpu ids the agent may pin tasks to."""

    name: str
    hostname: str
    processors: list[int]
    memory: int  # bytes
    gpus: list[int] = field(default_factory=list)
    os: str = ""
    architecture: str = ""
    features: list[str] = field(default_factory=list)
    clock_mhz: float = 0.0  # the processor clock; 0: not known (no cpufreq in some containers)

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hostname": self.hostname,
            "processors": self.processors,
            "memory": self.memory,
            "gpus": self.gpus,
            "os": self.os,
            "architecture": self.architecture,
            "features": self.features,
            "clock_mhz": self.clock_mhz,
        }

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> NodeConfigured:
        node = cls(
            name=wire.field(body, "name", str),
            hostname=wire.field(body, "hostname", str),
            processors=wire.int_list(body, "processors"),
            memory=wire.field(body, "memory", int),
            gpus=wire.int_list(body, "gpus"),
            os=wire.field(body, "os", str),
            architecture=wire.field(body, "architecture", str),
            features=wire.str_list(body, "features"),
            clock_mhz=float(wire.opt_field(body, "clock_mhz", (int, float), 0.0)),
        )
        if not node.name or len(node.name) > 255:
            raise wire.ProtocolError("node name must be 1 to 255 characters")
        if not node.processors:
            raise wire.ProtocolError(f"node {node.name!r} reports no processors")
        if len(set(node.processors)) != len(node.processors) or min(node.processors) < 0:
            raise wire.ProtocolError(f"node {node.name!r} reports duplicate or negative processor ids")
        if len(set(node.gpus)) != len(node.gpus) or min(node.gpus, default=0) < 0:
            raise wire.ProtocolError(f"node {node.name!r} reports duplicate or negative GPU ids")
        if not 0 <= node.clock_mhz < 1e7:  # NaN fails too
            raise wire.ProtocolError(f"node {node.name!r} reports a processor clock of {node.clock_mhz} MHz")
        if node.memory < 0:
            raise wire.ProtocolError(f"node {node.name!r} reports negative memory")
        return node
