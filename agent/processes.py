"""Spawning and reaping, off the event loop.

Spawner threads turn orders into processes (``posix_spawn`` without a shell, new session so the
whole tree can be signalled, pinned by the spawning thread's own affinity, which the child inherits):
one per real cpu that one-cpu orders use, pinned to it once and for all, and one general spawner that
sets its affinity around each order that spans several cpus. Each exit is taken with ``wait4`` for its
rusage (Delivered):

- With pidfds (Linux 5.3 and later), a pinned spawner whose cpu is one declared core waits for its
  task itself, and starts the order that waited for that core right after, on the same thread: no
  hand-over to another thread and its wake-up between one task's exit and the next one's start (that
  hand-over left the core idle ~10 % of the time with short tasks). A reaper thread waits for the
  other children (several cpus, several cores on one cpu, rlimits) by their pidfds in one epoll; no
  thread ever calls ``wait4(-1)``, which would take a pinned spawner's child.
- Without, one reaper thread blocks in ``wait4(-1)``; a sentinel child that lives as long as the
  engine keeps it there while no task runs (see _start_sentinel).

All hand events to the loop through a list and a self-pipe, so a burst of exits costs one wake-up.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import Any, Final

import psutil
import structlog

from agent import environment
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder

log = structlog.get_logger("agent.processes")

Key = tuple[str, int]

#: Sourced by the pre process: the script's exports are captured NUL-separated for the ranks.
_PRE_SCRIPT: Final = 'if [ -n "$1" ]; then . "$1" || exit $?; fi\nexec env -0 > "$2"'
_POST_SCRIPT: Final = '. "$1"'


def take_waiting(waiting: list[ProcessOrder], key: Key) -> ProcessOrder | None:
    """Remove and return the order of ``key`` from orders that wait for their cores (a KILL or a
    WITHDRAW of one not started), or None when none waits."""
    for i, order in enumerate(waiting):
        if (order.job_id, order.slot) == key:
            return waiting.pop(i)
    return None


@dataclass(slots=True)
class Running:
    order: ProcessOrder
    pid: int
    popen: subprocess.Popen[bytes] | None  # only when started through Popen (rlimits, no thread cwd)
    started: float  # wall clock
    started_mono: float
    env_file: str | None = None
    env: dict[str, str] | None = None  # a pre process's environment before its script ran
    reason: str | None = None  # why the agent signalled it (walltime, canceled, ...)
    peak_tree_rss: int = 0
    start_event: Event | None = None  # its ``started`` event, which its exit makes redundant (_finish)


@dataclass(slots=True)
class Event:
    """``kind`` is started | exited | failed; ``data`` is what the daemon needs for that kind."""

    job_id: str
    slot: int
    kind: str
    time: float
    data: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> list[Any]:
        return [self.job_id, self.slot, self.kind, self.time, self.data]


class ProcessEngine:
    def __init__(
        self,
        *,
        node: NodeConfigured,
        workdir: Path,
        notify: Callable[[], None],
        cpu_map: dict[int, int] | None = None,
    ) -> None:
        self._node = node
        self._cpu_map = cpu_map or {}
        self._workdir = workdir
        self._notify = notify
        self._orders: SimpleQueue[ProcessOrder | None] = SimpleQueue()  # the general spawner's
        #: One spawner per real cpu that one-cpu orders ran on, pinned to it once: setting the spawning
        #: thread's affinity per order migrates it first (~150 us, the GIL held), for every task.
        self._pinned: dict[int, tuple[SimpleQueue[ProcessOrder | None], threading.Thread]] = {}
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._by_pid: dict[int, Running] = {}
        self._by_key: dict[Key, Running] = {}
        self._early: dict[int, tuple[int, Any, float]] = {}
        self._cancelled: dict[Key, str] = {}
        self._core_users: dict[int, int] = {}  # core -> processes (running, or handed to a spawner) on it
        self._waiting: list[ProcessOrder] = []
        self._events: list[Event] = []
        self._held_since: float | None = None  # monotonic start of the oldest held ``started`` event
        self._report_since: float | None = None  # monotonic time of the oldest undrained exit or failure
        self._urgent = False  # an undrained event that is not held (see _report)
        self._hold = _EXIT_HOLD  # how long the undrained exits may wait (see _report)
        self._low_water = 0  # and go once no more orders than this wait here (see _report)
        #: The latest the loop comes back (what next_deadline last told it), and whether a spawner owes
        #: it a wake-up for an undrained exit: see _report.
        self._loop_due = math.inf
        self._wake_owed = False
        self._handoffs = 0  # orders put on a spawner's queue and not taken yet
        self._stopping = False
        self._pending_orders = 0
        #: Orders accepted and not yet started or failed: a key leaves this set only in the same locked
        #: step that records its first event, so :meth:`snapshot` never misses a process.
        self._pending_keys: dict[Key, int] = {}
        self._nodefiles: dict[tuple[str, ...], str] = {}
        self._nodefiles_lock = threading.Lock()
        self._all_cpus = sorted(os.sched_getaffinity(0))
        self._cwd = os.getcwd()  # the agent's; spawner threads each have their own (see _own_cwd)
        self._devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self._null_actions = [(os.POSIX_SPAWN_DUP2, self._devnull, i) for i in range(3)]  # (_NO_STREAMS)
        #: Children are waited for one by one (a pidfd each, or by the pinned spawner that started them),
        #: never with ``wait4(-1)``: see _reap_loop. False where pidfds are missing (Linux < 5.3).
        self._pidfds = _pidfds_work()
        self._epoll = select.epoll() if self._pidfds else None
        self._reaped_by_fd: dict[int, int] = {}  # pidfd -> pid of the children the reaper waits for
        self._polled: set[int] = set()  # children without a pidfd (none could be opened): looked at often
        self._reaper_wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK) if self._pidfds else None
        if self._epoll is not None and self._reaper_wake is not None:
            self._epoll.register(self._reaper_wake[0], select.EPOLLIN)
        #: Real cpus that one declared core alone maps to: their pinned spawner runs one task at a time
        #: and waits for it itself, so the next one starts on the same thread (see _spawn_loop).
        shared = Counter(self._cpu_map.get(c, c) for c in node.processors)
        self._own_reaping = {cpu for cpu, n in shared.items() if n == 1} if self._pidfds else set()
        self._sentinel: int | None = None  # the pid of the sentinel child (see _start_sentinel)
        self._sentinel_fd: int | None = None  # the write end of its stdin, which only stop() closes
        self._fds_sealed = 0.0  # monotonic time of the last _seal_fds
        _seal_fds()
        self._base_env = environment.inherited()
        self._threads = [
            threading.Thread(target=self._spawn_loop, name="pilot-spawner", daemon=True),
            threading.Thread(target=self._reap_loop, name="pilot-reaper", daemon=True),
        ]

    # -- called from the event loop ------------------------------------------------------------

    def start(self) -> None:
        if not self._pidfds:
            self._sentinel = self._start_sentinel()
        for t in self._threads:
            t.start()

    def _start_sentinel(self) -> int | None:
        """(Without pidfds.) Start a child that lives as long as the engine, so that the reaper always waits in
        ``wait4(-1)`` (without a child, it fails at once): then no task's start has to wake the reaper
        first, from a condition wait to the GIL to wait4 (~50 us of the agent's CPU per task, and up
        to ~45 us of a lone task's round trip on a 2-vCPU VM). It reads a pipe only the engine holds open
        (no task inherits it: close-on-exec), in a session of its own: it ends when :meth:`stop` closes
        the pipe or the agent dies, not when the agent's process group is signalled. None if it cannot
        start (the reaper then waits on a condition while no task runs)."""
        try:
            read, write = os.pipe()
        except OSError as exc:
            log.warning("no sentinel child; the reaper waits on a condition between tasks", error=str(exc))
            return None
        try:
            pid = os.posix_spawn(
                "/bin/sh",
                ["/bin/sh", "-c", "read _"],
                {},
                file_actions=[(os.POSIX_SPAWN_DUP2, read, 0), *self._null_actions[1:]],
                setsid=True,
            )
        except OSError as exc:
            log.warning("no sentinel child; the reaper waits on a condition between tasks", error=str(exc))
            os.close(write)
            return None
        finally:
            os.close(read)
        self._sentinel_fd = write
        return pid

    def submit(self, orders: list[ProcessOrder]) -> None:
        """Queue orders for the spawner. One marked ``after_cores`` waits here until no process this
        agent runs (or was told to run) uses its cores: the daemon placed it behind them."""
        with self._lock:
            users = self._core_users
            for order in orders:
                if order.after_cores and any(users.get(c) for c in order.cores):
                    self._waiting.append(order)
                else:
                    self._accept(order)

    def _accept(self, order: ProcessOrder) -> None:
        # Called with the lock held.
        users = self._core_users
        cores = order.cores
        for c in cores:
            users[c] = users.get(c, 0) + 1
        self._pending_orders += 1
        self._handoffs += 1
        key = (order.job_id, order.slot)
        self._pending_keys[key] = self._pending_keys.get(key, 0) + 1
        if len(cores) == 1:
            cpu: int | None = self._cpu_map.get(cores[0], cores[0])
        else:
            cpus = {self._cpu_map.get(c, c) for c in cores}
            cpu = cpus.pop() if len(cpus) == 1 else None
        if cpu is not None and not self._stopping:
            pinned = self._pinned.get(cpu)
            if pinned is None and len(self._pinned) < _MAX_PINNED and cpu in self._all_cpus:
                queue: SimpleQueue[ProcessOrder | None] = SimpleQueue()
                thread = threading.Thread(
                    target=self._spawn_loop, args=(queue, cpu), name=f"pilot-spawner-{cpu}", daemon=True
                )
                pinned = self._pinned[cpu] = (queue, thread)
                thread.start()
            if pinned is not None:
                pinned[0].put(order)
                return
        self._orders.put(order)

    def _release(self, order: ProcessOrder) -> None:
        """The order never started: free its cores, start who waited on them."""
        with self._lock:
            # The loop's next_deadline must see them pending (their starts do not wake it), unless an
            # undrained exit already makes it come back within the exit hold.
            wake = self._free(order) and self._report_since is None
        if wake:
            self._notify()

    def _free(self, order: ProcessOrder) -> bool:
        """Free the order's cores and hand the orders that waited on them to their spawners (the lock
        held); True if any."""
        users = self._core_users
        for c in order.cores:
            users[c] -= 1
        if not self._waiting:
            return False
        still = []
        for w in self._waiting:
            if any(users.get(c) for c in w.cores):
                still.append(w)
            else:
                self._accept(w)
        started = len(still) < len(self._waiting)
        self._waiting = still
        return started

    def poll(self, mono: float) -> None:
        """Nothing to do at a given time: the spawner and reaper threads report by themselves."""

    def next_deadline(self) -> float | None:
        """When held events are due (see :meth:`drain`); while orders are being spawned, one start hold
        from now, since their ``started`` events come without a wake-up. The loop calls this right
        before it waits: what it returns bounds the loop's next turn (``_report`` relies on it)."""
        with self._lock:
            when = None if self._report_since is None else self._report_since + self._hold
            if when is not None and not self._urgent and (self._waiting or self._pending_orders):
                # drain() gives nothing before the exit hold ends, held starts included: an earlier
                # turn would find nothing, and the next one the same, a busy loop until then.
                self._loop_due = when
                return when
            if self._held_since is not None:
                start = self._held_since + _START_HOLD
            elif self._pending_orders:
                start = time.monotonic() + _START_HOLD
            else:
                start = None
            if start is not None:
                when = start if when is None else min(when, start)
            self._loop_due = math.inf if when is None else when
            return when

    def drain(self) -> list[Event]:
        """Events to send. A ``started`` event is held up to ``_START_HOLD`` seconds while its process
        runs: a short task's exit then carries it (one event, one daemon pass, not two). A task's
        ``started`` never wakes the loop by itself; exits and failures do. While orders wait here for
        their cores, exits are held too (up to ``_EXIT_HOLD`` seconds, or until half of those orders have
        started: _report): the cores stay busy meanwhile, and the daemon gets the exits of a burst in one
        message (and answers with one batch of orders) instead of one each; an agent with no queued work
        reports at once."""
        with self._lock:
            if not self._events:  # (then nothing is held either: the fields below are reset)
                return []
            now = time.monotonic()
            since = self._report_since
            if (
                since is not None
                and not self._urgent
                and now - since < self._hold
                and (self._waiting or self._pending_orders)
            ):
                return []
            events, self._events = self._events, []
            self._held_since = self._report_since = None
            self._wake_owed = self._urgent = False
            if not any(e.kind == "started" for e in events):
                return events
            out: list[Event] = []
            for e in events:
                run = self._by_key.get((e.job_id, e.slot)) if e.kind == "started" else None
                if run is not None and now - run.started_mono < _START_HOLD:
                    self._events.append(e)
                    if self._held_since is None or run.started_mono < self._held_since:
                        self._held_since = run.started_mono
                else:
                    out.append(e)
        return out

    def kill(self, key: Key, *, reason: str, sig: int = signal.SIGTERM) -> bool:
        """Signal the process group of ``key``; an order not started yet is dropped. False if unknown."""
        with self._lock:
            run = self._by_key.get(key)
            if run is None:
                waiting = take_waiting(self._waiting, key)
                if waiting is not None:
                    self._report(Event(key[0], key[1], "exited", time.time(), {"reason": reason, "spawned": False}))
                elif self._pending_orders:
                    self._cancelled[key] = reason
                else:
                    return False
                notify = waiting is not None
            else:
                notify = False
                if run.reason is None:
                    run.reason = reason
                pid = run.pid
        if run is None:
            if notify:
                self._notify()
            return True
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        return True

    def withdraw(self, key: Key) -> bool:
        """Drop an order still waiting here for its cores (the daemon places it elsewhere) and report
        it ``withdrawn``; False when it is not waiting any more (started, being started, or unknown):
        then it runs here as ordered, and its events say so."""
        with self._lock:
            if take_waiting(self._waiting, key) is None:
                return False
            wake = self._report(Event(key[0], key[1], "withdrawn", time.time()))
        if wake:
            self._notify()
        return True

    def deadline(self, key: Key) -> float | None:
        """Monotonic time at which ``key`` exceeds its walltime, if it runs and has one."""
        with self._lock:
            run = self._by_key.get(key)
            if run is None or run.order.walltime is None:
                return None
            return run.started_mono + run.order.walltime

    def is_running(self, key: Key) -> bool:
        with self._lock:
            return key in self._by_key

    def running(self) -> list[Key]:
        """Keys of the processes this agent runs and of the orders waiting for their cores."""
        with self._lock:
            return self._running_locked()

    def _running_locked(self) -> list[Key]:
        keys = dict.fromkeys(self._by_key)
        keys.update(dict.fromkeys(self._pending_keys))
        keys.update(dict.fromkeys((w.job_id, w.slot) for w in self._waiting))
        return list(keys)

    def snapshot(self) -> tuple[list[Key], list[Event]]:
        """Running keys and the events not drained yet, taken together: every order this agent got is
        in one or the other (or in events drained before), which a restarted daemon relies on to tell
        orders the agent never received from ones it ran."""
        with self._lock:
            events, self._events = self._events, []
            self._held_since = self._report_since = None
            self._wake_owed = self._urgent = False
            return self._running_locked(), events

    def busy(self) -> bool:
        with self._lock:
            return bool(self._by_key) or self._pending_orders > 0 or bool(self._waiting)

    def sample(self) -> None:
        """psutil pass over running process trees (peak RSS of the whole tree, for Delivered)."""
        now = time.monotonic()
        with self._lock:
            runs = [r for r in self._by_key.values() if now - r.started_mono > 1.0]
        for run in runs:
            try:
                proc = psutil.Process(run.pid)
                rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            run.peak_tree_rss = max(run.peak_tree_rss, rss)

    def stop(self) -> None:
        """Stop spawning; the caller has killed what runs. Threads end once the last child is reaped."""
        with self._lock:
            self._stopping = True
            self._cv.notify_all()
            pinned = list(self._pinned.values())
            fd, self._sentinel_fd = self._sentinel_fd, None
        if fd is not None:
            os.close(fd)  # the sentinel reads EOF and exits: the reaper's wait4 returns it
        self._wake_reaper()
        self._orders.put(None)
        for queue, _ in pinned:
            queue.put(None)
        threads = [*self._threads, *(thread for _, thread in pinned)]
        for t in threads:
            t.join(timeout=10)
        if not any(t.is_alive() for t in threads):
            os.close(self._devnull)

    # -- spawner thread -------------------------------------------------------------------------

    def _spawn_loop(self, queue: SimpleQueue[ProcessOrder | None] | None = None, cpu: int | None = None) -> None:
        """Spawn the orders of ``queue`` (default: the general one) in order. With ``cpu``, this thread
        runs on that cpu alone, so what it spawns inherits that pinning without a syscall per order."""
        if queue is None:
            queue = self._orders
        if cpu is not None:
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError as exc:
                log.warning("cannot pin a spawner thread; pinning per order", cpu=cpu, error=str(exc))
                cpu = None
        spawner = _Spawner(pinned=cpu is not None, own_cwd=_own_cwd(), reaps=cpu in self._own_reaping)
        while True:
            order = queue.get()
            if order is None:
                return
            spawned = False
            try:
                spawned = self._spawn(order, spawner)
            except Exception as exc:  # never let one order kill the spawner
                log.exception("spawn crashed", job=order.job_id, slot=order.slot)
                self._emit(Event(order.job_id, order.slot, "failed", time.time(), {"message": f"agent error: {exc}"}))
            finally:
                if not spawned:
                    with self._lock:
                        self._unpend(order)
                    self._release(order)
            child, spawner.child = spawner.child, None
            if child is not None:
                # This cpu's task: wait for it here, and the order that waits for its core starts on this
                # thread right after, with no hand-over to another thread (and its wake-up) between.
                self._reap(child)

    def _unpend(self, order: ProcessOrder) -> None:
        """The order is no longer being started (the lock held): it runs, or it never will."""
        self._pending_orders -= 1
        key = (order.job_id, order.slot)
        left = self._pending_keys[key] - 1
        if left:
            self._pending_keys[key] = left
        else:
            del self._pending_keys[key]

    def _spawn(self, order: ProcessOrder, spawner: _Spawner) -> bool:
        """Start one order from a spawner thread; True when a process now runs for it."""
        key = (order.job_id, order.slot)
        with self._lock:
            self._handoffs -= 1
            cancelled = self._cancelled.pop(key, None) if self._cancelled else None
            wake, self._wake_owed = self._wake_owed, False
        if wake:  # the hand-off that mattered is done (see _report)
            self._notify()
        if cancelled is not None:
            self._emit(Event(order.job_id, order.slot, "exited", time.time(), {"reason": cancelled, "spawned": False}))
            return False
        cwd = spawner.dirs.get(order.directory)
        if cwd is None:
            directory = order.directory
            cwd = os.path.join(self._cwd, os.path.expanduser(directory)) if directory else self._cwd
            if len(spawner.dirs) < _DIRS_KEPT:
                spawner.dirs[directory] = cwd
        env = self._environment(order)
        env_file = None
        if order.role == "rank":
            argv = [environment.substitute(order.executable, env)]
            if order.arguments:
                argv += [environment.substitute(a, env) for a in order.arguments]
        else:
            script = os.path.join(cwd, os.path.expanduser(order.script)) if order.script else ""
            if order.role == "pre":
                env_file = str(self._workdir / f"pre-{order.job_id}.env")
                argv = ["/bin/sh", "-c", _PRE_SCRIPT, "pilot-pre", script, env_file]
            else:
                argv = ["/bin/sh", "-c", _POST_SCRIPT, "pilot-post", script]
        files: list[int] = []
        try:
            if order.stdin_path is None and order.stdout_path is None and order.stderr_path is None:
                streams = _NO_STREAMS
            else:
                streams = self._streams(order, cwd, files)
            pin = not spawner.pinned and bool(order.cores)
            if pin:
                os.sched_setaffinity(0, {self._cpu_map.get(c, c) for c in order.cores})
            try:
                t0, m0 = time.time(), time.monotonic()
                popen = None
                if spawner.own_cwd and not order.rlimits:
                    pid = self._posix_spawn(spawner, argv, cwd, env, streams)
                else:
                    popen = subprocess.Popen(
                        argv,
                        cwd=cwd,
                        env=env,
                        stdin=streams[0],
                        stdout=streams[1],
                        stderr=streams[2],
                        close_fds=True,
                        start_new_session=True,
                        preexec_fn=_limits(order.rlimits) if order.rlimits else None,
                    )
                    pid = popen.pid
            finally:
                if pin:
                    os.sched_setaffinity(0, self._all_cpus)
        except _OpenError as exc:
            self._emit(Event(order.job_id, order.slot, "failed", time.time(), {"message": str(exc)}))
            return False
        except subprocess.SubprocessError as exc:  # a limit the kernel refused in the child
            message = f"setting the ResourceLimits {order.rlimits} failed: {exc}"
            self._emit(Event(order.job_id, order.slot, "failed", time.time(), {"message": message}))
            return False
        except OSError as exc:
            self._emit(
                Event(order.job_id, order.slot, "failed", time.time(), {"message": self._explain(exc, argv, cwd, env)})
            )
            return False
        finally:
            for fd in set(files):
                os.close(fd)
        started = Event(order.job_id, order.slot, "started", t0, {"pid": pid})
        run = Running(order, pid, popen, t0, m0, env_file, env if env_file is not None else None, start_event=started)
        with self._lock:
            self._by_pid[pid] = run
            self._by_key[key] = run
            early = self._early.pop(pid, None) if self._early else None
            self._events.append(started)  # no wake-up: see drain
            # Not pending from here on, in the same step: an exit reaped right away (a short task's)
            # must not see its own order still being started, and be held for it (_report).
            self._unpend(order)
            self._cv.notify()  # (a reaper that lost its sentinel waits for it)
            if self._pidfds:  # in the same step: the reaper never sees "nothing left" while it starts
                if spawner.reaps and popen is None:
                    spawner.child = pid
                else:
                    self._watch(pid)
        if early is not None:
            try:
                self._finish(pid, *early)
            except Exception:  # it started: the spawner must not count it as never started
                log.exception("reaping an early exit failed", job=order.job_id, slot=order.slot)
        return True

    def _environment(self, order: ProcessOrder) -> dict[str, str]:
        """The task's environment: :func:`environment.build` with the rank's variables last, then the
        node's over them (built in place: no second map of "extra" variables to copy in)."""
        env = environment.build(
            inherit=order.inherit_environment,
            base=self._base_env,
            job=order.environment,
            pre=order.pre_environment,
            pre_unset=order.pre_unset,
            extra=order.rank_environment,
        )
        return self._add_node_variables(env, order)

    def _add_node_variables(self, env: dict[str, str], order: ProcessOrder) -> dict[str, str]:
        """Set what the node tells its tasks, over the job's own variables: the node that really started
        it (SSS Task <Node>), the node file, the GPUs."""
        env["PILOT_NODE"] = self._node.name
        if order.nodefile_hosts is not None:
            env["PSIJ_NODEFILE"] = self._nodefile(order.nodefile_hosts)
        if order.gpus or self._node.gpus:
            env.update(environment.gpu_environment(order.gpus, node_has_gpus=bool(self._node.gpus)))
        return env

    def _streams(self, order: ProcessOrder, cwd: str, files: list[int]) -> tuple[int, int, int]:
        """The task's stdin, stdout and stderr, opened here (``files``: what to close after the spawn)."""
        stdin = self._open(order.stdin_path, cwd, "rb", files, "stdin_path")
        mode = "wb" if order.truncate_output else "ab"
        stdout = self._open(order.stdout_path, cwd, mode, files, "stdout_path")
        if order.stderr_path is not None and order.stderr_path == order.stdout_path:
            stderr = stdout
        else:
            stderr = self._open(order.stderr_path, cwd, mode, files, "stderr_path")
        return stdin, stdout, stderr

    def _posix_spawn(
        self, spawner: _Spawner, argv: list[str], cwd: str, env: dict[str, str], streams: tuple[int, int, int]
    ) -> int:
        """What ``Popen`` does for a task, for less than half its CPU: ``posix_spawn`` (vfork and exec;
        ``os.posix_spawn`` holds the GIL until the child has exec'd, which measured better than
        releasing it: fewer GIL hand-offs) in the task's directory (this thread's own cwd), new session, SIGPIPE and
        SIGXFSZ back to default, only fds 0-2 inherited (every other fd is close-on-exec: _seal_fds),
        the executable found in the task's own PATH."""
        if spawner.cwd != cwd:
            os.chdir(cwd)  # this thread's cwd only (_own_cwd)
            spawner.cwd = cwd
        now = time.monotonic()
        if now - self._fds_sealed > _SEAL_INTERVAL:
            self._fds_sealed = now
            _seal_fds()
        exe = argv[0]
        path = exe if "/" in exe else _which(exe, env)
        if streams is _NO_STREAMS:
            actions = self._null_actions
        else:
            devnull = self._devnull
            actions = [
                (os.POSIX_SPAWN_DUP2, devnull if fd == subprocess.DEVNULL else fd, i) for i, fd in enumerate(streams)
            ]
        return os.posix_spawn(path, argv, env, file_actions=actions, setsid=True, setsigdef=_DEFAULT_SIGNALS)

    def _open(self, path: str | None, cwd: str, mode: str, files: list[int], what: str) -> int:
        """Open a task's stream file. Non-blocking, so a FIFO without a peer cannot wedge the spawner
        (reading one with no writer gives EOF; writing one with no reader fails clearly)."""
        if path is None:
            return subprocess.DEVNULL
        full = os.path.join(cwd, os.path.expanduser(path))
        flags = _MODES[mode] | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(full, flags, 0o666)
        except OSError as exc:
            hint = " (a FIFO with no reader)" if exc.errno == errno.ENXIO else ""
            raise _OpenError(f"cannot open {what} {full!r}: {exc.strerror}{hint}") from None
        os.set_blocking(fd, True)
        files.append(fd)
        return fd

    def _explain(self, exc: OSError, argv: list[str], cwd: str, env: dict[str, str]) -> str:
        node = self._node.name
        if not os.path.isdir(cwd):
            return f"directory {cwd!r} does not exist on node {node}"
        exe = argv[0]
        if isinstance(exc, FileNotFoundError):
            if "/" in exe:
                return f"executable {exe!r} not found on node {node} (relative to {cwd!r})"
            return f"executable {exe!r} not found in PATH on node {node} (PATH={env.get('PATH', os.defpath)})"
        if isinstance(exc, PermissionError):
            return f"executable {exe!r} cannot be run on node {node}: permission denied"
        return f"cannot start {exe!r} on node {node}: {exc.strerror or exc}"

    def _nodefile(self, hosts: list[str]) -> str:
        key = tuple(hosts)
        with self._nodefiles_lock:  # spawner threads (one per pinned cpu) share the files
            path = self._nodefiles.get(key)
            if path is None:
                path = str(self._workdir / f"nodes-{len(self._nodefiles)}.txt")
                Path(path).write_text("".join(h + "\n" for h in hosts))
                self._nodefiles[key] = path
        return path

    # -- reaper thread --------------------------------------------------------------------------

    def _watch(self, pid: int) -> None:
        """Have the reaper wait for ``pid`` (the lock held): by a pidfd, or, where none can be opened
        (out of file descriptors), by a look every ``_POLL_INTERVAL``."""
        assert self._epoll is not None
        try:
            fd = os.pidfd_open(pid)
        except OSError as exc:
            if not self._polled:
                log.warning("no pidfd for a task; looking for its exit every 50 ms", error=str(exc))
            self._polled.add(pid)
            self._wake_reaper()
            return
        self._reaped_by_fd[fd] = pid
        self._epoll.register(fd, select.EPOLLIN)

    def _wake_reaper(self) -> None:
        if self._reaper_wake is not None:
            try:
                os.write(self._reaper_wake[1], b"\0")
            except BlockingIOError:
                pass  # woken already

    def _reap(self, pid: int) -> None:
        """Wait for one child that has exited or will (nobody else waits for it) and report it."""
        try:
            _, status, rusage = os.wait4(pid, 0)
        except ChildProcessError:  # not ours to wait for any more: cannot happen, never block on it
            log.error("a task's exit was taken by someone else", pid=pid)
            return
        self._finish(pid, status, rusage, time.monotonic())

    def _reap_loop(self) -> None:
        if self._epoll is not None:
            self._reap_by_pidfd(self._epoll)
            return
        sentinel = self._sentinel
        while sentinel is not None:  # wait4 blocks even with no task: nothing needs to wake this thread
            try:
                pid, status, rusage = os.wait4(-1, 0)
            except ChildProcessError:  # someone else reaped the sentinel (no code of the agent's does)
                break
            if pid == sentinel:
                sentinel = None  # stopping (or it was killed): wait as below, until the last task exits
            else:
                self._finish(pid, status, rusage, time.monotonic())
        while True:
            with self._cv:
                while not self._by_pid and not self._stopping:
                    self._cv.wait()
                if not self._by_pid and self._stopping and not self._pending_orders:
                    return
            try:
                pid, status, rusage = os.wait4(-1, 0)
            except ChildProcessError:
                with self._cv:
                    if self._stopping and not self._by_pid:
                        return
                    self._cv.wait(timeout=0.05)
                continue
            self._finish(pid, status, rusage, time.monotonic())

    def _reap_by_pidfd(self, ep: select.epoll) -> None:
        """Wait for the children no pinned spawner waits for itself, each by its pidfd; never
        ``wait4(-1)``, which would take a pinned spawner's child from under it. Ends once stopping with
        no child left to wait for and no order being started."""
        assert self._reaper_wake is not None
        wake = self._reaper_wake[0]
        while True:
            with self._lock:
                if self._stopping and not self._reaped_by_fd and not self._polled and not self._pending_orders:
                    break
                look = self._stopping or bool(self._polled)
            for fd, _ in ep.poll(_POLL_INTERVAL if look else -1):
                if fd == wake:
                    try:
                        os.read(wake, 4096)
                    except BlockingIOError:
                        pass
                    continue
                with self._lock:
                    pid = self._reaped_by_fd.pop(fd, None)
                if pid is not None:  # (every fd but the wake pipe's is a child's pidfd)
                    ep.unregister(fd)
                    os.close(fd)
                    self._reap(pid)  # readable: it has exited
            if self._polled:
                for pid in list(self._polled):
                    try:
                        done, status, rusage = os.wait4(pid, os.WNOHANG)
                    except ChildProcessError:  # cannot happen: nobody else waits for it
                        log.error("a task's exit was taken by someone else", pid=pid)
                        done, rusage = pid, None
                    if done:
                        with self._lock:
                            self._polled.discard(pid)
                        if rusage is not None:
                            self._finish(pid, status, rusage, time.monotonic())
        ep.close()
        for fd in self._reaper_wake:
            os.close(fd)

    def _finish(self, pid: int, status: int, rusage: Any, mono: float) -> None:
        with self._lock:
            run = self._by_pid.pop(pid, None)
            if run is None:
                self._early[pid] = (status, rusage, mono)
                return
            # The process is gone: its cores first, so that the order waiting on them reaches its
            # spawner before anything else (the task's exit event, the loop's wake-up) takes the GIL.
            self._free(run.order)
            key = (run.order.job_id, run.order.slot)
        code = os.waitstatus_to_exitcode(status)
        if run.popen is not None:
            run.popen.returncode = code  # reaped here: its Popen must not wait for it again
        data: dict[str, Any] = {
            "started": run.started,
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "wall_duration": max(0.0, mono - run.started_mono),
            "user_cpu_time": rusage.ru_utime,
            "system_cpu_time": rusage.ru_stime,
            "max_rss": max(rusage.ru_maxrss * 1024, run.peak_tree_rss),
            "processors": len(run.order.cores),
            "reason": run.reason,
        }
        if run.env_file is not None:
            after = _read_env(run.env_file)
            if after is not None and run.env is not None:
                data["environment"], data["unset"] = environment.changes(run.env, after)
        event = Event(run.order.job_id, run.order.slot, "exited", run.started + data["wall_duration"], data)
        with self._lock:
            if self._by_key.get(key) is run:
                del self._by_key[key]  # in the same step as its exit event: see snapshot()
            events = self._events
            if events and events[-1] is run.start_event:
                # Not sent yet, and the exit carries the start (a short task's, mostly): one event, not
                # two to hold, drain and match up (drain, Agent._forward drop it otherwise).
                events.pop()
            wake = self._report(event)
        if wake:
            self._notify()

    def _emit(self, event: Event) -> None:
        with self._lock:
            first = self._report(event)
        if first:
            self._notify()

    def _report(self, event: Event) -> bool:
        """Queue an exit or failure (the lock held). True if the loop must be woken: only for the first
        one not drained yet (the loop then drains or holds them all, next_deadline), and not when
        :meth:`drain` would hold it anyway and the loop comes back by the end of that hold by itself
        (``_loop_due``) or is woken by the spawner that takes a handed-off order (``_wake_owed``): a
        wake-up now would only make the loop compete for the GIL with the thread that hands that
        order over and the spawner that starts it. Exits of short tasks wait up to ``_EXIT_HOLD``, where
        batching pays most (many per second), but only until half the orders that waited here when the
        first of them came have started (``_low_water``): the other half keeps the cores busy while the
        daemon answers the batch with more. An agent that runs few tasks per second (one core of many
        nodes) so sends batches as large as one that runs many. While an exit of a task that ran
        ``_HOLD_UNDER`` or longer is among them, ``_EXIT_HOLD_LONG``. A failure or a withdrawal is
        reported at once, with whatever was held."""
        self._events.append(event)
        wall = event.data.get("wall_duration")
        if event.kind != "exited" or not isinstance(wall, float):
            wake = not self._urgent
            self._urgent = True
            if self._report_since is None:
                self._report_since = time.monotonic()
            return wake
        hold = _EXIT_HOLD if wall < _HOLD_UNDER else _EXIT_HOLD_LONG
        if self._report_since is not None:
            self._hold = min(self._hold, hold)  # the loop's deadline stays as it was: at most later
            if self._urgent or len(self._waiting) > self._low_water:
                return False
            self._urgent = True  # half the queue is gone: the daemon must send more
        else:
            now = self._report_since = time.monotonic()
            self._hold = hold
            self._low_water = len(self._waiting) // 2
            if not self._waiting:
                self._urgent = True
            elif self._loop_due <= now + hold:
                return False
        if self._handoffs:
            self._wake_owed = True
            return False
        return True


