"""The agents' side of the core: registration (and re-adoption after a daemon restart), heartbeats,
task events, and an agent that is lost or stopped -- its processes get a definite end at once."""

from __future__ import annotations

import heapq
import itertools
import math

import structlog

from pilot.allocations import PilotAllocation, allocation_of_node
from pilot.core.lifecycle import Lifecycle
from pilot.core.nodes import AgentRecord
from pilot.core.outbox import NodeLost
from pilot.core.phase import Phase
from pilot.core.state import CoreState, Part
from pilot.jobs import ProcessResult
from pilot.model.node import NodeConfigured
from pilot.wire.codec import ProtocolError
from pilot.wire.messages import (
    AgentMessage,
    Heartbeat,
    HeartbeatReply,
    ProcessRef,
    Register,
    Registered,
    Stop,
    TaskEvent,
    TaskEvents,
)

log = structlog.get_logger("pilot.core")


class Agents(Part):
    def __init__(self, state: CoreState, *, lifecycle: Lifecycle) -> None:
        super().__init__(state)
        self.lifecycle = lifecycle
        #: When each active agent is due to be looked at for silence: (monotonic, tie, its record). A
        #: heartbeat only moves ``last_seen``; a tick pops what is due and pushes it again at its new
        #: deadline if it was heard meanwhile: no tick, nor heartbeat, walks every agent.
        self._due: list[tuple[float, int, AgentRecord]] = []
        self._tie = itertools.count()
        #: The shell's word (monotonic): every agent frame that had arrived by then has been read. Silence
        #: after it is not the agents' (their heartbeats may wait unread while the daemon is behind).
        self.heard_until = math.inf
        #: Per allocation: its expected nodes' names, built once (a REGISTER checks its name there).
        self._expected: dict[str, tuple[int, int, frozenset[str]]] = {}

    def registered(self, name: str) -> bool:
        """Whether ``name``'s agent may send more than a REGISTER: known, active, and (recovered from the
        journal) registered again with this daemon, since its events come with that REGISTER."""
        agent = self.nodes.agents.get(name)
        return agent is not None and agent.state == "active" and agent.confirmed

    def ask_to_register(self, name: str) -> None:
        self.outbox.to_agent(name, HeartbeatReply(known=False))

    def on_message(self, name: str, msg: AgentMessage) -> None:
        agent = self.nodes.agents.get(name)
        if isinstance(msg, Register):
            self._on_register(name, agent, msg)
            if msg.more:
                log.info("nodes registered in one batch", sender=name, nodes=1 + len(msg.more))
            for entry in msg.more:
                other = entry.node.name
                try:
                    if allocation_of_node(other) != allocation_of_node(name):
                        raise ProtocolError(f"agent {name!r} registers {other!r}, a node of another allocation")
                    self._on_register(other, self.nodes.agents.get(other), entry)
                except ProtocolError as exc:  # the others of the batch are not refused with it
                    log.warning("refused a node's registration", sender=name, reason=str(exc))
        elif agent is None or not self.registered(name):
            self.ask_to_register(name)
        elif isinstance(msg, TaskEvents):
            agent.last_seen = self.clock.mono
            if 0 < msg.seq <= agent.acked:
                return  # sent again after a REGISTER that already carried it
            if msg.seq and msg.seq != agent.acked + 1:
                # A batch is missing (lost with a connection): acknowledging this one would make the agent
                # drop the missing one (acknowledgements are cumulative). Its REGISTER carries them all.
                log.warning("agent's events skipped a batch: asking it to register", node=name, seq=msg.seq)
                self.ask_to_register(name)
                agent.confirmed = False
                return
            on_event = self.lifecycle.on_process_event
            for ev in msg.events:
                on_event(agent, ev)
            if msg.seq:  # an unnumbered batch is applied, and never acknowledged (nothing to drop)
                agent.acked = msg.seq
        elif isinstance(msg, Heartbeat):
            self._beat(agent, msg)
            if not msg.nodes:
                self.outbox.to_agent(name, HeartbeatReply(known=True, acked=agent.acked))
                return
            self._beats(name, agent, msg)
        else:
            self.gone(agent, f"agent on {name} exited", state="stopped")

    def _beat(self, agent: AgentRecord, msg: Heartbeat) -> None:
        agent.last_seen = self.clock.mono
        if msg.load:
            agent.load = list(msg.load)
        self.nodes.measures(agent, values=msg.values, utilized=msg.utilized)

    def _beats(self, name: str, agent: AgentRecord, msg: Heartbeat) -> None:
        """A heartbeat that speaks for other nodes of the sender's process too: each one it names that
        is registered, of the sender's allocation, is heard; the reply acknowledges each one's events
        and names the others (they must register again). O(nodes named), nothing more."""
        acks: dict[str, int] = {}
        unknown: list[str] = []
        heard: list[AgentRecord] = []
        here = allocation_of_node(name)
        first = "@" not in name  # a plain name is of the first allocation: so is any other plain name
        mono, agents = self.clock.mono, self.nodes.agents
        load = list(msg.load) if msg.load else None  # one list for all: never changed in place
        for other in msg.nodes:
            hosted = agents.get(other)
            if (
                hosted is None
                or hosted.state != "active"
                or not hosted.confirmed
                or (not (first and "@" not in other) and allocation_of_node(other) != here)
            ):
                unknown.append(other)
                continue
            hosted.last_seen = mono
            if load is not None:
                hosted.load = load
            acks[other] = hosted.acked
            heard.append(hosted)
        self.nodes.measures_of_many(heard, sender=name, values=msg.values, utilized=msg.utilized)
        self.outbox.to_agent(name, HeartbeatReply(known=True, acked=agent.acked, acks=acks, unknown=tuple(unknown)))

    def _expected_names(self, owner: PilotAllocation) -> frozenset[str]:
        expected = owner.allocation.expected_nodes
        cached = self._expected.get(owner.name)
        if cached is None or cached[0] != id(expected) or cached[1] != len(expected):
            cached = self._expected[owner.name] = (id(expected), len(expected), frozenset(n.name for n in expected))
        return cached[2]

    def _on_register(self, name: str, agent: AgentRecord | None, msg: Register) -> None:
        node = msg.node
        if node.name != name:
            raise ProtocolError(f"agent {name!r} registers as {node.name!r}")
        owner = self.allocations.of_node(name)
        if owner is None or (agent is None and not owner.alive):
            raise ProtocolError(f"agent {name!r} is not a node of an allocation this pilot holds")
        if owner.allocation.expected_nodes and name not in self._expected_names(owner):
            raise ProtocolError(f"agent {name!r} is not a node of allocation {owner.name}")
        running, events = msg.running, msg.events
        if agent is not None and agent.state == "active" and agent.confirmed:
            agent.last_seen = self.clock.mono  # a repeated REGISTER: its events are replays
            for ev in events:
                self.lifecycle.on_process_event(agent, ev)
        elif agent is not None and agent.state == "active":
            self._readopt(agent, node, running, events)
        else:
            agent = self.register(node)
            for ev in events:
                self.lifecycle.on_process_event(agent, ev)  # all for processes this daemon gave up: dropped
            if running:
                # Processes this daemon does not know (or declared lost): the agent must not keep them.
                self.outbox.kills[name]["unknown to the daemon"].extend(list(k) for k in running)
        # A REGISTER carries every event its agent has not had acknowledged, up to its number: the next
        # batch is numbered one more (also when a new agent process starts counting again).
        agent.acked = msg.seq
        self.nodes.measures(agent, values=msg.values, utilized=msg.utilized)
        self.outbox.to_agent(name, Registered(self.config.pilot.heartbeat_interval, agent.acked))
        if self.allocations.stopping:
            # Registered after the pilot began stopping: it missed the STOP the others got.
            self.outbox.to_agent(name, Stop("pilot stopped"))

    def register(self, node: NodeConfigured) -> AgentRecord:
        owner = self.allocations.of_node(node.name)
        if owner is not None:
            was_ready = owner.ready
            owner.nodes.add(node.name)
            if owner.ready and not was_ready and self.allocations.failures:
                self.allocations.failures = 0  # one started: the count of failures in a row starts again
                self.outbox.journal.meta(self.allocations.META, self.allocations.failures_record())
        agent = self.nodes.register(node)
        self.watch(agent)
        self.outbox.journal.node_registered(node)
        log.info("agent registered", node=node.name, cores=len(node.processors), gpus=len(node.gpus))
        return agent

    def _readopt(
        self, agent: AgentRecord, node: NodeConfigured, running: tuple[ProcessRef, ...], events: tuple[TaskEvent, ...]
    ) -> None:
        """An agent of the allocation this daemon resumed is back. Its running processes that the journal
        holds are adopted; its buffered events (everything not acknowledged before the crash) are
        replayed; processes it runs that the journal does not hold are killed; orders the journal says
        were sent but the agent never got are sent again; kills it may have missed are sent again."""
        if node.to_wire() != agent.node.to_wire():
            log.warning("agent came back with another node description", node=agent.name)
        agent.confirmed = True
        agent.last_seen = self.clock.mono
        self.nodes.slots[agent.name].usable = True
        self.nodes.invalidate()
        refs = set(running)
        journaled = set(agent.processes)  # orders a replayed event sends now are not "never received"
        for ev in events:
            self.lifecycle.on_process_event(agent, ev)
        kills = self.outbox.kills[agent.name]
        unknown = [list(ref) for ref in refs if ref not in agent.processes]
        if unknown:
            kills["unknown to the daemon"].extend(unknown)
        resent = 0
        for job_id, slot in sorted(agent.processes):
            job = self.book.jobs.get(job_id.partition("~")[0])
            plan = job.run.processes.get(slot) if job is not None else None
            if job is None or plan is None or (job_id, slot) not in journaled:
                continue
            if (job_id, slot) not in refs:
                self.outbox.orders[agent.name].append(plan.order.to_wire())  # never reached the agent
                resent += 1
            elif job.cancel_reason is not None:
                kills["canceled"].append([job_id, slot])
            elif job.closing:
                kills["walltime"].append([job_id, slot])
            elif job.phase is Phase.WITHDRAWING:
                # Asked back before the restart; the request may not have left: ask again (an agent that
                # started it meanwhile says so, and the job runs on).
                self.outbox.withdraws[agent.name].append([job_id, slot])
        log.info(
            "agent re-adopted",
            node=agent.name,
            running=len(refs) - len(unknown),
            replayed_events=len(events),
            killed_unknown=len(unknown),
            resent_orders=resent,
        )

    def gone(self, agent: AgentRecord, message: str, *, state: str = "lost") -> None:
        """The agent was lost (or stopped): each of its processes ends now, with ``message``."""
        if agent.state != "active":
            return
        self.nodes.gone(agent, state=state)
        if state == "lost":
            log.warning("agent gone", node=agent.name, reason=message)
        else:
            log.info("agent stopped", node=agent.name)
        held = self.allocations.of_node(agent.name)
        if state == "lost" and held is not None and not self.allocations.stopping:
            self.outbox.effects.append(NodeLost(held.name, agent.name))
        for job_id, slot in sorted(agent.processes):
            job = self.book.jobs.get(job_id.partition("~")[0])
            plan = job.run.processes.get(slot) if job else None
            if job is not None and plan is not None and plan.order.job_id == job_id:
                self.lifecycle.process_done(
                    job, slot, ProcessResult(agent.name, plan.order.role, message=message, reason="lost")
                )

    def watch(self, agent: AgentRecord) -> None:
        """Look at ``agent`` for silence ``agent_timeout`` after it was last heard."""
        heapq.heappush(self._due, (agent.last_seen + self.config.pilot.agent_timeout, next(self._tie), agent))

    def check_heartbeats(self) -> None:
        """Agents silent for ``agent_timeout`` of the daemon's own running time are lost: silence that
        falls inside the daemon's pauses (:meth:`Clock.awake`) is not theirs, nor silence since the
        daemon last read every agent frame that had come (``heard_until``: a busy daemon may be behind
        in reading them; up to one more ``agent_timeout``, so that a daemon that never catches up still
        finds a dead node). Only the agents due are looked at: one heap entry per active agent, pushed
        again when it was heard since."""
        timeout = self.config.pilot.agent_timeout
        clock = self.clock
        unread = min(timeout, max(0.0, clock.mono - self.heard_until))
        due, agents = self._due, self.nodes.agents
        while due and due[0][0] <= clock.mono:
            _, _, agent = heapq.heappop(due)
            if agent.state != "active" or agents.get(agent.name) is not agent:
                continue  # gone, or registered again as a new record (with an entry of its own)
            if clock.mono - agent.last_seen <= timeout:
                heapq.heappush(due, (agent.last_seen + timeout, next(self._tie), agent))
                continue
            silent = clock.awake(agent.last_seen) - unread
            if silent > timeout:
                self.gone(agent, f"node {agent.name} lost: its agent sent no heartbeat for {silent:.1f} s")
            else:  # part of the silence was the daemon's own pause: look again once the rest may be over
                heapq.heappush(due, (clock.mono + timeout - silent, next(self._tie), agent))
