"""The allocations a daemon holds: one per pilot job in a batch system, from one or more sites.

A job runs inside one allocation (a parallel launch needs one batch job's nodes; a walltime belongs
to one allocation), so each allocation keeps the nodes its agents registered and its own end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pilot.config import AllocationSettings
from pilot.lrm.base import Allocation, AllocationState, LrmExecutor


@dataclass(slots=True, eq=False)
class Site:
    """A configured source of allocations and the LRM executor that talks to its batch system."""

    settings: AllocationSettings
    lrm: LrmExecutor

    @property
    def name(self) -> str:
        return self.settings.name

    def could_take(self, duration: float | None, needs: str | None) -> bool:
        """A new allocation of this site could run a job of this duration whose launcher needs ``needs``."""
        w = self.settings.walltime
        return (needs is None or needs == self.lrm.kind) and (w is None or duration is None or duration <= w)


@dataclass(slots=True, eq=False)
class PilotAllocation:
    """One allocation held by the daemon: ``a1``, ``a2``, ... in the order they were requested."""

    key: str
    site: Site
    allocation: Allocation
    #: Names of the nodes whose agents registered for it.
    nodes: set[str] = field(default_factory=set)
    #: The batch system ended it (or it never started): its nodes are gone.
    over: bool = False
    #: Its walltime margin is reached: running tasks were told to stop, nothing new starts there.
    closing: bool = False
    #: Released because it had nothing to run (``autoscale.idle_timeout``).
    released: bool = False
    #: Agents that did not register within ``pilot.agent_start_timeout``.
    missing_agents: str = ""
    #: Since when it has had nothing to run (monotonic), for idle release.
    idle_since: float | None = None
    #: Its cancel was sent to the batch system.
    cancelling: bool = False

    @property
    def suffix(self) -> str:
        """Added to its nodes' names: none for the first, so a single-allocation pilot names nodes as
        its batch system does."""
        return "" if self.key == "a1" else f"@{self.key}"

    @property
    def ready(self) -> bool:
        """Every agent registered once (``nodes`` only grows): it started, so its end is no failure to start."""
        return len(self.nodes) >= self.allocation.nodes

    @property
    def alive(self) -> bool:
        return not self.over and not self.released and not self.allocation.state.final

    @property
    def usable(self) -> bool:
        """New work may be placed on it."""
        return self.alive and not self.closing

    def end(self, *, earliest: bool = False) -> float | None:
        """When it ends. With ``earliest``, a bound before its start is known (the batch system's start
        time reaches us on a later poll): it cannot end before submission + walltime."""
        a = self.allocation
        if a.walltime is None:
            return None
        if a.started is None:
            return a.submitted + a.walltime if earliest else None
        return a.started + a.walltime

    def takes(self, duration: float | None, needs: str | None, *, now: float) -> bool:
        """A job of this duration, whose launcher needs batch system ``needs``, may start here (by the
        earliest end known)."""
        if needs is not None and self.site.lrm.kind != needs:
            return False
        end = self.end(earliest=True)
        return end is None or duration is None or now + duration <= end

    def to_status(self, *, registered: int) -> dict[str, Any]:
        st = self.allocation.to_status()
        st["name"] = self.key  # not "key": status redaction masks anything called a key
        st["site"] = self.site.name
        st["registered"] = registered
        if st["state"] == "active" and registered < self.allocation.nodes and not self.missing_agents and not self.over:
            st["state"] = "starting"  # the batch job runs; its agents are not all in yet
            st["message"] = st["message"] or f"{registered} of {self.allocation.nodes} agents registered"
        if self.missing_agents:
            st["message"] = "; ".join(m for m in (st["message"], self.missing_agents) if m)
        if self.released and not self.allocation.state.final:
            st["state"] = AllocationState.ENDING.value
        if self.released:
            st["message"] = st["message"] or "released: it had nothing to run (autoscale.idle_timeout)"
        return st


def node_allocation_key(name: str) -> str:
    """The allocation a node name belongs to: ``node1@a2`` to ``a2``, a plain name to the first."""
    _, at, key = name.rpartition("@")
    return key if at else "a1"


def fresh_key(held: dict[str, PilotAllocation]) -> str:
    return f"a{max((int(k[1:]) for k in held), default=0) + 1}"