_START_HOLD: Final = 0.005  # seconds a running task's ``started`` event may wait for its exit (drain)
#: Seconds the exits of short tasks may wait at most to go together while orders wait here (drain, _report).
_EXIT_HOLD: Final = 0.02
_EXIT_HOLD_LONG: Final = 0.002  # the same for exits of tasks that ran _HOLD_UNDER or longer (few per second)
_HOLD_UNDER: Final = 0.02
_SEAL_INTERVAL: Final = 1.0  # seconds between checks that no stray fd would leak into tasks
_DEFAULT_SIGNALS: Final = (signal.SIGPIPE, signal.SIGXFSZ)  # ignored by Python, default for tasks (as Popen)
_CLONE_FS: Final = 0x00000200
_DIRS_KEPT: Final = 256  # order directories whose resolved cwd a spawner keeps
#: The streams of a task that names none: /dev/null for all three (one file-actions list for them all).
_NO_STREAMS: Final = (subprocess.DEVNULL, subprocess.DEVNULL, subprocess.DEVNULL)
_MAX_PINNED: Final = 1024  # pinned spawner threads at most (one per real cpu used by one-cpu orders)
_POLL_INTERVAL: Final = 0.05  # seconds between the reaper's looks when stopping, or at a child without pidfd

_MODES: Final = {
    "rb": os.O_RDONLY,
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
}


