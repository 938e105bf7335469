"""The daemon: sockets, job table, scheduling passes, and the allocations' agents, wired together.

Everything runs on one anyio event loop. Each socket loop handles a burst of frames (all that are
waiting), then one flush runs a scheduling pass and sends every outbox in one message per peer: that
is where batching on every hop comes from.
"""

from __future__ import annotations

import dataclasses
import fcntl
import math
import os
import sys
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog
import zmq

import pilot
from pilot import lrm, site, wire
from pilot.allocations import PilotAllocation, Site, fresh_key, node_allocation_key
from pilot.config import Config
from pilot.formats import write_job, write_nodes
from pilot.jobs import JobRecord, ProcessResult
from pilot.launchers import LAUNCHERS, PlannedProcess, job_directory
from pilot.launchers.base import rank_order
from pilot.launchers.mpirun import MpirunLauncher
from pilot.lrm.base import AllocationRequest
from pilot.model.job_description import DescriptionError, JobDescription
from pilot.model.job_state import JobState
from pilot.model.node import NodeConfigured
from pilot.model.process_order import POST, PRE, ProcessOrder
from pilot.model.sss import JobStatus, NodeObject, TaskStatus, job_with_status, node_object
from pilot.model.sss.psij import to_sss
from pilot.rundir import RunDir
from pilot.scheduler import JobQueue, NodeSlots, RankPlacement, can_wait_behind, never_fits, place, place_behind
from pilot.scheduler.attributes import ConsumableLedger
from pilot.scheduler.dag import (
    DEPENDS_ON,
    JobGraph,
    NewJob,
    Outcome,
    Verdict,
    dependencies_from_custom,
    edges_from_wire,
)
from pilot.scheduler.distribution import JobPlacement, Resources, SchedulingPass, TaskPlacement, why_not
from pilot.scheduler.matching import Cluster, Matcher
from pilot.security import (
    AGENT_DOMAIN,
    CLIENT_DOMAIN,
    ZapAuthenticator,
    bind_host,
    credentials_file_env,
    redact,
    secure_server,
    tcp_endpoint,
    watch_handshakes,
)
from pilot.sss_jobs import SssJob, prepare, read_submission
from pilot.store import SSS_KEYS, Batch, JournalError, Recovered, Store
from pilot.transport import Progress, Waiter, drain

log = structlog.get_logger("pilot.daemon")

_DRAIN = 2048  # frames handled per burst before a flush
_CHECKPOINT_LOOK = 8  # commits between two looks at the journal's WAL size (in a worker thread)
_PARK_SECONDS = 5.0  # a held submit is refused after this long: well within a client's request timeout
_PARK_BYTES = 256 << 20  # held submit frames, in total
#: A job waiting at an agent behind a busy core this long, while a core it could use is free, is taken
#: back (WITHDRAW) and placed again: no head-of-line blocking behind a task that turned out long.
_RECLAIM_AFTER = 0.05
_AUTOSCALE_META = "autoscale"  # journal meta key: failed allocations in a row, and why auto-allocation stopped
_HOLD_SECONDS = 300.0  # statuses held for a client that does not read are dropped after this long
_SUBMIT_HEAD = wire.encode(wire.Kind.SUBMIT, {})[:-1]  # msgpack of [version, "submit", ...] up to the body


def _is_submit(payload: bytes) -> bool:
    """Whether a client frame is a SUBMIT, without decoding it."""
    return payload.startswith(_SUBMIT_HEAD)


class DaemonError(RuntimeError):
    """The daemon cannot start; the message says why and what to do."""


@dataclass(slots=True, eq=False)
class AgentRecord:
    name: str
    node: NodeConfigured
    state: str = "active"  # active | lost | stopped
    last_seen: float = field(default_factory=time.monotonic)
    registered: float = field(default_factory=time.time)
    load: list[float] = field(default_factory=list)
    utilized: dict[str, float] = field(default_factory=dict)  # psutil on the node, from heartbeats
    processes: set[tuple[str, int]] = field(default_factory=set)
    #: Highest TASK_EVENTS sequence number handled: acknowledged (after the journal commit) on heartbeats.
    acked: int = 0
    #: False for an agent recovered from the journal until it registers again with this daemon.
    confirmed: bool = True


@dataclass(slots=True)
class _Group:
    """One allocation as a scheduling pass sees it."""

    held: PilotAllocation
    nodes: list[NodeSlots]
    resources: Resources


