"""The daemon: the I/O shell around the scheduling core.

It owns the run directory's lock, the journal, the two sockets and the batch-system calls; the core
(:mod:`pilot.core`) owns every job, node and decision. One anyio task does all socket I/O in a loop:
drain every waiting frame into the core, one step of the core (scheduling pass, reclaim), commit the
journal, then flush the outbox -- one message per peer and kind, so every hop batches, and nothing
leaves that the journal does not hold.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
import structlog
import zmq

import pilot
from pilot import history, job_log, lrm, site, views, wire
from pilot.acquisition import Acquisition
from pilot.agent_delivery import AgentDelivery
from pilot.allocations import AllocationBook, PilotAllocation, Site
from pilot.collector import YoungThreshold
from pilot.config import Config
from pilot.core.outbox import CancelAllocation, NodeLost
from pilot.core.reactor import Core
from pilot.delivery import ClientDelivery
from pilot.earlier_life import Restoration, Start, give_back, open_journal
from pilot.endpoints import EndpointError, Endpoints
from pilot.journal_guard import RESERVE_MAX, JournalGuard
from pilot.launchers import LAUNCHERS
from pilot.launchers.mpirun import MpirunLauncher
from pilot.model import output_stream
from pilot.parking import Parking, is_submit
from pilot.rundir import AbandonedSubmits, RunDir
from pilot.stalls import BEAT, StallMeter
from pilot.store import JournalError, Store
from pilot.store_load import Recovered
from pilot.wire.messages import (
    TO_DAEMON_FROM_AGENT,
    Abandon,
    AgentMessage,
    Attach,
    Body,
    Cancel,
    CancelWhere,
    Explain,
    Hello,
    Jobs,
    Kill,
    Launch,
    Lease,
    ListJobs,
    Nodes,
    Register,
    Release,
    Show,
    Shutdown,
    Status,
    Submit,
    Withdraw,
    decode_request,
    encode,
)
from pilot.wire.transport import Progress, Waiter, drain

log = structlog.get_logger("pilot.daemon")
_jobs_log = structlog.get_logger("pilot.jobs")

_DRAIN = 2048  # frames handled per burst before a flush
#: Requests answered without a change the journal must hold first. An attach subscribes the client to
#: statuses, which wait for the journal as every status does.
_ANSWERED_AT_ONCE: Final = frozenset({Status, Nodes, Explain, Show, ListJobs, Jobs, Attach, Shutdown, Hello})


def _refused(body: dict[str, Any]) -> bool:
    """A reply that says nothing was done: an error (a bad request's too), or an error for each job it
    names. (A loop, not all() over a generator: this runs for every client frame.)"""
    if "error" in body:
        return True
    results = body.get("results")
    if type(results) is not list:
        return False
    for result in results:
        if "error" not in result:
            return False
    return True


CHECKPOINT_LOOK = 8  # commits between two looks at the journal's WAL size (in a worker thread)


class DaemonError(RuntimeError):
    """The daemon cannot start; the message says why and what to do."""


def _keep_history(store: Store, rundir: RunDir) -> None:
    """Before the journal goes (a clean stop): its jobs into the run directory's history."""
    try:
        history.keep(views.history_rows(store.job_rows()), rundir.history_file)
    except (history.HistoryError, JournalError) as exc:
        log.error("job history not kept", error=str(exc))


class Daemon:
    def __init__(self, *, config: Config, rundir: RunDir, embedded: bool = False, start: Start = "resume") -> None:
        self.config = config
        self.rundir = rundir
        self.embedded = embedded
        self.start = start  # how the journal is opened: see pilot.earlier_life
        sites = [
            Site(s, lrm.create(s.lrm, options=s.options, source=config.source, table=s.table)) for s in config.sites
        ]
        self.allocations = AllocationBook(sites=sites, autoscale=config.autoscale)
        self.core = Core(
            config=config,
            allocations=self.allocations,
            cluster=site.cluster(config, lrm_kind=sites[0].lrm.kind),
            #: Launchers by name, the mpirun one for the site's MPI (``pilot.mpi_flavor``).
            launchers=dict(LAUNCHERS, mpirun=MpirunLauncher(flavor=config.pilot.mpi_flavor)),
            agent_logs=str(rundir.agents_dir),
        )
        self.endpoints = Endpoints(config=config, rundir=rundir)
        self.acquisition = Acquisition(config=config, rundir=rundir, allocations=self.allocations)
        self.delivery = ClientDelivery(self.endpoints.clients)
        self.agent_delivery = AgentDelivery(self.endpoints.agents, current=self.core.nodes.active_agent)
        self.parking = Parking(
            limit=config.pilot.max_queued,
            unfinished=self.core.book.unfinished,
            serve=self._serve_client,
            reply=self._answer,  # (refusals: they change nothing)
        )
        self.started = time.time()
        self.resumed = False
        self._stop = anyio.Event()
        self._progress = Progress()
        self._waiter = Waiter(polled=True)
        self._waiter.add(self.endpoints.clients)
        self._waiter.add(self.endpoints.agents)
        self._lock_fd: int | None = None
        self._tg: anyio.abc.TaskGroup | None = None  # the daemon's task group: batch system calls
        self.store: Store | None = None
        self.guard: JournalGuard | None = None
        #: After 'pilot up --restore', until every agent is back: what the snapshot cannot know.
        self.restoration: Restoration | None = None
        #: Set while a worker thread has the journal (a checkpoint, a snapshot); set when that ends.
        self._checkpointing: anyio.Event | None = None
        self._journal_work = anyio.Lock()
        self._checkpoint_look: float = CHECKPOINT_LOOK  # the commit count at which to look at the WAL next
        #: Of this turn's replies, those that change nothing (the pilot's status, its views, a refusal):
        #: sent with the flush, in their place among the others, even when the journal could not be
        #: written and the others wait for it (:meth:`JournalGuard.outgoing`).
        self._answers: list[dict[str, Any]] = []
        self._alloc_seen: dict[str, tuple[Any, ...]] = {}
        #: The packed orders of the batch the flush under way commits (its LAUNCH frames reuse them).
        self._packed_orders: Callable[[Mapping[str, Any]], bytes | None] | None = None
        #: The daemon's own stalls (see :mod:`pilot.stalls`): beaten by a watch task and by the monitor.
        self._stalls = StallMeter(time.monotonic())
        #: Submit ids local clients gave up on, read from the run directory before each look at clients.
        self._abandoned = AbandonedSubmits(rundir.abandoned_file)
        self._abandoned_read = False  # this loop turn has read it already
        self._young = YoungThreshold()  # the collector's young threshold, by the unfinished jobs

    @property
    def client_url(self) -> str:
        return self.endpoints.client_url

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
            recovered = await self._open_journal()
            resuming = bool(recovered.allocations) or "agent_url" in recovered.meta
            try:
                await self.endpoints.bind_clients(resumed=resuming)  # before any allocation: may fail
                if resuming:
                    await self._resume(recovered)
                else:
                    # A new life: job ids start again at 1, so the last life's output is moved aside.
                    retire = functools.partial(output_stream.retire, self.rundir.agents_dir, now=time.time())
                    await anyio.to_thread.run_sync(retire)
                    await self._bind_agents()
                    self.core.outbox.journal.meta("agent_url", self.endpoints.agent_url)
                    refused = await self.acquisition.acquire_initial()
                    self._commit()
                    if refused is not None:
                        # Refused by the batch system at submission (bad partition, account, limits): say so now.
                        clean = True
                        raise DaemonError(f"the batch system refused the pilot: {refused}")
            except EndpointError as exc:
                raise DaemonError(str(exc)) from None
            self.rundir.write_info(self._info())
            log.info("pilot ready", rundir=str(self.rundir.path), client_url=self.client_url, pid=os.getpid())
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self.endpoints.watch(tg)
                self._stalls = StallMeter(time.monotonic())  # from now on the loop beats
                tg.start_soon(self._io_loop)
                tg.start_soon(self._monitor_loop)
                tg.start_soon(self._watch_stalls)
                if on_ready is not None:
                    on_ready()
                await self._stop.wait()
                await self._shutdown()
                tg.cancel_scope.cancel()
            clean = True
        finally:
            if self.store is not None:
                if clean:
                    _keep_history(self.store, self.rundir)
                try:
                    self.store.discard() if clean else self.store.close()
                except JournalError as exc:
                    log.error("journal", error=str(exc))
                if clean and self.guard is not None:
                    self.guard.discard()
            self.endpoints.close()
            self._waiter.close()
            self.rundir.remove_info()
            if self._lock_fd is not None:
                if clean:  # removed while still held: nothing of this pilot is left in the run directory
                    self.rundir.lock_file.unlink(missing_ok=True)
                    self.rundir.abandoned_file.unlink(missing_ok=True)
                os.close(self._lock_fd)
            log.info("pilot stopped")

    async def _open_journal(self) -> Recovered:
        """Open the journal as ``self.start`` says, never a silent fresh start over an earlier life (see
        :mod:`pilot.earlier_life`); make its reserve (see :mod:`pilot.journal_guard`)."""
        checkpoint = int(self.config.pilot.journal_checkpoint_mib * (1 << 20))
        try:
            opened = await anyio.to_thread.run_sync(
                lambda: open_journal(self.rundir, start=self.start, checkpoint_bytes=checkpoint)
            )
        except (JournalError, OSError) as exc:
            raise DaemonError(str(exc)) from None
        if opened.note:
            log.warning("journal opened", how=opened.note, rundir=str(self.rundir.path))
        self.store = opened.store
        self.core.book.history = self.store
        self.guard = JournalGuard(
            self.store,
            reserve_bytes=min(checkpoint, RESERVE_MAX),
            snapshot_seconds=self.config.pilot.journal_snapshot_seconds,
        )
        if not await anyio.to_thread.run_sync(self.guard.make_reserve):
            log.error("journal has no reserve: new jobs are refused until there is room", error=self.guard.trouble)
        await give_back(opened.release, sites=self.allocations.sites)  # --fresh: the earlier life's batch jobs
        if opened.restored is not None:
            self.core.outbox.journal.meta(Restoration.META, opened.restored)
        return opened.recovered

    async def _bind_agents(self, *, endpoint: str | None = None) -> None:
        local = all(s.lrm.kind == "local" for s in self.allocations.sites)
        await self.endpoints.bind_agents(local=local, endpoint=endpoint)
        self.acquisition.agent_url = self.endpoints.agent_url
        self.acquisition.agent_env = self.endpoints.agent_env

    async def _resume(self, recovered: Recovered) -> None:
        """Rebuild from the journal of a daemon that died; the agents keep running and register again
        (their unacknowledged events with them); the allocations are re-attached, not requested again."""
        sites = {s.name: s for s in self.allocations.sites}
        for name, site_name, allocation in recovered.allocations:
            source = sites.get(site_name)
            if source is None or allocation.lrm != source.lrm.kind:
                says = f"says lrm = {source.lrm.kind!r} for it" if source is not None else "has no such site"
                raise DaemonError(
                    f"the journal in {self.rundir.path} holds a {allocation.lrm!r} allocation of site {site_name!r} "
                    f"but this configuration {says}; start the pilot with the configuration it was started with"
                )
            self.allocations.held[name] = PilotAllocation(name, source, allocation, over=allocation.state.final)
        self.resumed = True
        restored = recovered.meta.get(Restoration.META)
        if isinstance(restored, dict):
            self.restoration = Restoration(restored)
            recovered.next_seq = max(recovered.next_seq, self.restoration.next_seq)
        self.allocations.restore_failures(recovered.meta.get(self.allocations.META))
        url = recovered.meta.get("agent_url")
        await self._bind_agents(endpoint=url if isinstance(url, str) else None)
        await self.acquisition.reattach()
        self._clock()
        core = self.core
        core.resume(recovered)
        self._alloc_seen = {}
        core.book.seal()
        self._commit()
        book = core.book
        log.info(
            "pilot resumed from its journal",
            jobs=len(book.jobs),
            queued=len(book.queue),
            running=sum(1 for j in book.jobs.values() if not j.final and j.run.ranks),
            nodes=len(core.nodes.agents),
            allocations=[h.allocation.native_id for h in self.allocations.held.values() if not h.over],
        )

    def request_stop(self) -> None:
        self._stop.set()

    def poke(self) -> None:
        """State changed outside the I/O task: have it schedule and flush."""
        self._waiter.poke()

    def _info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "name": self.config.pilot.name,
            "version": pilot.__version__,
            "client_url": self.client_url,
            "agent_url": self.endpoints.agent_url,
            "started": self.started,
            "config": self.config.source,
            "embedded": self.embedded,
            **self.endpoints.remote_info,
        }

    async def _shutdown(self) -> None:
        core = self.core
        log.info("pilot stopping", jobs=len(core.book.jobs))
        if self.guard is not None:
            self.guard.stopping = True
        self._clock()
        core.cancel_all("pilot stopped")
        self.poke()
        with anyio.move_on_after(self.config.pilot.kill_grace + 3):
            await self._until(core.settled)
        self._clock()
        core.stop_agents("pilot stopped")
        self.poke()
        with anyio.move_on_after(5):
            await self._until(core.agents_stopped)
        self._clock()
        core.give_up()
        flushed = self._progress.event()
        self.poke()
        with anyio.move_on_after(2):
            await flushed.wait()  # the I/O task sent the final statuses
        for held in self.allocations.held.values():
            core.cancel_allocation(held)
        self._effects()
        with anyio.move_on_after(30):
            await self._until(lambda: all(h.allocation.state.final for h in self.allocations.held.values()))

    # -- the loop -----------------------------------------------------------------------------------

    def _clock(self) -> None:
        self.core.clock.set(wall=time.time(), mono=time.monotonic())

    async def _io_loop(self) -> None:
        """The only task that touches the sockets: drain both, then one flush, then wait. While the journal
        checkpoints, only agents are read (see :meth:`_checkpoint`)."""
        while True:
            if self._checkpointing is not None:
                # Agents only (their heartbeats keep them alive through a long checkpoint), until it ends.
                self._clock()
                self._read_agents(self.endpoints.agents)
                with anyio.move_on_after(0.1):
                    await self._checkpointing.wait()
                continue
            self.turn()
            await self._waiter.wait()

    def turn(self) -> None:
        """One turn of the I/O loop, without its wait: the frames waiting on both sockets, then one flush
        (also what bench/daemon_cost.py times)."""
        self._clock()
        self._abandoned_read = False  # read again before this turn's first submit (see _handle_client)
        for frames in drain(self.endpoints.clients, _DRAIN, polled=True):
            self._on_client(frames)
        self._read_agents(self.endpoints.agents)
        self._flush()

    def _read_agents(self, agents: zmq.Socket[Any]) -> None:
        """The agents' frames waiting (up to _DRAIN). When that was all of them, every heartbeat sent
        before this turn began has been read: silence is judged up to then (Agents.heard_until)."""
        start = self.core.clock.mono
        batch = drain(agents, _DRAIN, polled=True)
        for frames in batch:
            self._on_agent(frames)
        if len(batch) < _DRAIN:
            self.core.agents.heard_until = start

    def _read_abandoned(self) -> None:
        """Submit ids a local client gave up on (appended to the run directory's list, which any daemon
        of it reads, this one or the next): refused, and the jobs they made canceled. Read before a loop
        turn's first submit (a submit given up is never accepted after) and on each tick."""
        self._abandoned_read = True
        try:
            submit_ids = self._abandoned.read()
        except OSError as exc:
            log.warning("cannot read the abandoned submits", path=str(self.rundir.abandoned_file), error=str(exc))
            return
        if submit_ids:
            self.core.on_abandon(submit_ids)

    def _on_client(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            log.warning("dropped client message", reason=f"{len(frames) - 1} payload frames, expected 1")
            return
        ident, payload = frames
        if is_submit(payload) and self.parking.full():
            self.parking.hold(ident, payload)  # behind those already held: submits are served in order
            return
        self._serve_client(ident, payload)

    def _reply(self, ident: bytes, body: dict[str, Any]) -> None:
        self.core.outbox.replies.append((ident, body))

    def _answer(self, ident: bytes, body: dict[str, Any]) -> None:
        self.core.outbox.replies.append((ident, body))
        self._answers.append(body)

    def _serve_client(self, ident: bytes, payload: bytes) -> None:
        try:
            rid, msg = decode_request(payload)
        except wire.ProtocolError as exc:
            log.warning("dropped client frame", reason=str(exc), size=len(payload))
            return
        if isinstance(msg, wire.ProtocolError):
            log.warning("bad client request", reason=str(msg))
            body: dict[str, Any] = {"error": str(msg)}
        else:
            body = self._handle_client(ident, msg)
        body["rid"] = rid
        if type(msg) in _ANSWERED_AT_ONCE or _refused(body):
            self._answer(ident, body)
        else:
            self._reply(ident, body)

    def _handle_client(self, ident: bytes, msg: Body) -> dict[str, Any]:
        core = self.core
        match msg:
            case Submit(jobs=jobs, submit_ids=submit_ids, again=again):
                if not self._abandoned_read:
                    self._read_abandoned()
                if len(jobs) > 1:  # before a burst's jobs are made (a lone job's waits for the tick)
                    self._young.fit(core.book.unfinished() + len(jobs))
                results = core.on_submit(ident, jobs, submit_ids, again=again, max_queued=self.parking.limit)
                return {"results": results}
            case Abandon(submit_ids=submit_ids):
                return {"results": core.on_abandon(list(submit_ids))}
            case Lease(count=count, give_back=give_back):
                return core.on_lease(count, give_back)
            case Cancel(ids=ids):
                return {"results": [core.on_cancel(i) for i in ids]}
            case CancelWhere(states=states, run=run):
                return core.on_cancel_where(states, run)
            case Attach(ids=ids):
                return {"results": [core.on_attach(ident, i) for i in ids]}
            case Release(ids=ids):
                return {"results": [core.on_release(i) for i in ids]}
            case Explain() | Show() | ListJobs() | Jobs() | Nodes():
                return views.answer(core, msg)
            case Status():
                return self.status()
            case Shutdown(drain=drain):
                if drain and not self.allocations.stopping:
                    core.admission.draining = True
                    log.info(
                        "draining: no new jobs; stopping once every accepted job has ended", left=core.book.unfinished()
                    )
                else:
                    self.request_stop()
                return {"ok": True, "pid": os.getpid(), "unfinished": core.book.unfinished()}
        return {"version": pilot.__version__, "pilot": self.config.pilot.name, "pid": os.getpid()}  # hello

    def _on_agent(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            log.warning("dropped agent message", reason=f"{len(frames) - 1} payload frames, expected 1")
            return
        ident, payload = frames
        try:
            name = ident.decode()
            m = wire.decode(payload, allowed=wire.AGENT_KINDS)
            agents = self.core.agents
            if m.kind != wire.Kind.REGISTER and not agents.registered(name):
                agents.ask_to_register(name)  # its body is not even read
                return
            msg: AgentMessage = TO_DAEMON_FROM_AGENT[m.kind].from_body(m.body)
            if self.restoration is not None and isinstance(msg, Register):
                amend = self.restoration.amend
                more = tuple(amend(self.core, r.node.name, r) for r in msg.more)
                msg = dataclasses.replace(amend(self.core, name, msg), more=more)
            self.core.on_agent(name, msg)
        except (wire.ProtocolError, UnicodeDecodeError) as exc:
            log.warning("dropped agent frame", reason=str(exc), size=len(payload))

    def _commit(self) -> bool:
        """Write the step's journal batch in one transaction, before any reply or order leaves: what a
        client or agent has been told is in the journal. False when it could not be written: the batch
        stays in the outbox, the core adds to it, and the guard holds back what depends on it
        (:mod:`pilot.journal_guard`)."""
        core = self.core
        tx = core.outbox.take_journal()
        self._packed_orders = tx.packed_order
        for name, held in self.allocations.held.items():
            a = held.allocation
            seen = (a.state, a.started, a.message, a.nodes, len(a.hosts), len(a.expected_nodes))
            if seen != self._alloc_seen.get(name):
                self._alloc_seen[name] = seen
                tx.allocation(a, key=name, site=held.site.name)
        if self.store is None or self.guard is None:
            return True
        store = self.store
        written = self.guard.write(tx, mono=core.clock.mono, wall=core.clock.wall)
        core.admission.refusing = self.guard.refusal
        if not written:
            core.outbox.journal = tx
            return False
        core.book.committed()
        if store.commits >= self._checkpoint_look and self._tg is not None:
            self._checkpoint_look = math.inf  # until this look is done
            self._tg.start_soon(self._checkpoint, store)
        return True

    async def _checkpoint(self, store: Store) -> None:
        """Every few commits: if the journal's WAL outgrew its limit, copy it into the journal file. The
        look (a ``stat``) runs in a worker thread, as does the copy (two ``fsync``), in
        :meth:`_with_journal`: on a network file system either may take long."""
        try:
            if await anyio.to_thread.run_sync(store.checkpoint_due):
                t0 = time.monotonic()
                await self._with_journal(store.checkpoint)
                log.debug("journal checkpointed", seconds=round(time.monotonic() - t0, 4))
        except JournalError as exc:  # e.g. no room to grow the journal file: the WAL keeps it all meanwhile
            log.warning("journal checkpoint failed", error=str(exc))
        finally:
            self._checkpoint_look = store.commits + CHECKPOINT_LOOK

    async def _snapshot(self, guard: JournalGuard) -> None:
        await self._with_journal(guard.snapshot)

    async def _with_journal(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the store in a worker thread. Meanwhile the I/O task reads agents but leaves the
        store alone: no commit, so nothing is sent that the journal does not hold yet, and no client
        request is read."""
        async with self._journal_work:
            done = self._checkpointing = anyio.Event()
            try:
                await anyio.to_thread.run_sync(work)
            finally:
                self._checkpointing = None
                done.set()

    def _flush(self) -> None:
        """One step of the core, the journal committed, then every outbox sent: one message per peer and
        kind. Runs in the I/O task only (and at the very end of shutdown, when that task is done)."""
        core = self.core
        if self.parking:
            self.parking.release()
        held = self.guard is not None and self.guard.held
        if held:
            core.book.seal()  # nothing new is placed while changes wait in memory for the journal
        else:
            core.step()
        written = self._commit()
        out = core.outbox.take()
        answers: list[tuple[bytes, dict[str, Any]]] = []
        if self._answers:
            if not written:  # they go now; the replies that say something was done wait with the journal
                apart = {id(body) for body in self._answers}
                answers = [r for r in out.replies if id(r[1]) in apart]
                out.replies = [r for r in out.replies if id(r[1]) not in apart]
            self._answers = []
        if self.guard is not None:
            out = self.guard.outgoing(out, written=written)
        agents = self.agent_delivery
        agents.retry()  # (what waits for a node's socket goes before anything newer for that node)
        # Agents first: their work starts while the clients' replies are encoded and sent. Orders before
        # kills: a kill may be of an order in this flush (one the journal's guard held: JournalGuard).
        for node, msg in out.to_agents:
            agents.send(node, encode(msg))
        for node, orders in out.orders.items():
            agents.send(node, Launch.frame(orders, self._packed_orders))
        self._packed_orders = None
        for node, batch in out.kills.items():
            for reason, refs in batch.items():
                agents.send(node, encode(Kill(tuple((ref[0], ref[1]) for ref in refs), reason)))
        for node, refs in out.withdraws.items():
            agents.send(node, encode(Withdraw(tuple((ref[0], ref[1]) for ref in refs))))
        self.delivery.flush([*out.replies, *answers] if answers else out.replies, out.statuses)
        self._start_effects(out.effects)
        job_log.log_ended(_jobs_log, core.book.take_ended())  # after the sends: off their path
        if core.admission.draining and not self._stop.is_set() and not core.book.unfinished():
            log.info("drained: every accepted job has ended")
            self._stop.set()
        if written:
            core.book.retire()  # ended jobs leave memory once the journal holds them
        if core.book.canceling and written and not held:  # (held: no step runs to end them)
            self.poke()  # the next of a mass cancel's jobs end in the next turn, input or not
        self._progress.notify()

    def _effects(self) -> None:
        """Carry out what the core asked of the batch systems outside a flush (shutdown)."""
        self._start_effects(self.core.outbox.effects)
        self.core.outbox.effects = []

    def _start_effects(self, effects: list[NodeLost | CancelAllocation]) -> None:
        if self._tg is None:
            return
        for effect in effects:
            held = self.allocations.held[effect.allocation]
            if isinstance(effect, NodeLost):
                self._tg.start_soon(self.acquisition.node_lost, held, effect.node)
            else:
                self._tg.start_soon(self._cancel_allocation, held)

    async def _cancel_allocation(self, held: PilotAllocation) -> None:
        await self.acquisition.cancel(held)
        self.poke()

    async def _until(self, predicate: Callable[[], bool]) -> None:
        """Wait for ``predicate``, re-checked after every flush (every burst of messages)."""
        while not predicate():
            await self._progress.event().wait()

    async def _watch_stalls(self) -> None:
        while True:
            await anyio.sleep(BEAT)
            self._beat(time.monotonic())

    def _beat(self, now: float) -> None:
        pause = self._stalls.beat(now)
        if pause is not None:
            self.core.on_paused(since=pause[0], until=pause[1])

    async def _monitor_loop(self) -> None:
        core = self.core
        while True:
            await anyio.sleep(min(0.5, self.config.pilot.heartbeat_interval))
            self._clock()
            self._beat(core.clock.mono)  # a pause that ends now is known before the core judges silence
            core.on_tick()
            self._young.fit(core.book.unfinished())
            self._read_abandoned()  # jobs made under a submit id given up are canceled without a new submit
            guard = self.guard
            if guard is not None:
                await guard.recover(mono=core.clock.mono)
                if self._tg is not None and guard.snapshot_due(mono=core.clock.mono):
                    self._tg.start_soon(self._snapshot, guard)
            if not self.allocations.stopping:
                await self.acquisition.poll()
                self._clock()
                for held in list(self.allocations.held.values()):
                    if held.allocation.state.final and not held.over:
                        core.on_allocation_ended(held)
                self._autoscale()
            self.poke()

    def _autoscale(self) -> None:
        """Release allocations idle for ``idle_timeout``; request one more when queued work has waited
        ``grow_after`` and none is on its way, within ``max_pilots`` and ``max_nodes``."""
        allocations, core = self.allocations, self.core
        if not allocations.autoscale.enabled or allocations.stopping or self._tg is None:
            return
        mono = core.clock.mono
        queued = len(core.book.queue)
        for held in allocations.idle_to_release(mono=mono, queued=queued, busy=core.nodes.busy):
            core.on_release_allocation(held)
        source = allocations.site_to_grow(
            mono=mono, queued=queued, draining=core.admission.draining, could_run=core.could_run
        )
        if source is not None:
            self._tg.start_soon(self._grow, source)

    async def _grow(self, source: Site) -> None:
        try:
            held = await self.acquisition.acquire(source)
            log.info("auto-allocation: another allocation requested", allocation=held.name, site=source.name)
        except Exception as exc:  # the batch system's command failed: counted like a refusal
            log.error("auto-allocation: request failed", site=source.name, error=str(exc))
            self._clock()
            self.core.on_failed_to_start(f"site {source.name}: {exc}")
            self.core.fail_stranded(f"auto-allocation failed: site {source.name}: {exc}")
        finally:
            self.allocations.growing = False
            self.poke()

    # -- status -------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return views.status(
            self.core,
            pilot=self._info()
            | {
                "rundir": str(self.rundir.path),
                "uptime": time.time() - self.started,
                "draining": self.core.admission.draining,
                "resumed": self.resumed,
                "journal": self.guard.status() if self.guard is not None else None,
                "restored": self.restoration.snapshot if self.restoration is not None else None,
            },
        )