class _OpenError(Exception):
    pass


def _limits(rlimits: list[list[Any]]) -> Callable[[], None]:
    """SSS ResourceLimits, set in the child between fork and exec so they hold from the first
    instruction (only orders that carry limits pay for the preexec path; the others keep vfork)."""
    settings = []
    for name, soft, hard in rlimits:
        res = getattr(resource, name)
        cur_soft, cur_hard = resource.getrlimit(res)
        h = cur_hard if hard is None else (resource.RLIM_INFINITY if hard == -1 else hard)
        sv = cur_soft if soft is None else (resource.RLIM_INFINITY if soft == -1 else soft)
        if cur_hard != resource.RLIM_INFINITY and (h == resource.RLIM_INFINITY or h > cur_hard) and os.geteuid():
            raise _OpenError(
                f"ResourceLimit {name}: the hard limit {'unlimited' if hard == -1 else hard} is above this node's "
                f"{cur_hard}, which only root may raise; ask for at most {cur_hard}"
            )
        if h != resource.RLIM_INFINITY and (sv == resource.RLIM_INFINITY or sv > h):
            sv = h
        settings.append((res, (sv, h)))

    def apply() -> None:
        for res, limits in settings:
            resource.setrlimit(res, limits)

    return apply


def _read_env(path: str) -> dict[str, str] | None:
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


