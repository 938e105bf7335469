"""A task's whole tree: what a task started dies with it, also what left its process group or session.

A task runs in a process group of its own (in the agent's session) and the engine signals that group;
a descendant that called ``setsid`` or ``setpgid`` (or double-forked into a session of its own, as
daemons do) is not in it. So:

- The agent is the child subreaper of its descendants (Linux ``PR_SET_CHILD_SUBREAPER``): a descendant
  whose parent dies is re-parented to the agent, not to init. Every process a task started so stays
  under the agent: in the tree of the task's process while that runs, else in the tree of a process the
  agent adopted.
- Every process the agent starts carries ``PILOT_PROCESS_MARK`` = ``<agent pid>:<tag>:<job id>`` in its
  environment (the tag numbers the agent's starts), which its descendants inherit: an adopted process
  tells which task it came from.
- A kill (cancel, walltime, the agent's stop) signals the task's process group at once (the engine, on
  the loop's thread); this module's thread, off the loop, signals the rest after one scan of ``/proc``
  per batch of kills: the tree of the task's process, and the trees of adopted processes that carry its
  mark, or the mark of a process of the same job that has ended (what a pre_launch script left behind
  dies with its job). SIGTERM, then after the kill grace SIGKILL to whatever of them is left, whether or
  not the task's own process is still there (the loop escalates for that one). When the agent stops,
  every process that carries one of this agent's marks gets the same (:meth:`Trees.kill_all`, then
  what is left at the engine's stop): nothing outlives the agent.
- An adopted process that exits is the agent's child and must be reaped. Without pidfds the reaper's
  ``wait4(-1)`` takes it (and the engine drops an exit that is no task's). With pidfds no thread waits
  for "any child" (it would take a pinned spawner's); this thread looks for an exited child every second
  (sooner after a kill) with ``waitid(WNOWAIT)``, and reaps it through a pidfd when it is no task of the
  engine's and no spawner is starting one (which could be that child, not in the table yet). The engine
  owns every child of its process: the agent starts no other (see :mod:`agent.probe`). The spawners'
  helpers (:mod:`agent.forkserver`) are its children too, unmarked: never adopted nor killed here, they
  end when their spawner closes their socket (and one that exited early is reaped here like an adopted one).
  A chained helper's tasks are its own children (:mod:`agent.chaining`); a task whose helper died is the
  agent's like any orphan, adopted here by its mark.

Why marks and a subreaper, not a cgroup per task: a writable, delegated cgroup v2 is rare on batch nodes
(the LRM owns the job's cgroup; many sites still run cgroup v1), while this needs nothing of the site but
Linux 3.4 and tasks of the agent's own user, on every LRM; and a cgroup per task would cost the spawn path
a mkdir and a write per task. What escapes it: a descendant that both leaves the task's tree (its parent
gone) and clears its environment, and processes forked faster than the SIGKILL rounds (``_KILL_ROUNDS``,
``_KILL_AGAIN`` apart) find them; those end with the allocation.

Who owns what: the tree thread owns the kills under way (``_terms``), the reaping of adopted processes
and its view of ``/proc``; it reads the engine's table under the engine's lock (which pids are tasks, with
which tag, and whether a spawner is starting one) and changes nothing of the engine's. Other threads only
put requests on its queue (:meth:`Trees.kill`, :meth:`Trees.stop`).
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any, Final

import psutil
import structlog

from pilot.thread_names import name_os_thread

if TYPE_CHECKING:
    from agent.processes import ProcessEngine

log = structlog.get_logger("agent.processes")

#: The environment variable that marks every process the agent starts, and so their descendants.
MARK: Final = "PILOT_PROCESS_MARK"
ALL: Final = 0  # the tag of a kill of every marked process (tags count from 1)

_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_GET_CHILD_SUBREAPER: Final = 37
_REAP_IDLE: Final = 1.0  # seconds between looks for an exited adopted child when nothing was killed
_REAP_SOON: Final = 0.02  # the first look after a kill (doubling up to _REAP_IDLE)
_KILL_ROUNDS: Final = 5  # SIGKILL rounds at most while a round still finds processes (each _KILL_AGAIN apart)
_KILL_AGAIN: Final = 0.2
_STOP_REAP: Final = 5.0  # seconds the engine's stop waits at most for what it SIGKILLed to be reaped


@dataclass(slots=True)
class _Term:
    """A task's tree signalled with SIGTERM: SIGKILL to what is left of it at ``deadline``."""

    job_id: str
    leader: int  # the pid of the task's own process
    deadline: float  # monotonic
    rounds: int = 0  # SIGKILL rounds done


