"""The allocations a daemon holds: one per pilot job in a batch system, from one or more sites.

A job runs inside one allocation (a parallel launch needs one batch job's nodes; a walltime belongs
to one allocation), so each allocation keeps the nodes its agents registered and its own end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from pilot.config import AllocationSettings, AutoscaleSettings
from pilot.lrm.base import Allocation, AllocationState, LrmExecutor
from pilot.model.job_description import JobDescription

log = structlog.get_logger("pilot.allocations")


#: PSI/J job fields that name where a job may run, matched against a site's options (``job_fields``).
SITE_FIELDS: Final = ("queue_name", "project_name", "reservation_id")


def site_fields(description: JobDescription) -> list[tuple[str, str]]:
    """The (field, value) pairs of :data:`SITE_FIELDS` a job sets: none for most jobs."""
    return [(f, v) for f in SITE_FIELDS if (v := getattr(description, f)) is not None]


@dataclass(slots=True, eq=False)
class Site:
    """A configured source of allocations and the LRM executor that talks to its batch system."""

    settings: AllocationSettings
    lrm: LrmExecutor

    @property
    def name(self) -> str:
        return self.settings.name

    def serves(self, fields: list[tuple[str, str]]) -> bool:
        """Its allocations have every one of these job fields' values (queue, project, reservation)."""
        return all(self.lrm.offers(f) == v for f, v in fields)

    def could_take(self, duration: float | None, needs: str | None) -> bool:
        """A new allocation of this site could run a job of this duration whose launcher needs ``needs``."""
        w = self.settings.walltime
        return (needs is None or needs == self.lrm.kind) and (w is None or duration is None or duration <= w)


@dataclass(slots=True, eq=False)
class PilotAllocation:
    """One allocation held by the daemon: ``a1``, ``a2``, ... in the order they were requested."""

    #: ``a1``, ``a2``, ...: its nodes are named ``node@a2`` (none for the first).
    name: str
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
        return "" if self.name == "a1" else f"@{self.name}"

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
        st["name"] = self.name
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


def allocation_of_node(name: str) -> str:
    """The allocation a node name belongs to: ``node1@a2`` to ``a2``, a plain name to the first."""
    _, at, allocation = name.rpartition("@")
    return allocation if at else "a1"


def fresh_name(held: dict[str, PilotAllocation]) -> str:
    return f"a{max((int(k[1:]) for k in held), default=0) + 1}"


#: Journal meta key: failed allocations in a row, and why auto-allocation stopped.
AUTOSCALE_META = "autoscale"