@dataclass(slots=True)
class _Spawner:
    """One spawner thread's own state."""

    pinned: bool  # the thread runs on exactly the cpus of the orders it gets
    own_cwd: bool  # the thread has its own cwd (unshare CLONE_FS): tasks start by posix_spawn
    reaps: bool = False  # the thread waits for what it started itself (one declared core on its cpu)
    child: int | None = None  # what it started and waits for next
    cwd: str | None = None  # the thread's cwd, once it changed it
    dirs: dict[str, str] = field(default_factory=dict)  # an order's directory -> the task's cwd


def _own_cwd() -> bool:
    """Give the calling thread its own cwd (Linux ``unshare(CLONE_FS)``), so it can chdir to a task's
    directory and posix_spawn there without moving the other threads. False where that is refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_FS) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("spawner thread cannot have its own cwd; starting tasks with Popen", error=str(exc))
        return False
    return True


#: ``PILOT_AGENT_PIDFDS=0`` makes an agent reap as it does where pidfds are missing (to compare, or to
#: work around a kernel whose pidfds misbehave).
ENV_PIDFDS: Final = "PILOT_AGENT_PIDFDS"


def _pidfds_work() -> bool:
    """Whether this system gives pidfds (Linux 5.3 or later): then children are waited for one by one."""
    if not hasattr(os, "pidfd_open") or os.environ.get(ENV_PIDFDS, "").strip() in ("0", "no", "false", "off"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def _seal_fds() -> None:
    """Make every fd above 2 close-on-exec (Python's own are; one inherited from the agent's parent or
    made by a C library might not be), so posix_spawn passes a task only its 0-2, as Popen's close_fds."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    os.set_inheritable(fd, False)
            except OSError:
                pass  # closed meanwhile (or the listing's own fd)


def _which(exe: str, env: dict[str, str]) -> str:
    """``exe`` in the task's PATH, as Popen looks it up (unchanged when not found: the spawn then fails
    with ENOENT, explained by ``_explain``)."""
    for d in os.get_exec_path(env):
        path = os.path.join(d, exe)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return exe
