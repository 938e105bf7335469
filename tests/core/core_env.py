"""An in-process core to drive with events: a fake clock, agents that are only names, and the outbox
recorded after each step. No socket, process or thread: a whole job lifecycle runs in microseconds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pilot import config, lrm, site
from pilot.allocations import AllocationBook, PilotAllocation, Site
from pilot.core.clock import Clock
from pilot.core.outbox import Outbox
from pilot.core.reactor import Core
from pilot.jobs import JobRecord
from pilot.launchers import LAUNCHERS
from pilot.lrm.base import Allocation, AllocationState
from pilot.model.job_description import JobDescription, ResourceRequest
from pilot.model.job_state import JobState
from pilot.model.node import NodeConfigured
from pilot.store import Store
from pilot.store_batch import Batch
from pilot.wire.messages import Heartbeat, Register, TaskEvent, TaskEvents

CLIENT = b"client-1"


@dataclass
class Step:
    """What one step of the core sent (the outbox), and the journal batch it committed."""

    out: Outbox
    journal: Batch

    def orders(self, node: str) -> list[dict[str, Any]]:
        return self.out.orders.get(node, [])

    def kills(self, node: str) -> dict[str, list[list[Any]]]:
        return dict(self.out.kills.get(node, {}))

    def statuses(self, ident: bytes = CLIENT) -> dict[str, list[Any]]:
        return self.out.statuses.get(ident, {})


@dataclass
class CoreEnv:
    nodes: int = 1
    cores: int = 2
    pilot: dict[str, Any] = field(default_factory=dict)
    walltime: float | None = None
    store: Store | None = None

    def __post_init__(self) -> None:
        raw = {"pilot": {"agent_timeout": 5.0, **self.pilot}, "allocation": {"lrm": "local", "nodes": self.nodes}}
        self.config = config.parse(raw, source="<core test>")
        sites = [Site(s, lrm.create(s.lrm, options=s.options, source="<core test>")) for s in self.config.sites]
        self.allocations = AllocationBook(sites=sites, autoscale=self.config.autoscale)
        self.clock = Clock(wall=1_000_000.0, mono=100.0)
        allocation = Allocation(
            native_id="1",
            lrm="local",
            state=AllocationState.ACTIVE,
            nodes=self.nodes,
            submitted=self.clock.wall,
            started=self.clock.wall,
            walltime=self.walltime,
        )
        self.allocations.held["a1"] = PilotAllocation("a1", sites[0], allocation)
        self.core = self._core()
        #: Every status sent to a client, newest per job: what the clients were told.
        self.sent: dict[bytes, dict[str, list[Any]]] = {}
        #: Per node, the number of the last batch of task events its agent sent.
        self.batches: dict[str, int] = {}

    def _core(self) -> Core:
        return Core(
            config=self.config,
            allocations=self.allocations,
            cluster=site.cluster(self.config, lrm_kind="local"),
            launchers=dict(LAUNCHERS),
            history=self.store,
            clock=self.clock,
        )

    # -- events -----------------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        self.clock.set(wall=self.clock.wall + seconds, mono=self.clock.mono + seconds)

    def register(
        self,
        name: str = "n0",
        *,
        running: list[list[Any]] | None = None,
        events: list[Any] = (),
        clock_mhz: float = 0.0,
    ) -> Step:
        node = NodeConfigured(
            name=name, hostname=name, processors=list(range(self.cores)), memory=1 << 30, clock_mhz=clock_mhz
        )
        refs = tuple((ref[0], ref[1]) for ref in running or ())
        self.batches[name] = self.batches.get(name, 0) + (1 if events else 0)
        self.core.on_agent(
            name, Register(node, refs, tuple(TaskEvent.from_wire(e) for e in events), self.batches[name])
        )
        return self.step()

    def submit(self, *descriptions: JobDescription, ident: bytes = CLIENT) -> list[str]:
        results = self.core.on_submit(ident, [d.to_wire() for d in descriptions], None)
        ids = []
        for r in results:
            assert "id" in r, r
            ids.append(r["id"])
        return ids

    def heartbeat(self, *nodes: str) -> None:
        for node in nodes:
            self.core.on_agent(node, Heartbeat())

    def events(self, node: str, *events: list[Any]) -> None:
        self.batches[node] = self.batches.get(node, 0) + 1  # numbered as an agent numbers its batches
        self.core.on_agent(node, TaskEvents(tuple(TaskEvent.from_wire(e) for e in events), self.batches[node]))

    def started(self, node: str, proc_id: str, slot: int = 0) -> None:
        self.events(node, [proc_id, slot, "started", self.clock.wall, {}])

    def exited(self, node: str, proc_id: str, slot: int = 0, *, code: int = 0, **data: Any) -> None:
        self.events(node, [proc_id, slot, "exited", self.clock.wall, {"exit_code": code, **data}])

    def step(self) -> Step:
        """One step as the daemon runs it: schedule, reclaim, seal; the journal committed (to a real
        store when the env has one), then the outbox taken."""
        self.core.step()
        journal = self.core.outbox.take_journal()
        if self.store is not None:
            self.store.commit(journal)
            self.core.book.committed()
        out = self.core.outbox.take()
        for ident, statuses in out.statuses.items():
            self.sent.setdefault(ident, {}).update(statuses)
        book = self.core.book
        book.retire()
        # The count of unfinished jobs is kept as states change (JobBook.unfinished, asked at every
        # submit): every step of every core test holds it to the per-state counts it summarises.
        assert book.unfinished() == sum(n for state, n in book.counts.items() if not state.final), book.counts
        return Step(out, journal)

    def restarted(self, path: Path) -> CoreEnv:
        """kill -9 of the daemon, then ``pilot up``: a new core resumed from the same journal (the
        allocation re-attached as the shell does, each job followed again as a client does once it
        reconnects). Whatever was not committed is gone; the agents run on."""
        assert self.store is not None
        self.store.close()
        store = Store.open(path)
        recovered = store.load(ended=False)  # as the daemon loads it: its ended jobs counted, not built
        again = CoreEnv(nodes=self.nodes, cores=self.cores, store=store)
        again.clock.set(wall=self.clock.wall + 1, mono=self.clock.mono + 1)
        again.core.resume(recovered)
        for job_id in list(again.core.book.jobs):
            again.core.on_attach(CLIENT, job_id)
        again.step()
        return again

    # -- looks ------------------------------------------------------------------------------------------

    def job(self, job_id: str) -> JobRecord:
        return self.core.book.jobs[job_id]

    def told(self, job_id: str, ident: bytes = CLIENT) -> list[Any]:
        """The newest status of the job sent to the client: [id, state, time, exit_code, message, metadata]."""
        return self.sent[ident][job_id]

    def state(self, job_id: str, ident: bytes = CLIENT) -> JobState:
        """The job's state as the client was last told it."""
        return JobState(self.told(job_id, ident)[1])


def true(**kw: Any) -> JobDescription:
    """A one-process /bin/true job."""
    resources = kw.pop("resources", ResourceRequest())
    return JobDescription(executable="/bin/true", resources=resources, **kw)