@dataclass(slots=True)
class _View:
    """One scan of ``/proc``, with the engine's table at that moment."""

    procs: dict[int, Any]  # pid -> psutil.Process
    children: dict[int, list[int]]
    tasks: dict[int, int]  # pid -> tag of the processes the engine runs
    adopted: list[tuple[int, int, str]]  # (pid, tag, job id) of marked processes outside every task's tree

    def tree(self, root: int) -> list[int]:
        out = [root]
        i = 0
        while i < len(out):
            out += self.children.get(out[i], ())
            i += 1
        return out


class Trees:
    def __init__(self, *, engine: ProcessEngine, grace: float, reaps: bool) -> None:
        """``reaps``: this thread reaps the adopted processes that exit (with pidfds; else the reaper)."""
        self._engine = engine
        self._grace = grace
        self._reaps = reaps
        self._me = os.getpid()
        self.prefix = f"{self._me}:"  # of this agent's marks (MARK)
        self._requests: SimpleQueue[tuple[int, str, int, int] | None] = SimpleQueue()
        self._terms: dict[int, _Term] = {}  # tag -> its SIGTERM's escalation
        self._reap_at = 0.0  # monotonic time of the next look for an exited adopted child
        self._reap_every = _REAP_IDLE
        self._subreaper_before: bool | None = None  # None: not made a subreaper here
        self.subreaper = False
        self.thread = threading.Thread(target=self._loop, name="pilot-trees", daemon=True)

    def start(self) -> None:
        before = _subreaper(True)
        if before is None:
            log.warning(
                "the agent cannot be its tasks' child subreaper; a task's descendant whose parent died is "
                "found by its mark alone, among all this user's processes"
            )
        else:
            self._subreaper_before = before
            self.subreaper = True
        self._reap_at = time.monotonic() + _REAP_IDLE
        self.thread.start()

    def kill_all(self) -> None:
        """SIGTERM, then SIGKILL after the grace, to every process that carries one of this agent's marks
        (the agent is stopping: what ended tasks left running too)."""
        self._requests.put((ALL, "", 0, signal.SIGTERM))

    def kill(self, tag: int, job_id: str, leader: int, sig: int) -> None:
        """Signal what of the task ``tag`` (whose process ``leader``'s group the engine just signalled)
        left that group: from any thread, done on this module's."""
        self._requests.put((tag, job_id, leader, sig))

    def stop(self) -> None:
        """Kill (SIGTERM, grace, SIGKILL) and reap whatever still carries one of this agent's marks, then
        end the thread: once no spawner or reaper runs (the engine's stop)."""
        if self.thread.is_alive():
            self._requests.put(None)
            self.thread.join(timeout=self._grace + _STOP_REAP + 10)
        if self._subreaper_before is False:
            _subreaper(False)  # (an engine in a process that goes on: tests)
            self._subreaper_before = None

    # -- the tree thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        name_os_thread()
        requests = self._requests
        while True:
            due = min((t.deadline for t in self._terms.values()), default=math.inf)
            if self._reaps:
                due = min(due, self._reap_at)
            batch: list[tuple[int, str, int, int] | None] = []
            try:
                timeout = None if due == math.inf else max(0.0, due - time.monotonic())
                batch.append(requests.get(timeout=timeout))
                while True:
                    batch.append(requests.get_nowait())
            except Empty:
                pass
            try:
                if kills := [r for r in batch if r is not None]:
                    self._kill(kills)
                now = time.monotonic()
                if any(t.deadline <= now for t in self._terms.values()):
                    self._escalate(now)
                if self._reaps and (kills or now >= self._reap_at):
                    self._reap_soon(found=self._reap_adopted() or bool(kills))
                if None in batch:
                    self._final()
                    return
            except Exception:  # never let one scan end the thread: the next kill must still work
                log.exception("killing a task's tree failed")
                if None in batch:
                    return
                later = time.monotonic() + _REAP_IDLE  # not at once again: a busy loop if it fails again
                for term in self._terms.values():
                    term.deadline = max(term.deadline, later)
                self._reap_at = max(self._reap_at, later)

    def _kill(self, kills: list[tuple[int, str, int, int]]) -> None:
        view = self._view()
        now = time.monotonic()
        for tag, job_id, leader, sig in kills:
            # Its process group has the signal already (the engine's killpg): not twice (a second SIGTERM
            # means "now" to some programs).
            victims = [p for p in self._victims(view, tag, job_id, leader) if _pgid(p) != leader]
            if victims:
                log.info(
                    "signalled a task's processes outside its process group",
                    job=job_id if tag != ALL else "(every job: the agent stops)",
                    pids=[p.pid for p in victims],
                    signal=signal.Signals(sig).name,
                )
                _signal(victims, sig)
            if sig == signal.SIGKILL:  # one more round soon: one may have forked before it died
                self._terms[tag] = _Term(job_id, leader, now + _KILL_AGAIN, rounds=1)
            elif tag not in self._terms:
                self._terms[tag] = _Term(job_id, leader, now + self._grace)

    def _escalate(self, now: float) -> None:
        """SIGKILL what is left of the trees whose grace is over (again, while a round finds any)."""
        view = self._view()
        for tag, term in list(self._terms.items()):
            if term.deadline > now:
                continue
            victims = [p for p in self._victims(view, tag, term.job_id, term.leader) if _alive(p)]
            if victims:
                if term.rounds == 0:
                    log.info(
                        "SIGKILL to a task's processes left after the kill grace",
                        job=term.job_id,
                        pids=[p.pid for p in victims],
                    )
                _signal(victims, signal.SIGKILL)
                self._reap_soon(found=True)
            term.rounds += 1
            if victims and term.rounds < _KILL_ROUNDS:
                term.deadline = now + _KILL_AGAIN  # one may have forked before it died
            else:
                del self._terms[tag]

    def _victims(self, view: _View, tag: int, job_id: str, leader: int) -> list[Any]:
        """The processes of task ``tag``: its process's tree while that runs, and the trees of adopted
        processes marked with its tag or with the tag of an ended process of its job (``ALL``: of every
        adopted process with a mark of this agent's)."""
        pids: set[int] = set()
        if view.tasks.get(leader) == tag:
            pids.update(view.tree(leader))
        running = set(view.tasks.values())
        for pid, t, j in view.adopted:
            if tag == ALL or t == tag or (j == job_id and t not in running):
                pids.update(view.tree(pid))
        pids.discard(self._me)
        return [view.procs[p] for p in pids if p in view.procs]

    def _view(self) -> _View:
        procs: dict[int, Any] = {}
        children: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["ppid"] if self.subreaper else ["ppid", "uids"]):
            procs[proc.pid] = proc
            ppid = proc.info["ppid"]
            if ppid:
                children.setdefault(ppid, []).append(proc.pid)
        engine = self._engine
        with engine._lock:
            tasks = {pid: run.tag for pid, run in engine._by_pid.items()}
        view = _View(procs, children, tasks, [])
        if self.subreaper:  # a task's descendant outside its tree is the agent's child
            candidates = [p for p in children.get(self._me, ()) if p not in tasks]
        else:  # it is anywhere: this user's processes outside the agent's tree
            mine = set(view.tree(self._me))
            uid = os.getuid()
            candidates = [p for p, proc in procs.items() if p not in mine and (proc.info["uids"] or (None,))[0] == uid]
        for pid in candidates:
            mark = self._mark(procs[pid])
            if mark is not None:
                view.adopted.append((pid, *mark))
        return view

    def _mark(self, proc: Any) -> tuple[int, str] | None:
        """The (tag, job id) of one of this agent's marks in ``proc``'s environment, else None."""
        try:
            value = proc.environ().get(MARK)
        except psutil.Error:
            return None
        if not value or not value.startswith(self.prefix):
            return None
        tag, _, job_id = value[len(self.prefix) :].partition(":")
        try:
            return int(tag), job_id
        except ValueError:
            return None

    def _reap_soon(self, *, found: bool) -> None:
        self._reap_every = _REAP_SOON if found else min(_REAP_IDLE, self._reap_every * 2)
        self._reap_at = time.monotonic() + self._reap_every

    def _reap_adopted(self) -> bool:
        """Reap the agent's exited children that are no task (adopted ones); True if any was. A task's
        exit not taken yet hides the others until the next look (its waiter takes it at once)."""
        engine = self._engine
        found = False
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return found
            if info is None:
                return found
            pid = info.si_pid
            try:
                fd = os.pidfd_open(pid)  # before the look at the table: the fd is that process, whatever
            except ProcessLookupError:  # reaped meanwhile by whoever waits for it
                continue
            except OSError:  # out of file descriptors: the next look
                return found
            try:
                with engine._lock:
                    # A spawner between its spawn and the table may hold this very child.
                    # (Orders sent to a chain's helper are pending too, but become no child of the agent's.)
                    task = pid in engine._by_pid or engine._pending_orders - engine._chained > engine._handoffs
                if task:
                    return found
                try:
                    os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
                except ChildProcessError:
                    pass
                except OSError as exc:  # P_PIDFD is Linux 5.4: on 5.3 the adopted stay zombies until the end
                    log.warning("cannot reap the processes the agent adopted", error=str(exc))
                    self._reaps = False
                    return False
                found = True
            finally:
                os.close(fd)

    def _final(self) -> None:
        """The engine stops: SIGTERM to every process that carries one of this agent's marks (or runs in a
        task's tree: none should), SIGKILL after the grace to what is left, then reap."""
        view = self._view()
        pids: set[int] = set()
        termed: set[int] = set()  # already have their SIGTERM: a task's tree being killed
        for pid in view.tasks:
            pids.update(view.tree(pid))
        for pid, tag, _ in view.adopted:
            tree = view.tree(pid)
            pids.update(tree)
            if tag in self._terms or ALL in self._terms:
                termed.update(tree)
        pids.discard(self._me)
        victims = [view.procs[p] for p in pids if p in view.procs]
        if not victims:
            return
        log.info("stopping: killing what the agent's tasks left running", pids=sorted(pids))
        if fresh := [p for p in victims if p.pid not in termed]:
            _signal(fresh, signal.SIGTERM)
            deadline = time.monotonic() + self._grace
        else:  # the SIGKILL is due when the earliest of their SIGTERMs' grace ends
            deadline = min(t.deadline for t in self._terms.values())
        left = self._settle(victims, deadline)
        if left:
            view = self._view()  # and whatever they forked meanwhile
            more = {p for pid, _, _ in view.adopted for p in view.tree(pid)} - {self._me} - {p.pid for p in left}
            left += [view.procs[p] for p in more if p in view.procs]
            _signal(left, signal.SIGKILL)
            left = self._settle(left, time.monotonic() + _STOP_REAP)
            if left:
                log.error("processes of the agent's tasks outlive it", pids=[p.pid for p in left])

    def _settle(self, procs: list[Any], deadline: float) -> list[Any]:
        """Wait until every one of ``procs`` has exited and, if the agent's child, been reaped here (no
        task is left: any child of the agent's is adopted), or until ``deadline``; those that have not."""
        pause = 0.01
        while True:
            left = []
            for p in procs:
                try:
                    if not p.is_running():  # (psutil: nor is its pid another process's now)
                        continue
                    if p.status() != psutil.STATUS_ZOMBIE:
                        left.append(p)
                    elif p.ppid() == self._me:
                        os.waitpid(p.pid, os.WNOHANG)
                        left.append(p)  # (gone at the next look)
                except (psutil.Error, ChildProcessError):
                    pass
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(pause)
            pause = min(0.1, pause * 2)


def _signal(procs: list[Any], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)  # (psutil checks that the pid is still that process)
        except psutil.Error:
            pass


def _alive(proc: Any) -> bool:
    """Runs (a zombie does not)."""
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _pgid(proc: Any) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None


def _subreaper(on: bool) -> bool | None:
    """Make this process its descendants' child subreaper (or stop being one); whether it was one
    before, or None where that is refused (not Linux, or Linux < 3.4)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int(0)
        if libc.prctl(
            _PR_GET_CHILD_SUBREAPER, ctypes.byref(was), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)
        ):
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        zero = ctypes.c_ulong(0)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(int(on)), zero, zero, zero):
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("prctl(PR_SET_CHILD_SUBREAPER) failed", error=str(exc))
        return None
    return bool(was.value)