class AllocationBook:
    """The allocations held and what auto-allocation decides about them: pure state, no batch system
    calls (the daemon's shell makes those). Every question of the form "may this job still run
    somewhere?" is answered here."""

    #: The journal's meta key for :meth:`failures_record`.
    META = AUTOSCALE_META

    def __init__(self, *, sites: list[Site], autoscale: AutoscaleSettings) -> None:
        self.sites = sites
        self.autoscale = autoscale
        #: The allocations held, in the order they were requested (``a1``, ``a2``, ...), ended ones too.
        self.held: dict[str, PilotAllocation] = {}
        #: Allocations that failed to start in a row, and why auto-allocation gave up.
        self.failures = 0
        self.stopped = ""
        #: Since when queued work has waited (monotonic), and whether a request is under way.
        self.backlog_since: float | None = None
        self.growing = False
        #: The pilot is stopping: nothing new is requested or placed.
        self.stopping = False

    def of_node(self, name: str) -> PilotAllocation | None:
        return self.held.get(allocation_of_node(name))

    def can_grow(self) -> bool:
        """Auto-allocation may still bring another allocation."""
        return self.autoscale.enabled and not self.stopped and not self.stopping

    def may_run_later(self, duration: float | None, *, needs: str | None = None, now: float) -> bool:
        """Whether a job of this duration (and launcher's batch system) may start on an allocation held
        now or on one auto-allocation can still bring."""
        if any(h.usable and h.takes(duration, needs, now=now) for h in self.held.values()):
            return True
        return self.can_grow() and any(s.could_take(duration, needs) for s in self.sites)

    def room_to_grow(self) -> bool:
        """More capacity may come: an allocation is starting, or auto-allocation may request one."""
        if not self.can_grow():
            return False
        alive = [h for h in self.held.values() if h.alive]
        if any(not h.ready for h in alive):
            return True  # one is on its way
        held_nodes = sum(h.allocation.nodes for h in alive)
        smallest = min(s.settings.nodes for s in self.sites)
        a = self.autoscale
        return len(alive) < a.max_pilots and (a.max_nodes is None or held_nodes + smallest <= a.max_nodes)

    def all_over(self) -> bool:
        for h in self.held.values():  # (a loop, not any() of a generator: asked at every SUBMIT)
            if h.alive:
                return False
        return not self.can_grow()

    def why_over(self) -> str:
        """Why no allocation is left, in the batch system's words: a refusal tells the user at once
        instead of sending them to 'pilot status'. ("" when none ever ended.)"""
        if self.stopped:  # (it names the last failure)
            return f"auto-allocation stopped: {self.stopped}"
        ended = [h.allocation for h in self.held.values() if not h.alive]
        if not ended:
            return ""
        a = ended[-1]
        return f"{a.lrm} job {a.native_id}" + (f": {a.message}" if a.message else "")

    def failed_to_start(self, what: str) -> dict[str, Any]:
        """One more allocation that never started; ``autoscale.max_failures`` in a row stop auto-allocation.
        Returns the journal's record of the count: it outlives a restart, so a daemon killed between
        failures does not start over and request more than ``max_failures`` in a row."""
        self.failures += 1
        a = self.autoscale
        if a.enabled and self.failures >= a.max_failures and not self.stopped:
            self.stopped = (
                f"{self.failures} allocations in a row failed to start (autoscale.max_failures); the last: {what}"
            )
            log.error("auto-allocation stopped", reason=self.stopped)
        return self.failures_record()

    def failures_record(self) -> dict[str, Any]:
        return {"failures": self.failures, "stopped": self.stopped}

    def restore_failures(self, value: Any) -> None:
        if value is None:
            return
        failures = value.get("failures") if isinstance(value, dict) else None
        stopped = value.get("stopped") if isinstance(value, dict) else None
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0 or not isinstance(stopped, str):
            log.warning("the journal's count of failed allocations is damaged; counting from 0", value=repr(value))
            return
        self.failures, self.stopped = failures, stopped

    def idle_to_release(
        self, *, mono: float, queued: int, busy: Callable[[PilotAllocation], bool]
    ) -> list[PilotAllocation]:
        """Allocations idle for ``idle_timeout`` (above ``min_pilots``): of several, the one ending first
        goes first, so those kept have the most time left."""
        cfg = self.autoscale
        alive = [h for h in self.held.values() if h.alive]
        out: list[PilotAllocation] = []
        if cfg.idle_timeout is None:
            return out
        for held in sorted(alive, key=lambda h: h.end() or float("inf")):
            if not held.ready or queued or busy(held):
                held.idle_since = None
                continue
            if held.idle_since is None:
                held.idle_since = mono
            elif mono - held.idle_since >= cfg.idle_timeout and len(alive) - len(out) > cfg.min_pilots:
                out.append(held)
        return out

    def site_to_grow(
        self, *, mono: float, queued: int, draining: bool, could_run: Callable[[Site], bool]
    ) -> Site | None:
        """The site to request one more allocation from, when queued work has waited ``grow_after`` and
        none is on its way, within ``max_pilots`` and ``max_nodes``: the first (config order) whose
        allocations ``could_run`` the oldest queued jobs. Marks the request under way."""
        cfg = self.autoscale
        if not queued or draining:
            self.backlog_since = None
            return None
        if self.backlog_since is None:
            self.backlog_since = mono
        alive = [h for h in self.held.values() if h.alive]
        if (
            self.stopped
            or self.growing
            or mono - self.backlog_since < cfg.grow_after
            or any(not h.ready for h in alive)  # one is on its way: its nodes may be enough
            or len(alive) >= cfg.max_pilots
        ):
            return None
        held_nodes = sum(h.allocation.nodes for h in alive)
        room = None if cfg.max_nodes is None else cfg.max_nodes - held_nodes
        for s in self.sites:
            if (room is None or s.settings.nodes <= room) and could_run(s):
                self.growing = True
                self.backlog_since = mono  # the next one waits grow_after again
                return s
        return None

    def coming(self) -> list[str]:
        """What may still add room: allocations on their way, auto-allocation's state."""
        notes = [
            f"allocation {h.name} (site {h.site.name}) is {h.allocation.state.value}: its nodes may take it"
            for h in self.held.values()
            if h.alive and not h.ready
        ]
        if self.growing:
            notes.append("auto-allocation is requesting another allocation")
        elif self.stopped:
            notes.append(f"auto-allocation stopped: {self.stopped}")
        return notes

    def autoscale_status(self) -> dict[str, Any] | None:
        a = self.autoscale
        if not a.enabled:
            return None
        return {
            "max_pilots": a.max_pilots,
            "max_nodes": a.max_nodes,
            "idle_timeout": a.idle_timeout,
            "failures": self.failures,
            "stopped": self.stopped or None,
            "growing": self.growing,
        }