class Daemon:
    def __init__(self, *, config: Config, rundir: RunDir, embedded: bool = False) -> None:
        self.config = config
        self.rundir = rundir
        self.embedded = embedded
        #: Launchers by name, the mpirun one for the site's MPI (``pilot.mpi_flavor``).
        self.launchers = dict(LAUNCHERS, mpirun=MpirunLauncher(flavor=config.pilot.mpi_flavor))
        self.sites = [
            Site(s, lrm.create(s.lrm, options=s.options, source=config.source, table=s.table)) for s in config.sites
        ]
        #: The allocations held, in the order they were requested (``a1``, ``a2``, ...), ended ones too.
        self.held: dict[str, PilotAllocation] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.queue: JobQueue[JobRecord] = JobQueue(key=lambda j: j.key, alive=lambda j: j.phase == "queued")
        self.nodes: dict[str, NodeSlots] = {}
        #: What SSS matching sees (typed attributes, features, consumables) and what placement takes
        #: from: the same NodeSlots as ``nodes``, plus consumable ledgers per node and for the allocation.
        self.cluster: Cluster = site.cluster(config, lrm_kind=self.sites[0].lrm.kind)
        self.matcher = Matcher(self.cluster)
        self.resources = Resources(self.nodes, {}, ConsumableLedger.of(self.cluster.global_capacity))
        self.graph = JobGraph()  # dependencies between jobs
        #: Accepted jobs not in the queue yet: waiting for their dependencies or an SSS <Hold> release.
        self._blocked: dict[str, JobRecord] = {}
        self._sss_fit: dict[Any, list[str]] = {}  # request key -> why it can never fit, per node set
        self.agents: dict[str, AgentRecord] = {}
        self.counts: Counter[JobState] = Counter()
        self.started = time.time()
        self._seq = 0
        #: Jobs dispatched behind busy cores, not started yet: id -> since when (monotonic).
        self._waiting: dict[str, float] = {}
        self._withdrawing: set[str] = set()  # of those, the ones asked back from their agent (WITHDRAW)
        self._withdraws: dict[str, list[list[Any]]] = defaultdict(list)  # node -> keys to withdraw
        self._replies: list[tuple[bytes, dict[str, Any]]] = []
        self._orders: dict[str, list[dict[str, Any]]] = defaultdict(list)  # wire forms, per node
        self._kills: dict[str, dict[str, list[list[Any]]]] = defaultdict(lambda: defaultdict(list))
        self._events: dict[bytes, dict[str, list[Any]]] = defaultdict(dict)
        self._stopping = False
        self._draining = False  # 'pilot down --drain': no new jobs, stop once the accepted ones ended
        self._stop = anyio.Event()
        self._progress = Progress()
        self._agent_frames: list[list[bytes]] = []  # direct replies to agents (registered, heartbeat)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._clients = self._ctx.socket(zmq.ROUTER)
        self._agents_sock = self._ctx.socket(zmq.ROUTER)
        for sock in (self._clients, self._agents_sock):
            sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a peer at its high-water mark says so (see _send)
        self._waiter = Waiter()
        self._waiter.add(self._clients)
        self._waiter.add(self._agents_sock)
        self._lock_fd: int | None = None
        self._zap: ZapAuthenticator | None = None
        self._fit_cache: dict[tuple[Any, ...], str | None] = {}  # request key -> never_fits, per node set
        #: Auto-allocation: allocations that failed to start in a row, why it gave up, since when queued
        #: work has been waiting (monotonic), and whether a request is under way.
        self._failures = 0
        self._autoscale_stopped = ""
        self._backlog_since: float | None = None
        self._growing = False
        self._tg: anyio.abc.TaskGroup | None = None  # the daemon's task group: allocation requests and releases
        self._agent_env: dict[str, str] = {}
        self._curve_socks: list[zmq.Socket[bytes]] = []  # sockets with a CURVE endpoint: handshakes logged
        self._remote_info: dict[str, str] = {}  # the clients' CURVE endpoint and key to pin, for pilot.json
        self.store: Store | None = None
        #: Set while the journal's WAL is copied into its file in a worker thread; set when that ends.
        self._checkpointing: anyio.Event | None = None
        self._checkpoint_look: float = _CHECKPOINT_LOOK  # the commit count at which to look at the WAL next
        self._tx = Batch()  # the changes of the current burst, committed at the start of each flush
        #: Client keys of the jobs in ``_tx`` (not in the journal yet): key -> job id.
        self._fresh_keys: dict[str, str] = {}
        self._dirty: set[JobRecord] = set()  # jobs whose row changed since the last commit
        self._placed: set[JobRecord] = set()  # ... and whose placement changed
        self._new_results: list[tuple[JobRecord, int, ProcessResult]] = []
        #: Jobs that ended in this burst: dropped from memory after the flush that sends their final
        #: status (the journal keeps them for attach and list), so memory follows the unfinished work only.
        self._retired: list[JobRecord] = []
        #: Submit requests held while the pilot has ``max_queued`` unfinished jobs: (time, ident, payload).
        self._parked: deque[tuple[float, bytes, bytes]] = deque()
        self._parked_bytes = 0
        #: Statuses a slow client could not take yet: ident -> (held since, job id -> newest status).
        self._held_events: dict[bytes, tuple[float, dict[str, Any]]] = {}
        #: Replies a client's socket had no room for, in order, each with when it was first held.
        self._held_replies: dict[bytes, deque[tuple[float, bytes]]] = {}
        self._alloc_seen: dict[str, tuple[Any, ...]] = {}
        self.resumed = False
        sd = rundir.socket_dir()
        self.client_url = f"ipc://{sd / 'client.sock'}"
        self.agent_url = f"ipc://{sd / 'agent.sock'}"

    # -- lifecycle ----------------------------------------------------------------------------------

    def _take_lock(self) -> None:
        self.rundir.create()
        while True:
            fd = os.open(self.rundir.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                info = self.rundir.read_info() or {}
                raise DaemonError(
                    f"a pilot is already running in {self.rundir.path} (pid {info.get('pid', '?')}); "
                    "use it, stop it with 'pilot down', or pick another --name"
                ) from None
            try:
                same = os.stat(self.rundir.lock_file).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # a daemon that stopped removed the file we locked: lock the current one
        self._lock_fd = fd

    async def serve(self, *, on_ready: Callable[[], None] | None = None) -> None:
        self._take_lock()
        clean = False
        try:
            recovered = self._open_journal()
            self._clients.bind(self.client_url)
            resuming = bool(recovered.allocations) or "agent_url" in recovered.meta
            await self._bind_clients(resumed=resuming)  # before any allocation: may fail
            if resuming:
                await self._resume(recovered)
            else:
                await self._bind_agents()
                self._tx.meta("agent_url", self.agent_url)
                refused = await self._acquire_initial()
                self._commit()
                if refused is not None:
                    # Refused by the batch system at submission (bad partition, account, limits): say so now.
                    clean = True
                    raise DaemonError(f"the batch system refused the pilot: {refused}")
            self.rundir.write_info(self._info())
            log.info("pilot ready", rundir=str(self.rundir.path), client_url=self.client_url, pid=os.getpid())
            async with anyio.create_task_group() as tg:
                self._tg = tg
                if self._zap is not None:
                    tg.start_soon(self._zap.serve)
                for sock in self._curve_socks:
                    tg.start_soon(self._watch_handshakes, sock)
                tg.start_soon(self._io_loop)
                tg.start_soon(self._monitor_loop)
                if on_ready is not None:
                    on_ready()
                await self._stop.wait()
                await self._shutdown()
                tg.cancel_scope.cancel()
            clean = True
        finally:
            if self.store is not None:
                try:
                    self.store.discard() if clean else self.store.close()
                except JournalError as exc:
                    log.error("journal", error=str(exc))
            self._clients.close(linger=500)
            self._agents_sock.close(linger=0)
            if self._zap is not None:
                self._zap.close()
            self._ctx.term()
            self._waiter.close()
            self.rundir.remove_info()
            if self._lock_fd is not None:
                if clean:  # removed while still held: nothing of this pilot is left in the run directory
                    self.rundir.lock_file.unlink(missing_ok=True)
                os.close(self._lock_fd)
            log.info("pilot stopped")

    def _open_journal(self) -> Recovered:
        try:
            self.store = Store.in_run_dir(
                self.rundir.path,
                auto_checkpoint=False,
                checkpoint_bytes=int(self.config.pilot.journal_checkpoint_mib * (1 << 20)),
            )
            return self.store.load()
        except JournalError as exc:
            raise DaemonError(str(exc)) from None

    def _commit(self) -> None:
        """Write the burst's changes in one transaction, before any reply or order leaves: what a client
        or agent has been told is in the journal. A journal that cannot be written stops the daemon
        (nothing unjournaled is acknowledged; a restart resumes from the last commit)."""
        tx = self._tx
        placed = self._placed
        for job in self._dirty:
            tx.job_update(job, placed=job in placed)
        for job, slot, result in self._new_results:
            if not job.final:  # a final job's Delivered is in its row: its process results are not needed
                tx.process_result(job.id, slot, result)
        self._dirty.clear()
        placed.clear()
        self._new_results.clear()
        for key, held in self.held.items():
            a = held.allocation
            seen = (a.state, a.started, a.message, a.nodes, len(a.hosts), len(a.expected_nodes))
            if seen != self._alloc_seen.get(key):
                self._alloc_seen[key] = seen
                tx.allocation(a, key=key, site=held.site.name)
        self._tx = Batch()
        if self.store is not None:
            self.store.commit(tx)
            self._fresh_keys.clear()  # the journal has them now
            store = self.store
            if store.commits >= self._checkpoint_look and self._tg is not None:
                self._checkpoint_look = math.inf  # until this look is done
                self._tg.start_soon(self._checkpoint, store)

    async def _checkpoint(self, store: Store) -> None:
        """Every few commits: if the journal's WAL outgrew its limit, copy it into the journal file. Both
        the look (a ``stat``) and the copy (two ``fsync``) run in a worker thread: on a network file
        system either may take long. During the copy the I/O task reads agents but leaves the store
        alone: no commit, so nothing is sent that the journal does not hold yet, and no client request is
        read."""
        try:
            due = await anyio.to_thread.run_sync(store.checkpoint_due)
            if due:
                t0 = time.monotonic()
                done = self._checkpointing = anyio.Event()
                try:
                    await anyio.to_thread.run_sync(store.checkpoint)
                finally:
                    self._checkpointing = None
                    done.set()
                log.debug("journal checkpointed", seconds=round(time.monotonic() - t0, 4))
        finally:
            self._checkpoint_look = store.commits + _CHECKPOINT_LOOK

    async def _resume(self, recovered: Recovered) -> None:
        """Rebuild from the journal of a daemon that died: jobs, queue, nodes and their held slots; the
        agents keep running and register again (their unacknowledged events with them); the allocation
        are re-attached, not requested again."""
        sites = {s.name: s for s in self.sites}
        for key, site_name, allocation in recovered.allocations:
            source = sites.get(site_name)
            if source is None or allocation.lrm != source.lrm.kind:
                says = f"says lrm = {source.lrm.kind!r} for it" if source is not None else "has no such site"
                raise DaemonError(
                    f"the journal in {self.rundir.path} holds a {allocation.lrm!r} allocation of site {site_name!r} "
                    f"but this configuration {says}; start the pilot with the configuration it was started with"
                )
            self.held[key] = PilotAllocation(key, source, allocation, over=allocation.state.final)
        self.resumed = True
        self._restore_failures(recovered.meta.get(_AUTOSCALE_META))
        url = recovered.meta.get("agent_url")
        await self._bind_agents(endpoint=url if isinstance(url, str) else None)
        for held in self.held.values():
            if held.over:
                continue
            try:
                await held.site.lrm.reattach(held.allocation)
            except Exception as exc:  # a batch system error must not lose the jobs: report and go on
                log.error("cannot re-attach the allocation", native_id=held.allocation.native_id, error=str(exc))
        now = time.monotonic()
        for node in recovered.nodes:
            self._register(node)
            agent = self.agents[node.name]
            agent.confirmed = False
            agent.last_seen = now
            self.nodes[node.name].usable = False  # until its agent is back
            known = self.held.get(node_allocation_key(node.name))
            if known is None or known.over:
                self._agent_gone(agent, f"node {node.name}'s allocation ended before the restart")
        self._seq = recovered.next_seq - 1
        for job in recovered.jobs:
            self.counts[job.state] += 1
            if job.final:
                continue  # the journal answers for it
            self.jobs[job.id] = job
            self._rebuild_journaled(job)
            if job.phase == "queued":
                if job.edges is None and not job.user_hold:
                    self.queue.push(job)
                else:
                    self._blocked[job.id] = job
                continue
            placement = job.sss.placement if job.sss is not None else None
            for i, rank in enumerate(job.ranks):
                slots = self.nodes.get(rank.node)
                if slots is not None and i < len(job.held) and job.held[i]:
                    slots.take_exact(rank)
                    if placement is not None and rank.node in self.resources.ledgers:
                        pool = self.resources.global_ledger.capacity
                        host = {k: v for k, v in placement.tasks[i].amounts if k not in pool}
                        self.resources.ledgers[rank.node].take(host)
                    if job.description.resources.exclusive_node_use:
                        slots.exclusive_job = job.id
            for slot, plan in job.processes.items():
                owner = self.agents.get(plan.node)
                if owner is not None:
                    owner.processes.add((plan.order.job_id, slot))
                else:
                    self._process_done(
                        job,
                        slot,
                        ProcessResult(
                            plan.node,
                            plan.order.role,
                            message=(f"node {plan.node} is not known to the restarted daemon"),
                        ),
                    )
            if not job.processes and job.phase != "done":
                self._finish(job)
            if job.processes and job.phase == "ranks" and any(p.order.after_cores for p in job.processes.values()):
                self._waiting[job.id] = time.monotonic()
        for blocked in list(self._blocked.values()):
            self._unblock(blocked)
        self._alloc_seen = {}
        self._commit()
        log.info(
            "pilot resumed from its journal",
            jobs=len(self.jobs),
            queued=len(self.queue),
            running=sum(1 for j in self.jobs.values() if not j.final and j.phase != "queued"),
            nodes=len(self.agents),
            allocations=[h.allocation.native_id for h in self.held.values() if not h.over],
        )

    def _rebuild_journaled(self, job: JobRecord) -> None:
        """A resumed job's SSS side, dependency edges and Hold, from what the journal kept. A running SSS
        job's tasks map onto its ranks in order (its first variant: jobs with alternatives that ran
        another variant show the first's task numbering)."""
        extra, job.journaled = job.journaled, None
        if not extra:
            return
        try:
            if isinstance(extra.get("sss"), str):
                job.sss = prepare(read_submission(extra["sss"])[0][0], self.cluster)
                if job.ranks:
                    job.sss.placement = _placement_from_ranks(job.sss, job.ranks)
            if extra.get("edges"):
                edges = edges_from_wire(extra["edges"])
                self.graph.restore(job.id, job.description.name, edges, where=f"job {job.id}")
                job.edges = extra["edges"]
                for e in edges:
                    for target in e.targets:
                        if target not in self.graph.outcomes and (outcome := self._ended(target)) is not None:
                            self.graph.outcomes[target] = outcome
            job.user_hold = bool(extra.get("hold"))
        except (DescriptionError, ValueError, IndexError) as exc:
            log.error("journaled job cannot be rebuilt", job=job.id, error=str(exc))
            if job.phase == "queued":
                job.phase = "done"
                self._set_state(job, JobState.FAILED, time.time(), message=f"not rebuilt after a restart: {exc}")

    def request_stop(self) -> None:
        self._stop.set()

    def poke(self) -> None:
        """State changed outside the I/O task: have it schedule and flush."""
        self._waiter.poke()

    async def _bind_agents(self, *, endpoint: str | None = None) -> None:
        """ipc in the private run directory for a local allocation; otherwise TCP with CURVE, where
        only agents holding this pilot's agent key get past the handshake (ZAP) and agents check the
        daemon's key; the agents find their credentials through a 0600 file, never on a command line."""
        local = all(s.lrm.kind == "local" for s in self.sites)
        transport = self.config.pilot.agent_transport or ("ipc" if local else "tcp")
        if transport == "ipc":
            self._agents_sock.bind(self.agent_url)
            return
        if endpoint is not None and not endpoint.startswith("tcp://"):
            endpoint = None
        keys = self.rundir.keys()
        if self._zap is None:  # one per context, for both sockets' domains
            self._zap = ZapAuthenticator(self._ctx, keys.policy())
            self._zap.start()
        secure_server(self._agents_sock, keys.daemon, domain=AGENT_DOMAIN)
        if endpoint is not None:
            # A restarted daemon: the agents reconnect to the endpoint they were given.
            try:
                self._agents_sock.bind(endpoint)
            except zmq.ZMQError as exc:
                raise DaemonError(
                    f"cannot listen for the running agents on {endpoint} again ({exc}); another process holds "
                    "the port. Stop it, then start the pilot again: the agents wait for their daemon"
                ) from None
        else:
            host = await anyio.to_thread.run_sync(lambda: bind_host(self.config.pilot.bind, local=local))
            self._agents_sock.bind(tcp_endpoint(host))
        bound = self._agents_sock.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(bound, bytes)
        self.agent_url = bound.decode()
        self._curve_socks.append(self._agents_sock)
        # A file only the user can read, named in the environment: /proc/<pid>/environ keeps what a process
        # was started with, so the keys themselves must not travel there.
        self._agent_env = credentials_file_env(keys.write_credentials_file("agent"))

    async def _bind_clients(self, *, resumed: bool) -> None:
        """With ``client_transport = "tcp"``, a CURVE endpoint on the clients' socket for remote clients: ZAP
        admits only the client keys of this pilot (``keys/client.key``, ``keys/authorized/``), so other keys
        fail the handshake and never reach the daemon's logic. The ipc endpoint, bound before, stays plain
        (libzmq fixes an endpoint's security at bind time): the private run directory protects it."""
        p = self.config.pilot
        if p.client_transport != "tcp":
            return
        keys = self.rundir.keys()
        if self._zap is None:
            self._zap = ZapAuthenticator(self._ctx, keys.policy())
            self._zap.start()
        secure_server(self._clients, keys.daemon, domain=CLIENT_DOMAIN)
        host = await anyio.to_thread.run_sync(lambda: bind_host(p.client_bind or p.bind))
        endpoint = tcp_endpoint(host, p.client_port or "*")
        last = (self.rundir.last_info() or {}).get("client_tcp_url") if resumed else None
        if not p.client_port and isinstance(last, str) and last.startswith(tcp_endpoint(host, "")):
            endpoint = last  # a daemon resuming after a crash: its remote clients reconnect where they were
        try:
            self._clients.bind(endpoint)
        except zmq.ZMQError as exc:
            if endpoint == last:
                log.warning("cannot listen for remote clients where the last daemon did", url=last, error=str(exc))
                self._clients.bind(tcp_endpoint(host))
            else:
                raise DaemonError(
                    f"cannot listen for remote clients on {endpoint} ({exc}); free the port or change "
                    "pilot.client_port / pilot.client_bind"
                ) from None
        bound = self._clients.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(bound, bytes)
        self._curve_socks.append(self._clients)
        self._remote_info = {"client_tcp_url": bound.decode(), "server_public": keys.daemon.public.decode()}
        log.info("remote clients admitted over CURVE", url=bound.decode(), authorized=len(keys.policy()[CLIENT_DOMAIN]))

    @staticmethod
    async def _watch_handshakes(sock: zmq.Socket[bytes]) -> None:
        """Peers refused before ZAP hears of them (no CURVE, another daemon's key) are logged too."""
        await watch_handshakes(sock, server=True)

    async def _acquire_initial(self) -> str | None:
        """Every site's ``pilots`` allocations. One refused at submission cancels the others: a pilot
        whose config a batch system refuses fails at ``pilot up``, with the batch system's words."""
        for s in self.sites:
            for _ in range(s.settings.pilots):
                held = await self._acquire(s)
                if held.allocation.state.final:
                    for other in self.held.values():
                        if other is not held and not other.allocation.state.final:
                            await other.site.lrm.cancel(other.allocation)
                    where = f" (site {s.name})" if len(self.sites) > 1 else ""
                    return held.allocation.message + where
        return None

    async def _acquire(self, source: Site) -> PilotAllocation:
        key = fresh_key(self.held)
        workdir = self.rundir.agents_dir if key == "a1" else self.rundir.agents_dir / key
        await anyio.to_thread.run_sync(lambda: workdir.mkdir(mode=0o700, parents=True, exist_ok=True))
        env = {
            "PILOT_AGENT_URL": self.agent_url,
            "PILOT_AGENT_HEARTBEAT": str(self.config.pilot.heartbeat_interval),
            "PILOT_AGENT_LOG_LEVEL": self.config.pilot.log_level,
            **self._agent_env,
        }
        suffix = "" if key == "a1" else f"@{key}"
        if suffix:
            env["PILOT_AGENT_NODE_SUFFIX"] = suffix
        request = AllocationRequest(
            nodes=source.settings.nodes,
            walltime=source.settings.walltime,
            agent_argv=[sys.executable, "-m", "agent"],
            agent_env=env,
            workdir=workdir,
            node_suffix=suffix,
        )
        allocation = await source.lrm.submit(request)
        held = self.held[key] = PilotAllocation(key, source, allocation)
        log.info(
            "allocation requested",
            key=key,
            site=source.name,
            native_id=allocation.native_id,
            nodes=allocation.nodes,
            state=allocation.state.value,
        )
        return held

    def _info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "name": self.config.pilot.name,
            "version": pilot.__version__,
            "client_url": self.client_url,
            "agent_url": self.agent_url,
            "started": self.started,
            "config": self.config.source,
            "embedded": self.embedded,
            **self._remote_info,
        }

    async def _shutdown(self) -> None:
        log.info("pilot stopping", jobs=len(self.jobs))
        self._stopping = True
        for job in list(self.jobs.values()):
            if not job.final:
                self._cancel(job, reason="pilot stopped")
        self.poke()
        with anyio.move_on_after(self.config.pilot.kill_grace + 3):
            await self._until(
                lambda: (
                    all(j.final for j in self.jobs.values()) or all(a.state != "active" for a in self.agents.values())
                )
            )
        for name, agent in self.agents.items():
            if agent.state == "active":
                self._to_agent(name, wire.Kind.STOP, {"reason": "pilot stopped"})
        self.poke()
        with anyio.move_on_after(5):
            await self._until(lambda: all(a.state != "active" for a in self.agents.values()))
        for agent in self.agents.values():
            if agent.state == "active":
                self._agent_gone(agent, f"agent on {agent.name} did not stop in time")
        for job in self.jobs.values():
            if not job.final:
                self._finish(job)
        flushed = self._progress.event()
        self.poke()
        with anyio.move_on_after(2):
            await flushed.wait()  # the I/O task sent the final statuses
        for held in self.held.values():
            self._cancel_allocation(held)
        with anyio.move_on_after(30):
            await self._until(lambda: all(h.allocation.state.final for h in self.held.values()))

    # -- client socket ------------------------------------------------------------------------------

    async def _io_loop(self) -> None:
        """The only task that touches the sockets: drain both, then one flush, then wait. While the journal
        checkpoints, only agents are read (see :meth:`_checkpoint`)."""
        clients, agents = self._clients, self._agents_sock
        while True:
            if self._checkpointing is not None:
                # Agents only (their heartbeats keep them alive through a long checkpoint), until it ends.
                for frames in drain(agents, _DRAIN):
                    self._on_agent(frames)
                with anyio.move_on_after(0.1):
                    await self._checkpointing.wait()
                continue
            for frames in drain(clients, _DRAIN):
                self._on_client(frames)
            for frames in drain(agents, _DRAIN):
                self._on_agent(frames)
            self._flush()
            await self._waiter.wait()

    def _on_client(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            log.warning("dropped client message", reason=f"{len(frames) - 1} payload frames, expected 1")
            return
        ident, payload = frames
        if _is_submit(payload) and (self._parked or self._unfinished() >= self.config.pilot.max_queued):
            self._park(ident, payload)  # behind those already held: submits are served in order
            return
        self._serve_client(ident, payload)

    def _serve_client(self, ident: bytes, payload: bytes) -> None:
        try:
            msg = wire.decode(payload, allowed=wire.CLIENT_KINDS)
            rid = wire.field(msg.body, "rid", int)
        except wire.ProtocolError as exc:
            log.warning("dropped client frame", reason=str(exc), size=len(payload))
            return
        try:
            body = self._handle_client(ident, msg)
        except wire.ProtocolError as exc:
            log.warning("bad client request", kind=msg.kind, reason=str(exc))
            body = {"error": f"bad {msg.kind} request: {exc}"}
        body["rid"] = rid
        self._replies.append((ident, body))

    def _handle_client(self, ident: bytes, msg: wire.Message) -> dict[str, Any]:
        body = msg.body
        if msg.kind == wire.Kind.SUBMIT:
            jobs = wire.field(body, "jobs", list)
            keys = _submit_keys(body, len(jobs))
            refusal = self._refusal()
            if keys is not None:
                return {"results": self._submit_keyed(ident, jobs, keys, refusal)}
            if refusal is not None:
                return {"results": [refusal] * len(jobs)}
            return {"results": [self._submit(ident, raw) for raw in jobs]}
        if msg.kind == wire.Kind.CANCEL:
            return {"results": [self._cancel_request(i) for i in wire.str_list(body, "ids")]}
        if msg.kind == wire.Kind.ATTACH:
            return {"results": [self._attach(ident, i) for i in wire.str_list(body, "ids")]}
        if msg.kind == wire.Kind.LIST:
            known = self.store.job_ids() if self.store is not None else []
            return {"ids": sorted(set(known).union(self.jobs), key=_id_order)}
        if msg.kind == wire.Kind.STATUS:
            return self.status()
        if msg.kind == wire.Kind.EXPLAIN:
            return {"results": [self._explain(i) for i in wire.str_list(body, "ids")]}
        if msg.kind == wire.Kind.SHOW:
            return {"results": [self._show(i) for i in wire.str_list(body, "ids")]}
        if msg.kind == wire.Kind.NODES:
            return {"xml": write_nodes(self._node_objects())}
        if msg.kind == wire.Kind.RELEASE:
            return {"results": [self._release_hold(i) for i in wire.str_list(body, "ids")]}
        if msg.kind == wire.Kind.SHUTDOWN:
            if wire.opt_field(body, "drain", bool, False) and not self._stopping:
                self._draining = True
                log.info("draining: no new jobs; stopping once every accepted job has ended", left=self._unfinished())
            else:
                self.request_stop()
            return {"ok": True, "pid": os.getpid(), "unfinished": self._unfinished()}
        return {"version": pilot.__version__, "pilot": self.config.pilot.name, "pid": os.getpid()}  # hello

    def _park(self, ident: bytes, payload: bytes) -> None:
        """Backpressure: hold a submit while the pilot has ``max_queued`` unfinished jobs. The client's
        submit() waits for the reply, so it slows down to the pace jobs end; held bytes are bounded."""
        if self._parked_bytes + len(payload) > _PARK_BYTES:
            self._refuse_parked(ident, payload)
            return
        self._parked.append((time.monotonic(), ident, payload))
        self._parked_bytes += len(payload)

    def _unpark(self) -> None:
        """Handle held submits as room frees up; one held longer than ``_PARK_SECONDS`` is answered with
        a transient refusal before the client's own timeout, so it is never accepted after the client
        has given up on it (which would make a duplicate when the client submits it again)."""
        limit = self.config.pilot.max_queued
        now = time.monotonic()
        while self._parked:
            t, ident, payload = self._parked[0]
            if self._unfinished() < limit:
                self._parked.popleft()
                self._parked_bytes -= len(payload)
                self._serve_client(ident, payload)
            elif now - t > _PARK_SECONDS:
                self._parked.popleft()
                self._parked_bytes -= len(payload)
                self._refuse_parked(ident, payload)
            else:
                break

    def _refuse_parked(self, ident: bytes, payload: bytes) -> None:
        try:
            body = wire.decode(payload, allowed=wire.CLIENT_KINDS).body
            rid = wire.field(body, "rid", int)
            count = len(wire.field(body, "jobs", list))
        except wire.ProtocolError:
            return  # garbage that only looked like a submit: dropped, as _on_client would
        error = (
            f"the pilot holds {self.config.pilot.max_queued} unfinished jobs (pilot.max_queued); "
            "submit again when some have ended"
        )
        refusal = {"error": error, "transient": True, "retry": True}  # nothing of it was carried out: send it again
        self._replies.append((ident, {"rid": rid, "results": [refusal] * count}))

    def _unfinished(self) -> int:
        return sum(n for state, n in self.counts.items() if not state.final)

    def _refusal(self) -> dict[str, Any] | None:
        """Why this pilot takes no new job now (the same answer for every job of a request), or None."""
        if self._stopping or self._draining:
            what = "draining ('pilot down --drain')" if self._draining else "stopping"
            return {"error": f"the pilot is {what}; submit to a new one", "transient": True}
        if self._all_over():
            return {
                "error": "this pilot's last allocation has ended ('pilot status' says why); start a new pilot",
                "transient": True,
            }
        return None

    def _submit_keyed(
        self, ident: bytes, jobs: list[Any], keys: list[str | None], refusal: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        """Jobs named by the client's keys (pipelined submits). A key this pilot knows is the job that
        key made before -- its answer was lost with a connection or a daemon, and the client sent it
        again -- which this client now follows, even while new jobs are refused: it never runs twice.
        The others are submitted as usual."""
        named = [k for k in keys if k is not None]
        known = {k: self._fresh_keys[k] for k in named if k in self._fresh_keys}
        rest = [k for k in named if k not in known]
        if rest and self.store is not None:
            known.update(self.store.jobs_by_key(rest))
        results: list[dict[str, Any]] = []
        for raw, key in zip(jobs, keys, strict=True):
            job_id = known.get(key) if key is not None else None
            if job_id is not None:
                results.append(self._attach(ident, job_id))
            elif refusal is not None:
                results.append(refusal)
            else:
                result = self._submit(ident, raw, key=key)
                if key is not None and "id" in result:
                    known[key] = self._fresh_keys[key] = result["id"]
                results.append(result)
        return results

    def _submit(self, ident: bytes, raw: Any, *, key: str | None = None) -> dict[str, Any]:
        """One job of a SUBMIT request (the pilot takes new jobs: :meth:`_refusal` said so)."""
        if isinstance(raw, dict) and "sss" in raw:
            if key is not None:
                return {"error": "an SSS submission carries no key: submit it with submit_sss()"}
            return self._submit_sss(ident, raw)
        try:
            description = JobDescription.from_wire(raw)
            if description.launcher not in LAUNCHERS:
                raise DescriptionError(
                    f"JobSpec.launcher {description.launcher!r} is not available in this pilot; "
                    f"use one of {', '.join(LAUNCHERS)}"
                )
            self._check_launcher(description.launcher, what="JobSpec.launcher")
            reason = self._never_fits(description)
            if reason is not None:
                raise DescriptionError(f"the job can never run in this allocation: it {reason}")
            job_id = str(self._seq + 1)
            custom = description.custom_attributes
            deps = dependencies_from_custom(custom) if DEPENDS_ON in custom else []
            if deps:  # a job without dependencies stays out of the graph: nothing to pay on the hot path
                self.graph.add(
                    [NewJob(job_id, description.name, None, tuple(deps), f"job {job_id}")],
                    known=self._known_job,
                    named=self._named_jobs,
                )
        except DescriptionError as exc:
            return {"error": str(exc)}
        job = JobRecord(id=job_id, description=description)
        job.edges = self.graph.edges_of(job_id) or None
        raw = dict(raw, edges=job.edges) if job.edges else raw  # raw: from_wire accepted it
        self._accept(ident, job, raw, key=key)
        return {"id": job.id, "time": job.state_time}

    def _accept(self, ident: bytes, job: JobRecord, raw: Any, *, key: str | None = None) -> None:
        self._seq += 1
        assert job.id == str(self._seq)
        job.subscribers.add(ident)
        self.jobs[job.id] = job
        self._tx.job_accepted(job.id, self._seq, raw, job.submitted, key=key)
        self.counts[JobState.QUEUED] += 1
        if job.edges is None and not job.user_hold:
            self.queue.push(job)
        else:
            for edge in job.edges or ():
                for target in edge[4]:
                    if target not in self.graph.outcomes and (outcome := self._ended(target)) is not None:
                        self.graph.outcomes[target] = outcome  # it ended before this job came
            self._blocked[job.id] = job
            self._unblock(job)

    def _ended(self, job_id: str) -> Outcome | None:
        job = self.jobs.get(job_id)
        if job is not None:
            return Outcome(job.state, job.exit_code, started=job.started is not None) if job.final else None
        found = self.store.job_status(job_id) if self.store is not None else None
        if found is None:
            return None
        _, state, _, code, _, metadata = found[0]
        if not JobState(state).final:
            return None
        return Outcome(JobState(state), code, started=bool((metadata or {}).get("processes")))

    def _named_jobs(self, name: str) -> list[str]:
        """Unfinished jobs called ``name`` (a JobName dependency): a scan, paid only by such submits."""
        return [j.id for j in self.jobs.values() if j.description.name == name and not j.final]

    def _known_job(self, job_id: str) -> bool:
        return job_id in self.jobs or (self.store is not None and self.store.job_status(job_id) is not None)

    def _submit_sss(self, ident: bytes, raw: dict[str, Any]) -> dict[str, Any]:
        """An SSS Job or JobGroup: every job checked (model, distribution, matching against this
        allocation, dependencies and cycles) before any is accepted; all are accepted or none."""
        document = raw.get("sss")
        if not isinstance(document, str | bytes):
            return {"error": "an SSS submission carries its XML document as text under 'sss'"}
        try:
            jobs, warnings = read_submission(document)
            batch: list[tuple[JobRecord, SssJob]] = []
            for i, source in enumerate(jobs):
                job_id = str(self._seq + 1 + i)
                sss = prepare(source, self.cluster)
                self._check_sss(sss)
                description = dataclasses.replace(sss.groups[0].template.description, launcher="single")
                batch.append((JobRecord(id=job_id, description=description, sss=sss, user_hold=sss.hold), sss))
            self.graph.add([sss.new_job(job.id) for job, sss in batch], known=self._known_job, named=self._named_jobs)
        except DescriptionError as exc:  # SssError is one
            return {"error": str(exc)}
        for job, sss in batch:
            job.edges = self.graph.edges_of(job.id) or None
            if job.edges is None:  # found by id or name when someone depends on it
                self.graph.forget([job.id])
            entry = {**job.description.to_wire(), "sss": sss.xml, "edges": job.edges, "hold": job.user_hold}
            self._accept(ident, job, entry)
        return {"ids": [job.id for job, _ in batch], "warnings": warnings, "time": time.time()}

    def _check_sss(self, sss: SssJob) -> None:
        for g in sss.groups:
            self._check_launcher(g.launcher, what=f'{sss.effective.where}: Extension name="Launcher"')
        if (
            not self.cluster.nodes
            or any(h.usable and len(h.nodes) < h.allocation.nodes for h in self.held.values())
            or self._can_grow()
        ):
            return  # not every node is in yet, or more may come: judged when explained, not refused on a guess
        key = sss.request.key
        if key not in self._sss_fit:
            # A job runs inside one allocation: it fits if it fits one of them (even idle).
            per = [why_not(sss.request, self.matcher, g.resources, idle=True) for g in self._groups()]
            self._sss_fit[key] = [] if not per or not all(per) else per[0]
        reasons = self._sss_fit[key]
        if reasons:
            raise DescriptionError(f"{sss.effective.where} can never run in this allocation: " + "; ".join(reasons))

    def _check_launcher(self, launcher: str, *, what: str) -> None:
        """A launcher that needs another batch system (srun outside Slurm) is refused at submit."""
        needs = LAUNCHERS[launcher].needs_lrm
        if needs is None:
            return
        kinds = sorted({s.lrm.kind for s in self.sites})
        if needs not in kinds:
            raise DescriptionError(
                f"{what} {launcher!r} needs a {needs.capitalize()} allocation, and this pilot's "
                f"{'are' if len(kinds) > 1 else 'is'} {' and '.join(map(repr, kinds))}; use 'multiple' or 'mpirun'"
            )

    def _unblock(self, job: JobRecord) -> None:
        """A blocked job whose dependencies may be settled: to the queue, or FAILED if they never can be."""
        if job.id not in self._blocked or job.final:
            return
        verdict, reasons = self.graph.verdict(job.id)
        if verdict is Verdict.NEVER:
            del self._blocked[job.id]
            job.phase = "done"
            self._set_state(job, JobState.FAILED, time.time(), message="not started: " + "; ".join(reasons))
        elif verdict is Verdict.READY and not job.user_hold:
            del self._blocked[job.id]
            self.queue.push(job)

    def _settle(self, job: JobRecord) -> None:
        """A job ended that others may depend on: their verdicts follow (and theirs, and so on)."""
        settled = self.graph.finish(job.id, Outcome(job.state, job.exit_code, started=job.started is not None))
        for dep_id, _, _ in settled:
            dependent = self._blocked.get(dep_id)
            if dependent is not None:
                self._unblock(dependent)
        # Drop what nobody waits for any more: this job, and the ended jobs it waited for.
        node = self.graph.jobs.get(job.id)
        ended = [job.id] + [t for e in (node.edges if node else ()) for t in e.targets if t in self.graph.outcomes]
        self.graph.forget(ended)
        for j in ended:
            if j not in self.graph.jobs and j not in self.graph.dependents:
                self.graph.outcomes.pop(j, None)  # a later dependent gets it from memory or the journal

    def _check_agents_started(self) -> None:
        """Agents that have not registered ``agent_start_timeout`` after their allocation started are
        reported (status and log); when none came at all, the allocation is given up and released."""
        timeout = self.config.pilot.agent_start_timeout
        for held in self.held.values():
            a = held.allocation
            if a.started is None or held.missing_agents or not held.alive or self._stopping:
                continue
            registered = len(held.nodes)
            if registered >= a.nodes or time.time() - a.started < timeout:
                continue
            held.missing_agents = (
                f"{a.nodes - registered} of {a.nodes} agents did not register within {timeout:g} s "
                f"(pilot.agent_start_timeout); their logs are in {self.rundir.agents_dir}"
            )
            log.error("agents missing", allocation=held.key, message=held.missing_agents)
            if registered == 0:
                a.message = held.missing_agents
                self._allocation_ended(held)
                self._cancel_allocation(held)  # nothing of it is usable: do not keep paying for it

    def _close_before_end(self, held: PilotAllocation) -> None:
        """An allocation's walltime margin is reached: stop every task running on it now, so each ends
        with a clear message instead of being killed by the batch system with the allocation."""
        held.closing = True
        self._fit_cache.clear()
        log.warning(
            "allocation walltime nearly over; stopping running tasks",
            allocation=held.key,
            end=held.end(),
            margin=self.config.pilot.walltime_margin,
        )
        for job in self.jobs.values():
            if not job.final and job.processes and any(p.node in held.nodes for p in job.processes.values()):
                job.closing = True
                self._dirty.add(job)
                self._kill_outstanding(job, reason="walltime")

    def _allocation_ended(self, held: PilotAllocation) -> None:
        """The batch system ended an allocation under us (scancel, walltime, node failure) or it never
        started: every job on it ends FAILED with the batch system's own account, at once, not at
        heartbeat timeout. Queued jobs fail too when no allocation is left and none can come."""
        held.over = True
        self._fit_cache.clear()
        self._sss_fit.clear()
        allocation = held.allocation
        message = f"the allocation ({allocation.lrm} job {allocation.native_id}) ended: {allocation.message}"
        if held.released:
            log.info("allocation released", allocation=held.key, native_id=allocation.native_id)
        else:
            log.error(
                "allocation ended",
                allocation=held.key,
                native_id=allocation.native_id,
                state=allocation.state.value,
                message=allocation.message,
            )
            if not held.ready:
                self._failed_to_start(message)
        for name in sorted(held.nodes):
            agent = self.agents.get(name)
            if agent is not None:
                self._agent_gone(agent, message)
        self._fail_stranded(message)

    def _failed_to_start(self, what: str) -> None:
        """One more allocation that never started; ``autoscale.max_failures`` in a row stop auto-allocation."""
        self._failures += 1
        a = self.config.autoscale
        if a.enabled and self._failures >= a.max_failures and not self._autoscale_stopped:
            self._autoscale_stopped = (
                f"{self._failures} allocations in a row failed to start (autoscale.max_failures); the last: {what}"
            )
            log.error("auto-allocation stopped", reason=self._autoscale_stopped)
        self._journal_failures()

    def _journal_failures(self) -> None:
        """The count of failed allocations in a row (and whether it stopped auto-allocation) outlives a
        restart: a daemon killed between failures must not start over and request more than
        ``autoscale.max_failures`` in a row."""
        self._tx.meta(_AUTOSCALE_META, {"failures": self._failures, "stopped": self._autoscale_stopped})

    def _restore_failures(self, value: Any) -> None:
        if value is None:
            return
        failures = value.get("failures") if isinstance(value, dict) else None
        stopped = value.get("stopped") if isinstance(value, dict) else None
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0 or not isinstance(stopped, str):
            log.warning("the journal's count of failed allocations is damaged; counting from 0", value=repr(value))
            return
        self._failures, self._autoscale_stopped = failures, stopped

    def _fail_stranded(self, message: str) -> None:
        """Queued jobs fail when no allocation is left and none can come: never a hang."""
        if self._may_run_later(None):
            return
        reason = self._autoscale_stopped or message
        for job in list(self.jobs.values()):
            if job.phase == "queued" and not job.final:
                job.phase = "done"
                self._dequeue(job)
                self._set_state(job, JobState.FAILED, time.time(), message=reason)

    def _can_grow(self) -> bool:
        """Auto-allocation may still bring another allocation."""
        return self.config.autoscale.enabled and not self._autoscale_stopped and not self._stopping

    def _may_run_later(self, duration: float | None, *, needs: str | None = None) -> bool:
        """Whether a job of this duration (and launcher's batch system) may start on an allocation
        held now or on one auto-allocation can still bring."""
        now = time.time()
        if any(h.usable and h.takes(duration, needs, now=now) for h in self.held.values()):
            return True
        return self._can_grow() and any(s.could_take(duration, needs) for s in self.sites)

    def _room_to_grow(self) -> bool:
        """More capacity may come: an allocation is starting, or auto-allocation may request one."""
        a = self.config.autoscale
        if not self._can_grow():
            return False
        alive = [h for h in self.held.values() if h.alive]
        if any(not h.ready for h in alive):
            return True  # one is on its way
        held_nodes = sum(h.allocation.nodes for h in alive)
        smallest = min(s.settings.nodes for s in self.sites)
        return len(alive) < a.max_pilots and (a.max_nodes is None or held_nodes + smallest <= a.max_nodes)

    def _all_over(self) -> bool:
        return not any(h.alive for h in self.held.values()) and not self._can_grow()

    # -- auto-allocation ----------------------------------------------------------------------------

    def _autoscale(self) -> None:
        """Release allocations idle for ``idle_timeout``; request one more when queued work has waited
        ``grow_after`` and none is on its way, within ``max_pilots`` and ``max_nodes``."""
        cfg = self.config.autoscale
        if not cfg.enabled or self._stopping or self._tg is None:
            return
        now = time.monotonic()
        alive = [h for h in self.held.values() if h.alive]
        if cfg.idle_timeout is not None:
            # Of several idle, the one ending first goes first: those kept have the most time left.
            for held in sorted(alive, key=lambda h: h.end() or float("inf")):
                if not held.ready or len(self.queue) or self._busy(held):
                    held.idle_since = None
                    continue
                if held.idle_since is None:
                    held.idle_since = now
                elif now - held.idle_since >= cfg.idle_timeout and len(alive) > cfg.min_pilots:
                    self._release(held)
                    alive.remove(held)
        if not len(self.queue) or self._draining:
            self._backlog_since = None
            return
        if self._backlog_since is None:
            self._backlog_since = now
        if (
            self._autoscale_stopped
            or self._growing
            or now - self._backlog_since < cfg.grow_after
            or any(not h.ready for h in alive)  # one is on its way: its nodes may be enough
            or len(alive) >= cfg.max_pilots
        ):
            return
        held_nodes = sum(h.allocation.nodes for h in alive)
        source = self._site_for_backlog(room=None if cfg.max_nodes is None else cfg.max_nodes - held_nodes)
        if source is None:
            return
        self._growing = True
        self._backlog_since = now  # the next one waits grow_after again
        self._tg.start_soon(self._grow, source)

    def _busy(self, held: PilotAllocation) -> bool:
        for name in held.nodes:
            agent = self.agents.get(name)
            slots = self.nodes.get(name)
            if (agent is not None and agent.processes) or (slots is not None and slots.holders):
                return True
        return False

    def _site_for_backlog(self, *, room: int | None) -> Site | None:
        """The first site (config order) within the node limit whose allocations could run the oldest
        queued jobs (launcher's batch system, duration within its walltime)."""
        heads = [j for k, _ in self.queue.heads() if (j := self.queue.peek(k)) is not None][:16]
        for s in self.sites:
            if room is not None and s.settings.nodes > room:
                continue
            if any(s.could_take(job.description.duration, self._needs_lrm(job)) for job in heads):
                return s
        return None

    async def _grow(self, source: Site) -> None:
        try:
            held = await self._acquire(source)
            log.info("auto-allocation: another allocation requested", allocation=held.key, site=source.name)
        except Exception as exc:  # the batch system's command failed: counted like a refusal
            log.error("auto-allocation: request failed", site=source.name, error=str(exc))
            self._failed_to_start(f"site {source.name}: {exc}")
            self._fail_stranded(f"auto-allocation failed: site {source.name}: {exc}")
        finally:
            self._growing = False
            self.poke()

    def _release(self, held: PilotAllocation) -> None:
        """An idle allocation goes back to the batch system: nothing new is placed there, its agents
        are told to stop, then it is cancelled."""
        held.released = True
        self._fit_cache.clear()
        log.info("auto-allocation: releasing an idle allocation", allocation=held.key, native=held.allocation.native_id)
        for name in held.nodes:
            agent = self.agents.get(name)
            if agent is not None and agent.state == "active":
                self._to_agent(name, wire.Kind.STOP, {"reason": "allocation released: idle"})
        self._cancel_allocation(held)
        self.poke()

    def _cancel_allocation(self, held: PilotAllocation) -> None:
        if held.cancelling or held.allocation.state.final or self._tg is None:
            return
        held.cancelling = True
        self._tg.start_soon(self._cancel_in_batch_system, held)

    async def _cancel_in_batch_system(self, held: PilotAllocation) -> None:
        try:
            await held.site.lrm.cancel(held.allocation)
        except Exception as exc:
            log.error("cannot release the allocation", allocation=held.key, error=str(exc))
        self.poke()

    def _never_fits(self, description: JobDescription) -> str | None:
        """never_fits against each allocation (a job runs inside one), once per request category while
        the node sets stay the same: per submitted job it would cost O(nodes) on the submit path."""
        key = description.resources.key
        if key not in self._fit_cache:
            reasons = [never_fits(description.resources, nodes) for nodes in self._capacities()]
            self._fit_cache[key] = None if not reasons or None in reasons else reasons[0]
        return self._fit_cache[key]

    def _capacities(self) -> list[list[NodeSlots]]:
        """Per usable allocation: its registered nodes, plus the ones it promises that have not
        registered yet ([] while a batch allocation's shape is unknown: anything may fit). With
        auto-allocation, the sites it may draw from count too (a batch site's shape is unknown)."""
        out: list[list[NodeSlots]] = []
        for held in self.held.values():
            if not held.usable:
                continue
            nodes = [self.nodes[n] for n in held.nodes if n in self.nodes and self.nodes[n].usable]
            a = held.allocation
            if not a.expected_nodes and len(nodes) < a.nodes:
                return [[]]
            nodes += [NodeSlots.from_configured(n) for n in a.expected_nodes if n.name not in self.nodes]
            out.append(nodes)
        if self._can_grow():
            for s in self.sites:
                layout = getattr(s.lrm, "node_layout", None)
                if layout is None:
                    return [[]]
                out.append([NodeSlots.from_configured(n) for n in layout(s.settings.nodes)])
        return out

    # -- explain, show, nodes, release ---------------------------------------------------------------

    def _explain(self, job_id: str) -> dict[str, Any]:
        """Why a job is still QUEUED (what it waits for, or which requirement no node meets), or how it
        ended: for 'pilot explain' and the client's explain()."""
        job = self.jobs.get(job_id)
        if job is None:
            found = self.store.job_status(job_id) if self.store is not None else None
            if found is None:
                return {"error": f"no job {job_id!r} in this pilot"}
            _, state, _, code, message, _ = found[0]
            return {"id": job_id, "state": state, "reasons": [_ended_reason(state, code, message)]}
        state = job.state.value
        if job.final:
            return {"id": job_id, "state": state, "reasons": [_ended_reason(state, job.exit_code, job.message)]}
        if job.phase != "queued":
            return {"id": job_id, "state": state, "reasons": [self._dispatched_reason(job)]}
        reasons: list[str] = []
        if job.user_hold:
            reasons.append(f"it is held (SSS <Hold>): 'pilot release {job_id}' lets it run")
        if job.id in self._blocked:
            verdict, waits = self.graph.verdict(job.id)
            reasons += waits if verdict is Verdict.WAIT else []
            if reasons:
                return {"id": job_id, "state": state, "reasons": reasons}
        if not self.cluster.nodes:
            return {
                "id": job_id,
                "state": state,
                "reasons": ["no node has registered yet (the allocation is starting)", *self._coming()],
            }
        if job.sss is not None:
            never = why_not(job.sss.request, self.matcher, self.resources, idle=True)
            if never:
                return {"id": job_id, "state": state, "reasons": ["it can never run here: " + r for r in never]}
            now = why_not(job.sss.request, self.matcher, self.resources)
            reasons += [f"waits for resources: {r}" for r in now] or ["it fits now: the next scheduling pass starts it"]
        else:
            r = job.description.resources
            never_reason = self._never_fits(job.description)
            if never_reason is not None:
                return {"id": job_id, "state": state, "reasons": [f"it can never run here: it {never_reason}"]}
            free = sum(len(n.free_cores) for n in self.nodes.values() if n.usable)
            reasons.append(
                f"waits for resources: needs {r.process_count} process(es) of {r.cpu_cores_per_process} core(s)"
                + (f" and {r.gpu_cores_per_process} GPU(s)" if r.gpu_cores_per_process else "")
                + f"; {free} core(s) are free now"
            )
        ahead = sum(
            1
            for j in self.jobs.values()
            if j.phase == "queued"
            and j.key == job.key
            and _id_order(j.id) < _id_order(job.id)
            and j.id not in self._blocked
        )
        if ahead:
            reasons.append(f"{ahead} job(s) with the same request were queued before it")
        return {"id": job_id, "state": state, "reasons": reasons + self._coming()}

    def _dispatched_reason(self, job: JobRecord) -> str:
        """A placed job: running, or sent to its node behind a busy core (pilot.backlog) and not started
        yet, or being asked back from there (WITHDRAW) to be placed again."""
        nodes = ", ".join(sorted({r.node for r in job.ranks}))
        since = self._waiting.get(job.id)
        if since is None:
            return f"it is running ({job.phase}) on {nodes}"
        cores = ", ".join(str(c) for r in job.ranks for c in r.cores)
        waited = f"{time.monotonic() - since:.2f} s"
        if job.id in self._withdrawing:
            return (
                f"it waited {waited} on {nodes} for core(s) {cores}, still busy with an earlier task, and is being "
                "taken back from that node's agent to be placed again on a core that is free now"
            )
        return (
            f"it is on {nodes} and starts there as soon as core(s) {cores} are free: placed behind a running "
            f"task (pilot.backlog) {waited} ago; after {_RECLAIM_AFTER:g} s it is taken back to a free core, if "
            "one comes first"
        )

    def _coming(self) -> list[str]:
        """What may still add room: allocations on their way, auto-allocation's state."""
        notes = [
            f"allocation {h.key} (site {h.site.name}) is {h.allocation.state.value}: its nodes may take it"
            for h in self.held.values()
            if h.alive and not h.ready
        ]
        if self._growing:
            notes.append("auto-allocation is requesting another allocation")
        elif self._autoscale_stopped:
            notes.append(f"auto-allocation stopped: {self._autoscale_stopped}")
        return notes

    def _show(self, job_id: str) -> dict[str, Any]:
        """The job as SSS Job XML with its State, times, Delivered and (once placed) its Task elements."""
        job = self.jobs.get(job_id)
        if job is not None:
            source = job.sss.shown if job.sss is not None else to_sss(job.description)
            status: list[Any] = [job.id, job.state.value, job.state_time, job.exit_code, job.message, job.metadata]
            started, ended, held = job.started, job.ended, job.user_hold
            tasks = self._task_status(job)
            submitted: float | None = job.submitted
        else:
            found = self.store.job_record(job_id) if self.store is not None else None
            if found is None:
                return {"error": f"no job {job_id!r} in this pilot"}
            raw, status, submitted, started, ended = found
            try:
                plain = {k: v for k, v in raw.items() if k not in SSS_KEYS}
                source = read_submission(raw["sss"])[0][0] if "sss" in raw else to_sss(JobDescription.from_wire(plain))
            except DescriptionError as exc:
                return {"error": f"job {job_id}: its journaled description cannot be read: {exc}"}
            held = False
            tasks = [
                TaskStatus(int(g), int(t), str(n), list(c), list(gp))
                for g, t, n, c, gp in (status[5] or {}).get("tasks", [])
            ]
        st = JobStatus(
            id=job_id,
            state=JobState(status[1]),
            held=held,
            exit_code=status[3],
            message=status[4],
            submit_time=submitted,
            start_time=started,
            end_time=ended,
            delivered=status[5] or {},
            tasks=tasks,
        )
        return {"id": job_id, "xml": write_job(job_with_status(source, st))}

    def _task_status(self, job: JobRecord) -> list[TaskStatus]:
        if job.sss is not None and job.sss.placement is not None:
            return [TaskStatus(t.group, t.task, t.node, t.cores, t.gpus) for t in job.sss.placement.tasks]
        return [TaskStatus(0, i, r.node, r.cores, r.gpus) for i, r in enumerate(job.ranks)]

    def _node_objects(self) -> list[NodeObject]:
        out = []
        for name, agent in self.agents.items():
            slots = self.nodes.get(name)
            m = self.cluster.nodes.get(name)
            ledger = self.resources.ledgers.get(name)
            out.append(
                node_object(
                    agent.node,
                    state={"active": "Idle" if slots is not None and not slots.holders else "Busy"}.get(
                        agent.state, "Down"
                    ),
                    free_processors=len(slots.free_cores) if slots is not None else None,
                    free_gpus=len(slots.free_gpus) if slots is not None else None,
                    free_memory=slots.free_memory if slots is not None else None,
                    utilized=agent.utilized or None,
                    resources={
                        k.removeprefix("Resource:"): (cap, ledger.free.get(k, 0.0))
                        for k, cap in ledger.capacity.items()
                    }
                    if ledger is not None
                    else None,
                    attributes={k: v for k, v in m.values.effective(self.cluster.registry).items()}
                    if m is not None
                    else None,
                    features=sorted(m.features) if m is not None else None,
                )
            )
        return out

    def _release_hold(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None or job.final:
            return {"error": f"job {job_id!r} is not waiting in this pilot"}
        if not job.user_hold:
            return {"id": job_id, "released": False}
        job.user_hold = False
        self._unblock(job)
        return {"id": job_id, "released": True}

    def _cancel_request(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            if self.store is not None and self.store.job_status(job_id) is not None:
                return {"id": job_id}  # it has ended already: nothing to cancel
            return {"error": f"no job {job_id!r} in this pilot"}
        self._cancel(job, reason="canceled")
        return {"id": job_id}

    def _attach(self, ident: bytes, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            found = self.store.job_status(job_id) if self.store is not None else None
            if found is None:
                return {"error": f"no job {job_id!r} in this pilot"}
            status, name = found  # ended: its final status is all there is to follow
            return {"id": job_id, "status": status, "name": name}
        job.subscribers.add(ident)
        return {"id": job_id, "status": job.status(), "name": job.description.name}

    # -- agent socket -------------------------------------------------------------------------------

    def _on_agent(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            log.warning("dropped agent message", reason=f"{len(frames) - 1} payload frames, expected 1")
            return
        ident, payload = frames
        try:
            name = ident.decode()
            msg = wire.decode(payload, allowed=wire.AGENT_KINDS)
            self._handle_agent(name, msg)
        except (wire.ProtocolError, UnicodeDecodeError) as exc:
            log.warning("dropped agent frame", reason=str(exc), size=len(payload))

    def _to_agent(self, name: str, kind: str, body: dict[str, Any]) -> None:
        self._agent_frames.append([ident_of(name), wire.encode(kind, body)])

    def _handle_agent(self, name: str, msg: wire.Message) -> None:
        agent = self.agents.get(name)
        if msg.kind == wire.Kind.REGISTER:
            node = NodeConfigured.from_wire(wire.field(msg.body, "node", dict))
            if node.name != name:
                raise wire.ProtocolError(f"agent {name!r} registers as {node.name!r}")
            owner = self.held.get(node_allocation_key(name))
            if owner is None or (agent is None and not owner.alive):
                raise wire.ProtocolError(f"agent {name!r} is not a node of an allocation this pilot holds")
            expected = owner.allocation.expected_nodes
            if expected and name not in {n.name for n in expected}:
                raise wire.ProtocolError(f"agent {name!r} is not a node of allocation {owner.key}")
            running = wire.field(msg.body, "running", list)
            events = wire.opt_field(msg.body, "events", list, [])
            seq = wire.opt_field(msg.body, "seq", int, 0)
            if not all(isinstance(k, list) and len(k) == 2 for k in running):
                raise wire.ProtocolError("running keys must be [job_id, slot] pairs")
            if agent is not None and agent.state == "active" and agent.confirmed:
                agent.last_seen = time.monotonic()  # a repeated REGISTER: its events are replays
                for ev in events:
                    self._on_process_event(agent, ev)
            elif agent is not None and agent.state == "active":
                self._readopt(agent, node, running, events)
            else:
                self._register(node)
                agent = self.agents[name]
                for ev in events:
                    self._on_process_event(agent, ev)  # all for processes this daemon gave up: dropped
                if running:
                    # Processes this daemon does not know (or declared lost): the agent must not keep them.
                    self._kills[name]["unknown to the daemon"].extend(running)
            agent.acked = max(agent.acked, seq)
            self._node_measures(agent, msg.body)
            self._to_agent(
                name,
                wire.Kind.REGISTERED,
                {"heartbeat_interval": self.config.pilot.heartbeat_interval, "acked": agent.acked},
            )
            if self._stopping:
                # Registered after the pilot began stopping: it missed the STOP the others got.
                self._to_agent(name, wire.Kind.STOP, {"reason": "pilot stopped"})
        elif agent is None or agent.state != "active":
            self._to_agent(name, wire.Kind.HEARTBEAT, {"known": False})
        elif not agent.confirmed:
            # Recovered from the journal, not re-registered yet: its events come with its REGISTER.
            self._to_agent(name, wire.Kind.HEARTBEAT, {"known": False})
        elif msg.kind == wire.Kind.HEARTBEAT:
            agent.last_seen = time.monotonic()
            load = msg.body.get("load")
            if isinstance(load, list) and all(isinstance(x, int | float) for x in load):
                agent.load = load[:3]
            self._node_measures(agent, msg.body)
            self._to_agent(name, wire.Kind.HEARTBEAT, {"known": True, "acked": agent.acked})
        elif msg.kind == wire.Kind.TASK_EVENTS:
            agent.last_seen = time.monotonic()
            seq = wire.opt_field(msg.body, "seq", int, 0)
            for ev in wire.field(msg.body, "events", list):
                self._on_process_event(agent, ev)
            agent.acked = max(agent.acked, seq)
        elif msg.kind == wire.Kind.BYE:
            self._agent_gone(agent, f"agent on {name} exited", state="stopped")

    def _register(self, node: NodeConfigured) -> None:
        self._fit_cache.clear()
        self._sss_fit.clear()
        owner = self.held.get(node_allocation_key(node.name))
        if owner is not None:
            was_ready = owner.ready
            owner.nodes.add(node.name)
            if owner.ready and not was_ready and self._failures:
                self._failures = 0  # one started: auto-allocation's count of failures in a row starts again
                self._journal_failures()
        self.agents[node.name] = AgentRecord(name=node.name, node=node)
        self.nodes[node.name] = NodeSlots.from_configured(node)
        self.cluster.add(site.match_node(self.config, self.cluster.registry, node))
        capacity = site.node_capacity(self.config, node.name)
        if capacity:
            self.resources.ledgers[node.name] = ConsumableLedger.of(capacity)
        self._tx.node_registered(node)
        log.info("agent registered", node=node.name, cores=len(node.processors), gpus=len(node.gpus))

    def _node_measures(self, agent: AgentRecord, body: dict[str, Any]) -> None:
        """A heartbeat's load values (SGE load_avg, mem_free, ...) refresh what matching sees; its
        utilization (psutil on the node) is the SSS Node's Utilized category."""
        values = body.get("values")
        if isinstance(values, dict) and len(values) <= 64:
            m = self.cluster.nodes.get(agent.name)
            if m is not None:
                clean = {k: v for k, v in values.items() if isinstance(k, str) and isinstance(v, int | float | str)}
                before = m.values.version
                m.values.report_load(self.cluster.registry, clean)
                if m.values.version != before:
                    self.cluster.touch()
        used = body.get("utilized")
        if isinstance(used, dict) and len(used) <= 16:
            agent.utilized = {k: float(v) for k, v in used.items() if isinstance(k, str) and isinstance(v, int | float)}

    def _readopt(self, agent: AgentRecord, node: NodeConfigured, running: list[Any], events: list[Any]) -> None:
        """An agent of the allocation this daemon resumed is back. Its running processes that the journal
        holds are adopted; its buffered events (everything not acknowledged before the crash) are
        replayed; processes it runs that the journal does not hold are killed; orders the journal says
        were sent but the agent never got are sent again; kills it may have missed are sent again."""
        if node.to_wire() != agent.node.to_wire():
            log.warning("agent came back with another node description", node=agent.name)
        agent.confirmed = True
        agent.last_seen = time.monotonic()
        self.nodes[agent.name].usable = True
        self._fit_cache.clear()
        self._sss_fit.clear()
        keys = {(k[0], k[1]) for k in running if isinstance(k[0], str) and isinstance(k[1], int)}
        for ev in events:
            self._on_process_event(agent, ev)
        unknown = [list(k) for k in keys if k not in agent.processes]
        if unknown:
            self._kills[agent.name]["unknown to the daemon"].extend(unknown)
        resent = 0
        for job_id, slot in sorted(agent.processes):
            job = self.jobs.get(job_id.partition("~")[0])
            plan = job.processes.get(slot) if job is not None else None
            if job is None or plan is None:
                continue
            if (job_id, slot) not in keys:
                self._orders[agent.name].append(plan.order.to_wire())  # never reached the agent
                resent += 1
            elif job.cancel_reason is not None:
                self._kills[agent.name]["canceled"].append([job_id, slot])
            elif job.closing:
                self._kills[agent.name]["walltime"].append([job_id, slot])
        log.info(
            "agent re-adopted",
            node=agent.name,
            running=len(keys) - len(unknown),
            replayed_events=len(events),
            killed_unknown=len(unknown),
            resent_orders=resent,
        )

    def _agent_gone(self, agent: AgentRecord, message: str, *, state: str = "lost") -> None:
        if agent.state != "active":
            return
        self._fit_cache.clear()
        self._sss_fit.clear()
        self.cluster.remove(agent.name)
        agent.state = state
        slots = self.nodes.get(agent.name)
        if slots is not None:
            slots.usable = False
        log.warning("agent gone", node=agent.name, reason=message) if state == "lost" else log.info(
            "agent stopped", node=agent.name
        )
        held = self.held.get(node_allocation_key(agent.name))
        if state == "lost" and held is not None and self._tg is not None and not self._stopping:
            self._tg.start_soon(held.site.lrm.node_lost, held.allocation, agent.name)
        for job_id, slot in sorted(agent.processes):
            job = self.jobs.get(job_id.partition("~")[0])
            plan = job.processes.get(slot) if job else None
            if job is not None and plan is not None and plan.order.job_id == job_id:
                self._process_done(
                    job, slot, ProcessResult(agent.name, plan.order.role, message=message, reason="lost")
                )

    def _on_process_event(self, agent: AgentRecord, ev: Any) -> None:
        if not (isinstance(ev, list) and len(ev) == 5):
            raise wire.ProtocolError("a task event is [job_id, slot, kind, time, data]")
        job_id, slot, kind, t, data = ev
        if not (
            isinstance(job_id, str)
            and isinstance(slot, int)
            and isinstance(kind, str)
            and isinstance(t, int | float)
            and isinstance(data, dict)
        ):
            raise wire.ProtocolError("a task event has wrong field types")
        job = self.jobs.get(job_id.partition("~")[0])
        plan = job.processes.get(slot) if job is not None else None
        if job is None or plan is None or plan.node != agent.name or plan.order.job_id != job_id:
            # A replay of an event already handled (after a restart or a re-register), or a process
            # this daemon gave up (node declared lost): nothing to do.
            log.debug("event for a process this node does not hold", node=agent.name, job=job_id, slot=slot, kind=kind)
            return
        if kind == "started":
            self._stop_waiting(job.id)
            if job.started is None:
                job.started = float(t)
                self._dirty.add(job)
            if job.state is JobState.QUEUED:
                self._set_state(job, JobState.ACTIVE, float(t))
        elif kind == "failed":
            self._process_done(job, slot, ProcessResult(agent.name, plan.order.role, message=str(data.get("message"))))
        elif kind == "withdrawn":
            # Sent at our request, and authoritative: the order is gone from the agent (also when the
            # request came from before a daemon restart, replayed with the agent's REGISTER). Only an
            # order placed behind a busy core and not known to have started can be given back.
            if plan.order.after_cores and job.id in self._waiting:
                self._withdrawn(job, slot)
            else:
                log.warning("agent gave back an order it could not have held unstarted", node=agent.name, job=job_id)
        elif kind == "exited":
            started = data.get("started")
            if job.started is None and isinstance(started, int | float) and not isinstance(started, bool):
                job.started = float(started)  # its start came in the same batch as its exit
            job.ended = max(job.ended or 0.0, float(t))
            result = ProcessResult(
                agent.name,
                plan.order.role,
                exit_code=_opt_int(data.get("exit_code")),
                signal=_opt_int(data.get("signal")),
                reason=data.get("reason") if isinstance(data.get("reason"), str) else None,
                data=data,
            )
            if data.get("spawned") is False:
                result.message = result.reason or "not started"
            if plan.order.role == "pre":
                env = data.get("environment")
                if isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                    job.environment = env
                unset = data.get("unset")
                if isinstance(unset, list) and all(isinstance(k, str) for k in unset):
                    job.unset = unset
                self._tx.pre_launch_environment(job.id, job.environment, job.unset)
            self._process_done(job, slot, result)
        else:
            raise wire.ProtocolError(f"unknown task event kind {kind!r}")

    # -- job lifecycle ------------------------------------------------------------------------------

    def _schedule(self) -> None:
        if not len(self.queue) or not self.nodes or self._stopping:
            return
        groups = self._groups()
        # While auto-allocation may still add an allocation, jobs wait in the queue, where they count as
        # demand and can go to the new one, not behind a busy core of an allocation held now.
        behind = 0 if self._room_to_grow() else self.config.pilot.backlog
        now = time.time()
        sss_passes: dict[str, SchedulingPass] = {}  # one per allocation and pass: category cursors stay valid
        # Every allocation takes every job (no walltime, one batch system): no per-job filtering.
        open_ended = all(g.held.allocation.walltime is None for g in groups)
        kinds = {g.held.site.lrm.kind for g in groups}
        for key, _ in self.queue.heads():
            while (job := self.queue.peek(key)) is not None:
                d = job.description
                needs = self._needs_lrm(job)
                eligible = groups
                if not ((open_ended or d.duration is None) and (needs is None or kinds == {needs})):
                    eligible = [g for g in groups if g.held.takes(d.duration, needs, now=now)]
                if job.sss is not None:
                    placement = None
                    for g in eligible:
                        sss_pass = sss_passes.get(g.held.key)
                        if sss_pass is None:
                            sss_pass = sss_passes[g.held.key] = SchedulingPass(self.matcher, g.resources)
                        if (placement := sss_pass.place(job.id, job.sss.request)) is not None:
                            break
                    if placement is not None:
                        job.sss.placement = placement
                        self.queue.pop_head(key)
                        self._start(job, [RankPlacement(t.node, t.cores, t.gpus, t.memory) for t in placement.tasks])
                        continue
                else:
                    ranks = None
                    for g in eligible:
                        if (ranks := place(d.resources, g.nodes, job_id=job.id)) is not None:
                            break
                    if (
                        ranks is None
                        and behind
                        and can_wait_behind(d.resources)
                        and not (d.pre_launch or d.post_launch)
                    ):
                        # No free core in any allocation: wait at an agent behind a busy one.
                        for g in eligible:
                            if (ranks := place_behind(d.resources, g.nodes, depth=behind)) is not None:
                                break
                    if ranks is not None:
                        self.queue.pop_head(key)
                        self._start(job, ranks)
                        continue
                if self._may_run_later(d.duration, needs=needs):
                    break
                # It cannot finish before any allocation ends, and no later allocation will come.
                self.queue.pop_head(key)
                job.phase = "done"
                ends = [e for h in self.held.values() if h.alive and (e := h.end(earliest=True)) is not None]
                left = max(0.0, max(ends, default=now) - now)
                closing = not any(h.usable for h in self.held.values())
                self._set_state(
                    job,
                    JobState.FAILED,
                    now,
                    message=(
                        f"not started: JobAttributes.duration of {d.duration:g} s cannot finish before the "
                        f"allocation's walltime ends in {left:.0f} s, and no later allocation will come"
                        if d.duration is not None and not closing
                        else f"not started: the allocation's walltime ends in {left:.0f} s"
                        if ends
                        else "not started: no allocation is left and none can come"
                    ),
                )

    def _groups(self) -> list[_Group]:
        """Where a scheduling pass may place: each usable allocation with its usable nodes (a job runs
        inside one allocation). One allocation: everything, as a single-allocation pilot always did."""
        usable = [h for h in self.held.values() if h.usable]
        if len(usable) == 1 and len(self.held) == 1:
            h = usable[0]
            return [_Group(h, [n for n in self.nodes.values() if n.usable], self.resources)]
        out = []
        for h in usable:
            slots = {n: s for n, s in self.nodes.items() if n in h.nodes and s.usable}  # registration order
            if slots:
                res = Resources(slots, self.resources.ledgers, self.resources.global_ledger)
                out.append(_Group(h, list(slots.values()), res))
        return out

    @staticmethod
    def _needs_lrm(job: JobRecord) -> str | None:
        """The batch system a job's launcher needs (srun: Slurm), so it is placed only there."""
        if job.sss is None:
            return LAUNCHERS[job.description.launcher].needs_lrm
        return next((n for g in job.sss.groups if (n := LAUNCHERS[g.launcher].needs_lrm) is not None), None)

    def _start(self, job: JobRecord, ranks: list[Any]) -> None:
        d = job.description
        job.ranks = ranks
        job.held = [True] * len(ranks)
        self._placed.add(job)
        self._dirty.add(job)
        plans = self._plan(job, environment=None)
        shared_output = len(plans) > 1 and (d.stdout_path or d.stderr_path)
        if job.sss is not None and not job.sss.groups[0].template.truncate:
            shared_output = False  # redirectList="Append": earlier output stays
        if d.pre_launch or shared_output:
            job.phase = "pre"
            order = self._hook_order(job, PRE, "pre", d.pre_launch, truncate=True)
            order.cores = ranks[0].cores
            self._dispatch(job, PlannedProcess(ranks[0].node, order, []))
        else:
            job.phase = "ranks"
            for p in plans:
                if ranks[0].behind:
                    p.order.after_cores = True
                    self._waiting[job.id] = time.monotonic()
                self._dispatch(job, p)

    def _start_ranks(self, job: JobRecord) -> None:
        job.phase = "ranks"
        self._dirty.add(job)
        plans = self._plan(job, environment=job.environment)
        for p in plans:
            p.order.truncate_output = False
            p.order.pre_unset = list(job.unset)
            p.order.walltime = self._walltime_left(job)
            self._dispatch(job, p)

    def _plan(self, job: JobRecord, *, environment: dict[str, str] | None) -> list[PlannedProcess]:
        if job.sss is not None:
            return self._plan_sss(job, job.sss, environment=environment)
        plans = self.launchers[job.description.launcher].plan(
            job_id=job.proc_id,
            description=job.description,
            ranks=job.ranks,
            hosts=self._hosts(job),
            environment=environment,
        )
        if job.attempt:
            for p in plans:
                p.order.rank_environment["PILOT_JOB_ID"] = job.id
        return plans

    def _plan_sss(self, job: JobRecord, sss: SssJob, *, environment: dict[str, str] | None) -> list[PlannedProcess]:
        """Each task group by its launcher: one process per task (each running its own Task element's
        executable, streams and limits), or one parallel launch; slots are the job's rank indices."""
        assert sss.placement is not None
        tasks = sss.placement.tasks
        hosts = self._hosts(job)
        members: dict[int, list[int]] = defaultdict(list)
        for i, t in enumerate(tasks):
            members[t.group].append(i)
        plans: list[PlannedProcess] = []
        for group, indices in sorted(members.items()):
            g = sss.groups[group]
            group_hosts = [hosts[i] for i in indices]
            if g.launcher != "multiple":
                d = dataclasses.replace(
                    g.template.description,
                    launcher=g.launcher,
                    resources=dataclasses.replace(
                        sss.request.variants[sss.placement.variant][group].slot_request, process_count=len(indices)
                    ),
                )
                for p in self.launchers[g.launcher].plan(
                    job_id=job.proc_id,
                    description=d,
                    ranks=[job.ranks[i] for i in indices],
                    hosts=group_hosts,
                    environment=environment,
                ):
                    p.order.slot = indices[p.order.slot] if p.order.slot >= 0 else p.order.slot
                    p.holds = [indices[h] for h in p.holds]
                    p.order.rank_environment["PILOT_TASK_GROUP"] = str(group)
                    plans.append(p)
                continue
            for i in indices:
                t = tasks[i]
                launch = g.task(t.task)
                order = rank_order(
                    job_id=job.proc_id,
                    slot=i,
                    description=launch.description,
                    cores=t.cores,
                    gpus=t.gpus,
                    hosts=group_hosts,
                    environment=environment,
                    truncate=launch.truncate and len(tasks) == 1,
                )
                order.rank_environment["PILOT_TASK_GROUP"] = str(group)
                order.rank_environment["PILOT_TASK_ID"] = str(t.task)
                order.rlimits = [[r.resource, r.soft, r.hard] for r in launch.rlimits]
                plans.append(PlannedProcess(t.node, order, [i]))
        if job.attempt:
            for p in plans:
                p.order.rank_environment["PILOT_JOB_ID"] = job.id
        return plans

    def _walltime_left(self, job: JobRecord) -> float | None:
        """JobAttributes.duration bounds the whole job (pre_launch, ranks, post_launch), not each process."""
        duration = job.description.duration
        if duration is None or job.started is None:
            return duration
        return max(0.001, duration - (time.time() - job.started))

    def _hook_order(self, job: JobRecord, slot: int, role: str, script: str | None, *, truncate: bool) -> ProcessOrder:
        d = job.description
        env = job.environment
        return ProcessOrder(
            job_id=job.proc_id,
            slot=slot,
            role=role,
            executable="/bin/sh",
            environment=d.environment,
            pre_environment=env or {},
            pre_unset=list(job.unset),
            inherit_environment=d.inherit_environment,
            directory=job_directory(d),
            stdout_path=d.stdout_path,
            stderr_path=d.stderr_path,
            truncate_output=truncate,
            walltime=self._walltime_left(job),
            rank_environment={"PILOT_JOB_ID": job.id, "PILOT_SIZE": str(len(job.ranks))},
            nodefile_hosts=self._hosts(job),
            script=script,
        )

    def _hosts(self, job: JobRecord) -> list[str]:
        return [self.nodes[r.node].hostname for r in job.ranks]

    def _dispatch(self, job: JobRecord, plan: PlannedProcess) -> None:
        agent = self.agents.get(plan.node)
        job.processes[plan.order.slot] = plan
        if agent is None or agent.state != "active":
            self._process_done(
                job, plan.order.slot, ProcessResult(plan.node, plan.order.role, message=f"node {plan.node} is gone")
            )
            return
        agent.processes.add((plan.order.job_id, plan.order.slot))
        order = plan.order.to_wire()
        self._orders[plan.node].append(order)
        self._tx.process_dispatched(job.id, plan, order_wire=order)

    def _process_done(self, job: JobRecord, slot: int, result: ProcessResult) -> None:
        self._stop_waiting(job.id)
        plan = job.processes.pop(slot, None)
        if plan is None:
            return
        agent = self.agents.get(plan.node)
        if agent is not None:
            agent.processes.discard((plan.order.job_id, slot))
        job.results[slot] = result
        self._new_results.append((job, slot, result))
        self._dirty.add(job)
        for i in plan.holds:
            self._release_rank(job, i)
        if not result.ok and job.cancel_reason is None and result.role != "post":
            self._kill_outstanding(job, reason=f"another process of job {job.id} failed")
        if job.processes:
            return
        failed = any(not r.ok for r in job.results.values())
        if job.phase == "pre" and not failed and job.cancel_reason is None:
            self._start_ranks(job)
        elif job.phase == "ranks" and not failed and job.cancel_reason is None and job.description.post_launch:
            job.phase = "post"
            self._dirty.add(job)
            self._dispatch(
                job,
                PlannedProcess(
                    job.ranks[0].node,
                    self._hook_order(job, POST, "post", job.description.post_launch, truncate=False),
                    [],
                ),
            )
        elif self._retries(job):
            self._requeue(job)
        else:
            self._finish(job)

    def _retries(self, job: JobRecord) -> bool:
        """A restartable job that lost a node (and was not canceled) runs again, up to its retry limit."""
        d = job.description
        return (
            d.restartable
            and job.attempt < d.retries
            and job.cancel_reason is None
            and not job.closing
            and not self._stopping
            and self._may_run_later(None)
            and any(r.reason == "lost" for r in job.results.values())
        )

    def _requeue(self, job: JobRecord) -> None:
        """Back to the queue for another attempt, placed afresh (the lost node is not usable). Its
        state stays ACTIVE: PSI/J has no way back to QUEUED, and for the user the job is still running."""
        lost = next(r for r in job.results.values() if r.reason == "lost")
        self._unplace(job)
        job.attempt += 1
        log.warning("job restarted after losing its node", job=job.id, attempt=job.attempt, node=lost.node)
        job.phase = "queued"
        self.queue.push(job)

    def _unplace(self, job: JobRecord) -> None:
        """Forget the job's placement, processes and results (in the journal too): it is to be placed
        afresh, after a lost node (:meth:`_requeue`) or a withdrawal (:meth:`_withdrawn`)."""
        self._release_job_amounts(job)
        for i in range(len(job.ranks)):
            self._release_rank(job, i)
        job.ranks, job.held, job.results = [], [], {}
        job.environment, job.unset = None, []
        job.started = job.ended = None
        self._stop_waiting(job.id)
        self._tx.job_requeued(job.id)
        self._placed.discard(job)
        self._new_results = [r for r in self._new_results if r[0] is not job]
        self._dirty.add(job)

    def _stop_waiting(self, job_id: str) -> None:
        """The job no longer waits behind a busy core (it started, ended, or is placed afresh)."""
        self._waiting.pop(job_id, None)
        self._withdrawing.discard(job_id)

    def _reclaim(self) -> None:
        """Ask back jobs that have waited behind a busy core for ``_RECLAIM_AFTER`` while a core they
        could use is free (the task ahead of them turned out long, or the stream's tail is uneven): one
        per free core, oldest first. An agent that already started one ignores the request. Called
        every flush while jobs wait behind cores: it looks at the nodes only once the oldest of them has
        waited that long (in a stream of short tasks that is rare: the deepest of a 1-core node's 16
        waits ~45 ms at 350 tasks/s, and then every core is busy anyway)."""
        now = time.monotonic()
        if now - next(iter(self._waiting.values())) < _RECLAIM_AFTER:
            return
        free = {}
        for name, node in self.nodes.items():
            if node.usable and node.free_cores:
                free[name] = len(node.free_cores)
        if not free:
            return
        room = sum(free.values())
        for job_id, since in self._waiting.items():
            if room <= 0 or now - since < _RECLAIM_AFTER:
                break  # oldest first: the rest waited less
            job = self.jobs.get(job_id)
            if job is None or job_id in self._withdrawing or job.phase != "ranks" or len(job.processes) != 1:
                continue
            (slot, plan) = next(iter(job.processes.items()))
            held = self.held.get(node_allocation_key(plan.node))
            if held is None or not any(n in held.nodes and c >= len(plan.order.cores) for n, c in free.items()):
                continue  # no core it could use is free in its own allocation
            self._withdrawing.add(job_id)
            self._withdraws[plan.node].append([plan.order.job_id, slot])
            room -= len(plan.order.cores)

    def _withdrawn(self, job: JobRecord, slot: int) -> None:
        """Its agent gave the order back unstarted: the job is placed afresh, ahead of the queue. Not an
        attempt (nothing ran); its state stays QUEUED."""
        plan = job.processes.pop(slot)
        agent = self.agents.get(plan.node)
        if agent is not None:
            agent.processes.discard((plan.order.job_id, slot))
        self._unplace(job)
        if job.cancel_reason is not None:  # canceled meanwhile: it never ran
            job.phase = "done"
            self._set_state(job, JobState.CANCELED, time.time(), message=job.cancel_reason)
            return
        job.phase = "queued"
        self.queue.push_front(job)

    def _release_rank(self, job: JobRecord, i: int) -> None:
        if i < len(job.held) and job.held[i]:
            job.held[i] = False
            rank = job.ranks[i]
            node = self.nodes.get(rank.node)
            placement = job.sss.placement if job.sss is not None else None
            if placement is not None and i < len(placement.tasks):
                pool = self.resources.global_ledger.capacity
                host = {k: v for k, v in placement.tasks[i].amounts if k not in pool}
                if host and rank.node in self.resources.ledgers:
                    self.resources.ledgers[rank.node].give_back(host)
            if node is not None:
                node.give_back(rank)
                if node.exclusive_job == job.id and not any(
                    h and r.node == rank.node for h, r in zip(job.held, job.ranks, strict=True)
                ):
                    node.exclusive_job = None

    def _kill_outstanding(self, job: JobRecord, *, reason: str) -> None:
        for slot, plan in job.processes.items():
            self._kills[plan.node][reason].append([plan.order.job_id, slot])

    def _cancel(self, job: JobRecord, *, reason: str) -> None:
        if job.final or job.cancel_reason is not None:
            return
        job.cancel_reason = reason
        self._dirty.add(job)
        if job.phase == "queued":
            job.phase = "done"
            self._dequeue(job)
            self._set_state(job, JobState.CANCELED, time.time(), message=reason)
        else:
            self._kill_outstanding(job, reason="canceled")

    def _dequeue(self, job: JobRecord) -> None:
        """A queued job leaves without being placed (canceled, failed): from the queue, or from the jobs
        blocked on dependencies or a Hold."""
        if self._blocked.pop(job.id, None) is None:
            self.queue.drop()

    def _release_job_amounts(self, job: JobRecord) -> None:
        """Consumables a placed SSS job holds once for the whole job (licenses): back when it ends."""
        placement = job.sss.placement if job.sss is not None else None
        if placement is None:
            return
        for level, amounts in placement.per_job:
            ledger = self.resources.global_ledger if level == "global" else self.resources.ledgers.get(level)
            if ledger is not None:
                ledger.give_back(dict(amounts))
        placement.per_job = []

    def _finish(self, job: JobRecord) -> None:
        self._release_job_amounts(job)
        for i in range(len(job.ranks)):
            self._release_rank(job, i)
        job.phase = "done"
        state, exit_code, message = self._outcome(job)
        self._set_state(
            job,
            state,
            job.ended or time.time(),
            exit_code=exit_code,
            message=message,
            metadata=self._delivered(job, exit_code),
        )

    def _outcome(self, job: JobRecord) -> tuple[JobState, int | None, str | None]:
        d = job.description
        results = sorted(job.results.items(), key=lambda kv: (kv[0] < 0, kv[0]))
        bad = [(slot, r) for slot, r in results if not r.ok]
        if job.cancel_reason is not None and (bad or not results):
            return JobState.CANCELED, None, job.cancel_reason
        if not bad:
            return JobState.COMPLETED, 0, None
        # The cause, not the collateral: a process we killed because another failed is not the cause.
        causes = [(s, r) for s, r in bad if r.reason is None or r.reason == "walltime"] or bad
        slot, r = causes[0]
        code = r.exit_code if r.exit_code is not None else (-r.signal if r.signal else None)
        pre = f"pre_launch script {d.pre_launch!r}" if d.pre_launch else "the launch preparation (output files)"
        what = {"pre": pre, "post": f"post_launch script {d.post_launch!r}"}.get(
            r.role, f"rank {slot}" if len(job.ranks) > 1 or slot else "the process"
        )
        if r.reason == "walltime" and job.closing:
            margin = self.config.pilot.walltime_margin
            return (
                JobState.FAILED,
                code,
                f"walltime: the allocation ends in under {margin:g} s (pilot.walltime_margin), so {what} was "
                f"stopped on node {r.node} before the batch system could kill it",
            )
        if r.reason == "walltime":
            return (
                JobState.FAILED,
                code,
                (
                    f"walltime exceeded: {what} ran past JobAttributes.duration of {d.duration:g} s "
                    f"on node {r.node} and was killed"
                ),
            )
        if r.message is not None:
            return JobState.FAILED, code, r.message
        if r.signal:
            return (
                JobState.FAILED,
                code,
                f"{what} was killed by signal {r.signal} ({_signame(r.signal)}) on node {r.node}",
            )
        return JobState.FAILED, code, f"{what} exited with code {r.exit_code} on node {r.node}"

    def _delivered(self, job: JobRecord, exit_code: int | None) -> dict[str, Any]:
        ranks = [r for r in job.results.values() if r.data]
        user = sum(float(r.data.get("user_cpu_time") or 0) for r in ranks)
        system = sum(float(r.data.get("system_cpu_time") or 0) for r in ranks)
        wall = max(0.0, (job.ended or 0) - job.started) if job.started is not None else 0.0
        processors = sum(len(r.cores) for r in job.ranks)
        signals = [r.signal for r in job.results.values() if r.signal]
        # The signal of the process that decided the outcome (a rank killed because another failed is
        # not it); when no process decided it (canceled, node lost), the first one seen.
        if exit_code is not None:
            signal: int | None = -exit_code if exit_code < 0 else None
        else:
            signal = signals[0] if signals else None
        return {
            "wall_duration": wall,
            "user_cpu_time": user,
            "system_cpu_time": system,
            "max_rss": max((int(r.data.get("max_rss") or 0) for r in ranks), default=0),
            "processors": processors,
            "gpus": sum(len(r.gpus) for r in job.ranks),
            "consumption_rate": (user + system) / (wall * processors) if wall > 0 and processors else 0.0,
            "nodes": sorted({r.node for r in job.ranks}),
            "processes": sum(1 for slot in job.results if slot >= 0),
            "exit_code": exit_code,
            "signal": signal,
            **({"started": job.started} if job.started is not None else {}),
            **(
                {"tasks": [[t.group, t.task, t.node, t.cores, t.gpus] for t in job.sss.placement.tasks]}
                if job.sss is not None and job.sss.placement is not None
                else {}
            ),
        }

    def _set_state(
        self,
        job: JobRecord,
        state: JobState,
        t: float,
        *,
        exit_code: int | None = None,
        message: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.counts[job.state] -= 1
        self.counts[state] += 1
        job.state = state
        job.state_time = t
        if state.final:
            job.exit_code = exit_code
            job.message = message
            job.metadata = metadata or {}
        self._dirty.add(job)
        if state.final:
            self._retired.append(job)
        status = job.status()
        for ident in job.subscribers:
            self._events[ident][job.id] = status
        if state.final and (job.id in self.graph.jobs or job.id in self.graph.dependents):
            self._settle(job)

    # -- flush & monitor ----------------------------------------------------------------------------

    def _flush(self) -> None:
        """Schedule, then send every outbox: one message per peer and kind. Runs in the I/O task only
        (and at the very end of shutdown, when that task is done)."""
        if self._parked:
            self._unpark()
        self._schedule()
        if self._waiting:
            self._reclaim()
        self._commit()
        if self._draining and not self._stop.is_set() and not self._unfinished():
            log.info("drained: every accepted job has ended")
            self._stop.set()
        replies, self._replies = self._replies, []
        direct, self._agent_frames = self._agent_frames, []
        orders, self._orders = self._orders, defaultdict(list)
        kills, self._kills = self._kills, defaultdict(lambda: defaultdict(list))
        withdraws, self._withdraws = self._withdraws, defaultdict(list)
        events, self._events = self._events, defaultdict(dict)
        # Agents first: their work starts while the clients' replies are encoded and sent.
        for frames in direct:
            _send(self._agents_sock, frames)
        for node, batch in kills.items():
            for reason, keys in batch.items():
                _send(
                    self._agents_sock, [ident_of(node), wire.encode(wire.Kind.KILL, {"keys": keys, "reason": reason})]
                )
        for node, keys in withdraws.items():
            _send(self._agents_sock, [ident_of(node), wire.encode(wire.Kind.WITHDRAW, {"keys": keys})])
        for node, batch_orders in orders.items():
            _send(
                self._agents_sock,
                [ident_of(node), wire.encode(wire.Kind.LAUNCH, {"orders": batch_orders})],
            )
        if replies or self._held_replies:
            self._send_replies(replies)
        held_since = self._merge_held(events) if self._held_events else {}
        for ident, evs in events.items():
            if ident in self._held_replies:
                sent: bool | None = False  # behind its replies: a job's statuses never overtake its SUBMIT reply
            else:
                sent = _send(self._clients, [ident, wire.encode(wire.Kind.EVENTS, {"events": list(evs.values())})])
            if sent is False:
                # The client is not reading fast enough: keep its statuses, one per job (the newest), and
                # send them with the next flush -- coalesced, never lost, never more than one per job.
                self._held_events[ident] = (held_since.get(ident, time.monotonic()), evs)
        if self._retired:
            for job in self._retired:
                if job.final and not job.processes:
                    self.jobs.pop(job.id, None)
            self._retired.clear()
        self._progress.notify()

    def _send_replies(self, replies: list[tuple[bytes, dict[str, Any]]]) -> None:
        """Replies in order, per client. One that meets a client's high-water mark (a client with more
        requests in flight than its socket queues) waits for the next flush, and so do the replies and
        statuses behind it: a dropped SUBMIT reply would leave the client unsure whether jobs the journal
        holds were accepted, and the statuses of jobs it never heard of unread. A client gone or not
        reading for ``_HOLD_SECONDS``: its replies are dropped."""
        held = self._held_replies
        now = time.monotonic()
        for ident in list(held):
            waiting = held[ident]
            while waiting:
                since, frame = waiting[0]
                if now - since > _HOLD_SECONDS:
                    log.warning("client not reading its replies; dropped them", replies=len(waiting))
                    waiting.clear()
                    break
                if _send(self._clients, [ident, frame]) is False:
                    break
                waiting.popleft()  # sent, or the client is gone
            if not waiting:
                del held[ident]
        for ident, body in replies:
            frame = wire.encode(wire.Kind.REPLY, body)
            behind = held.get(ident)
            if behind is not None:
                behind.append((now, frame))
            elif _send(self._clients, [ident, frame]) is False:
                held[ident] = deque([(now, frame)])

    def _merge_held(self, events: dict[bytes, dict[str, Any]]) -> dict[bytes, float]:
        """Put the statuses held for slow clients back in front of this flush's (a newer status of the
        same job wins); returns since when each client's were held. Held too long: dropped."""
        held, self._held_events = self._held_events, {}
        now = time.monotonic()
        since: dict[bytes, float] = {}
        for ident, (t, evs) in held.items():
            if now - t > _HOLD_SECONDS:
                log.warning("client not reading its job statuses; dropped them", jobs=len(evs), seconds=_HOLD_SECONDS)
                continue
            events[ident] = evs | events.get(ident, {})
            since[ident] = t
        return since

    async def _until(self, predicate: Callable[[], bool]) -> None:
        """Wait for ``predicate``, re-checked after every flush (every burst of messages)."""
        while not predicate():
            await self._progress.event().wait()

    async def _monitor_loop(self) -> None:
        timeout = self.config.pilot.agent_timeout
        while True:
            await anyio.sleep(min(0.5, self.config.pilot.heartbeat_interval))
            now = time.monotonic()
            for agent in list(self.agents.values()):
                if agent.state == "active" and now - agent.last_seen > timeout:
                    self._agent_gone(
                        agent, f"node {agent.name} lost: its agent sent no heartbeat for {now - agent.last_seen:.1f} s"
                    )
            self._check_agents_started()
            margin = self.config.pilot.walltime_margin
            for held in list(self.held.values()):
                end = held.end()
                if end is not None and held.alive and not held.closing and time.time() >= end - margin:
                    self._close_before_end(held)
            if not self._stopping:
                for s in self.sites:  # one query per site for all its allocations
                    mine = [h.allocation for h in self.held.values() if h.site is s and h.alive]
                    if mine:
                        await s.lrm.poll(mine)
                for held in list(self.held.values()):
                    if held.allocation.state.final and not held.over:
                        self._allocation_ended(held)
                self._autoscale()
            self.poke()

    # -- status -------------------------------------------------------------------------------------

    def _allocations_status(self) -> list[dict[str, Any]]:
        return [
            held.to_status(
                registered=sum(1 for n in held.nodes if n in self.agents and self.agents[n].state == "active")
            )
            for held in self.held.values()
        ]

    def _autoscale_status(self) -> dict[str, Any] | None:
        a = self.config.autoscale
        if not a.enabled:
            return None
        return {
            "max_pilots": a.max_pilots,
            "max_nodes": a.max_nodes,
            "idle_timeout": a.idle_timeout,
            "failures": self._failures,
            "stopped": self._autoscale_stopped or None,
            "growing": self._growing,
        }

    def status(self) -> dict[str, Any]:
        allocations = self._allocations_status()
        nodes = []
        for name, slots in self.nodes.items():
            agent = self.agents[name]
            nodes.append(
                {
                    "name": name,
                    "allocation": node_allocation_key(name),
                    "hostname": slots.hostname,
                    "agent": agent.state if agent.confirmed else "reconnecting",  # recovered, not back yet
                    "cores": len(slots.cores),
                    "free_cores": len(slots.free_cores),
                    "gpus": len(slots.gpus),
                    "free_gpus": len(slots.free_gpus),
                    "memory": slots.memory,
                    "free_memory": slots.free_memory,
                    "processes": len(agent.processes),
                    "load": agent.load,
                    "os": agent.node.os,
                    "architecture": agent.node.architecture,
                    "features": agent.node.features,
                }
            )
        for held in self.held.values():
            for n in held.allocation.expected_nodes if held.alive else ():
                if n.name not in self.nodes:
                    nodes.append(
                        {
                            "name": n.name,
                            "allocation": held.key,
                            "hostname": n.hostname,
                            "agent": "starting",
                            "cores": len(n.processors),
                            "free_cores": 0,
                            "gpus": len(n.gpus),
                            "free_gpus": 0,
                            "memory": n.memory,
                            "free_memory": 0,
                            "processes": 0,
                            "load": [],
                            "os": n.os,
                            "architecture": n.architecture,
                            "features": n.features,
                        }
                    )
        st: dict[str, Any] = {
            "pilot": self._info()
            | {
                "rundir": str(self.rundir.path),
                "uptime": time.time() - self.started,
                "draining": self._draining,
                "resumed": self.resumed,
            },
            # The first still alive (else the last): what a single-allocation pilot has always shown.
            "allocation": next(
                (st for st, h in zip(allocations, self.held.values(), strict=True) if h.alive),
                allocations[-1] if allocations else None,
            ),
            "allocations": allocations,
            "autoscale": self._autoscale_status(),
            "nodes": nodes,
            "jobs": {s.value: n for s, n in self.counts.items() if n},
            "queued": len(self.queue) + len(self._waiting),
        }
        masked: dict[str, Any] = redact(st)  # nothing that looks like a secret leaves in a status
        return masked


def _send(sock: zmq.Socket[bytes], frames: list[bytes]) -> bool | None:
    """ROUTER sends never block. True: sent; False: the peer is past its high-water mark (not reading);
    None: no such peer (gone). The caller decides what a message that was not sent means."""
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
        return True
    except zmq.Again:
        log.warning("peer not reading; message held or dropped", size=sum(len(f) for f in frames))
        return False
    except zmq.ZMQError as exc:
        if exc.errno == zmq.EHOSTUNREACH:
            return None
        raise


#: Longest client key a SUBMIT may carry (a uuid is 36 characters).
_KEY_CHARS = 128


def _submit_keys(body: dict[str, Any], count: int) -> list[str | None] | None:
    """A SUBMIT's ``keys`` (one per job, None for a job without one), checked; None when it has none."""
    keys: list[str | None] | None = wire.opt_field(body, "keys", list)
    if keys is None:
        return None
    if len(keys) != count:
        raise wire.ProtocolError(f"'keys' has {len(keys)} entries for {count} jobs; send one per job (or null)")
    for key in keys:
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= _KEY_CHARS):
            raise wire.ProtocolError(f"a job key must be a string of 1 to {_KEY_CHARS} characters, not {key!r:.80}")
    return keys


def ident_of(name: str) -> bytes:
    return name.encode()


def _id_order(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (0, job_id)


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _placement_from_ranks(sss: SssJob, ranks: list[RankPlacement]) -> JobPlacement:
    variant = sss.request.variants[0]
    tasks = []
    i = 0
    for group, g in enumerate(variant):
        for t in range(g.task_count):
            r = ranks[i]
            tasks.append(TaskPlacement(group, t, r.node, r.cores, r.gpus, r.memory, g.per_task))
            i += 1
    return JobPlacement(tasks, 0)


def _ended_reason(state: str, code: int | None, message: str | None) -> str:
    text = f"it ended {state}"
    if code is not None:
        text += f" with exit code {code}"
    return text + (f": {message}" if message else "")


def _signame(sig: int) -> str:
    import signal as _signal

    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
