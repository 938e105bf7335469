"""Spawner threads: orders become processes off the event loop.

Through the spawner's helper (:mod:`agent.forkserver`, so that a task's max_rss is its own), else
``posix_spawn``; without a shell, in a process group of its own so the whole tree can be signalled (and
marked, so that what leaves that group is found too: :mod:`agent.trees`), pinned by the spawning
thread's own affinity, which the child (and the helper) inherits: one spawner per real cpu that one-cpu orders use,
pinned to it once and for all, and one general spawner that sets its affinity around each order that
spans several cpus. With pidfds, a pinned spawner whose cpu is one declared core waits for its task
itself, and starts the order that waited for that core right after, on the same thread: no hand-over to
another thread and its wake-up between one task's exit and the next one's start (that hand-over left the
core idle ~10 % of the time with short tasks).

Who owns what: each thread owns its :class:`_Spawner` (its cwd, its resolved directories, the child it
waits for) and touches it without a lock. :class:`Spawners` owns what every spawner reads and nobody
changes after the engine starts (the node, the base environment, /dev/null, the cpus), the node files
(under a lock of their own: several spawners write them) and the queues. The pinned threads and their
queues are created under the engine's lock (:meth:`Spawners.hand`, called from its ``_accept``). What a
started process becomes in the table, and every event, is the engine's: a spawner hands both over
through ``_taken``, ``_started``, ``_never_started`` and ``_emit``.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import ChainMap, Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, Final

import structlog

from agent import chaining, environment, forkserver
from agent.chaining import Cancel, Chain, Item
from agent.forkserver import ForkServer, HelperGone, SpawnError
from agent.output_streams import StreamCollector
from agent.table import Running
from agent.trees import MARK
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.thread_names import name_os_thread
from pilot.wire.messages import ProcessRef, TaskEvent

if TYPE_CHECKING:
    from agent.processes import ProcessEngine

log = structlog.get_logger("agent.processes")

#: Sourced by the pre process: the script's exports are captured NUL-separated for the ranks.
_PRE_SCRIPT: Final = 'if [ -n "$1" ]; then . "$1" || exit $?; fi\nexec env -0 > "$2"'
_POST_SCRIPT: Final = '. "$1"'

_SEAL_INTERVAL: Final = 1.0  # seconds between checks that no stray fd would leak into tasks
_DEFAULT_SIGNALS: Final = (signal.SIGPIPE, signal.SIGXFSZ)  # ignored by Python, default for tasks (as Popen)
_CLONE_FS: Final = 0x00000200
_DIRS_KEPT: Final = 256  # order directories whose resolved cwd a spawner keeps
#: The streams of a task that names none: /dev/null for all three (one file-actions list for them all).
_NO_STREAMS: Final = (subprocess.DEVNULL, subprocess.DEVNULL, subprocess.DEVNULL)
_BLOCKS_KEPT: Final = 64  # encodings of the agent's environment kept (_base_block)
_NONE_SET: Final[frozenset[str]] = frozenset()  # _base_block's key when a task overrides no inherited variable
_MAX_PINNED: Final = 1024  # pinned spawner threads at most (one per real cpu used by one-cpu orders)

_MODES: Final = {
    "rb": os.O_RDONLY,
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
}


class _OpenError(Exception):
    pass


@dataclass(slots=True)
class Prepared:
    """A task ready to start (:meth:`Spawners.prepare`)."""

    order: ProcessOrder
    tag: int  # numbers the agent's starts: the task's mark (agent.trees)
    argv: list[str]
    cwd: str
    env: Mapping[str, str] | None  # the task's whole environment; None: ``sent`` over the agent's
    sent: Mapping[str, str]  # what the helper's request carries (over ``base``)
    base: forkserver.EnvBlock | None  # the agent's environment, encoded once (Spawners._base_block)
    full: dict[str, str] | None  # the whole environment, built (without a helper, or for a pre process)
    env_file: str | None  # where a pre process leaves its environment
    files: list[int] = field(default_factory=list)  # stream files opened for it, closed once it starts

    def running(
        self,
        pid: int,
        popen: subprocess.Popen[bytes] | None,
        started: float,
        mono: float,
        signal: Callable[[int], None] | None = None,
    ) -> tuple[Running, TaskEvent]:
        """Its row in the engine's table once it has started, and its ``started`` event."""
        order = self.order
        event = TaskEvent(order.job_id, order.slot, "started", started, {"pid": pid})
        full = self.full if self.env_file is not None else None
        run = Running(
            order, pid, popen, started, mono, self.env_file, full, start_event=event, tag=self.tag, signal=signal
        )
        return run, event


@dataclass(slots=True)
class _Spawner:
    """One spawner thread's own state."""

    pinned: bool  # the thread runs on exactly the cpus of the orders it gets
    own_cwd: bool  # the thread has its own cwd (unshare CLONE_FS): tasks start by posix_spawn
    reaps: bool = False  # the thread waits for what it started itself (one declared core on its cpu)
    child: int | None = None  # what it started and waits for next
    cwd: str | None = None  # the thread's cwd, once it changed it
    dirs: dict[str, str] = field(default_factory=dict)  # an order's directory -> the task's cwd
    helper: ForkServer | None = None  # what starts its tasks (agent.forkserver); None: it does itself
    chained: bool = False  # its tasks start through a chained helper (agent.chaining)


@dataclass(slots=True)
class Lane:
    """A pinned spawner: its queue, its thread, and its chain if it is one."""

    queue: SimpleQueue[Item]
    thread: threading.Thread
    chain: Chain | None

    def put(self, item: Item) -> None:
        if self.chain is not None:
            self.chain.put(item)  # (and wakes its thread)
        else:
            self.queue.put(item)


class Spawners:
    def __init__(
        self,
        *,
        engine: ProcessEngine,
        node: NodeConfigured,
        workdir: Path,
        cpu_map: dict[int, int],
        own_reaping: bool,
        mark: str,
    ) -> None:
        """``mark``: how the value of every task's ``MARK`` starts (the agent's, agent.trees)."""
        self._engine = engine
        self._node = node
        self._cpu_map = cpu_map
        self._workdir = workdir
        self._orders: SimpleQueue[Item] = SimpleQueue()  # the general spawner's
        #: One spawner per real cpu that one-cpu orders ran on, pinned to it once: setting the spawning
        #: thread's affinity per order migrates it first (~150 us, the GIL held), for every task.
        self._pinned: dict[int, Lane] = {}
        self._puts: dict[int, Callable[[Item], None]] = {}  # a declared core -> its lane's put (hand)
        self._nodefiles: dict[tuple[str, ...], str] = {}
        self._nodefiles_lock = threading.Lock()
        self._all_cpus = sorted(os.sched_getaffinity(0))
        self._cwd = os.getcwd()  # the agent's; spawner threads each have their own (see _own_cwd)
        self.devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        #: Where streamed tasks' output goes (started and stopped by the engine).
        self.streams = StreamCollector(node=node.name, workdir=workdir)
        self._null_actions = [(os.POSIX_SPAWN_DUP2, self.devnull, i) for i in range(3)]  # (_NO_STREAMS)
        #: Real cpus that one declared core alone maps to: their pinned spawner runs one task at a time
        #: and waits for it itself, so the next one starts on the same thread (see _loop). Only with
        #: ``own_reaping`` (pidfds: no thread waits for any child but its own).
        shared = Counter(self._cpu_map.get(c, c) for c in node.processors)
        self._own_reaping = {cpu for cpu, n in shared.items() if n == 1} if own_reaping else set()
        self._fds_sealed = 0.0  # monotonic time of the last _seal_fds
        _seal_fds()
        self._base_env = environment.inherited()
        self._base_blocks: dict[frozenset[str], forkserver.EnvBlock] = {}  # (_base_block)
        self._tags = itertools.count(1)  # (next() is atomic: the spawners share it)
        self._mark = mark
        #: The spawn helper's executable (each spawner starts one: agent.forkserver); None: spawners start
        #: tasks from the agent's own process, whose size then counts in every task's max_rss.
        self._helper_exe = forkserver.build(workdir=workdir) if forkserver.enabled() else None
        if self._helper_exe is None and not forkserver.enabled():
            log.info("spawning tasks from the agent's process", setting=f"{forkserver.ENV_FORKSERVER}=0")
        #: Declared cores whose cpu's spawner chains its tasks (agent.chaining): one declared core alone on
        #: a cpu, pidfds, and a helper. Not all of them get a chain: only those in use (hand).
        self.chain_cores: frozenset[int] = frozenset(
            c
            for c in node.processors
            if self._helper_exe is not None and chaining.enabled() and self._cpu_map.get(c, c) in self._own_reaping
        )
        self.thread = threading.Thread(target=self._loop, name="pilot-spawner", daemon=True)

    def hand(self, order: ProcessOrder, *, stopping: bool) -> None:
        """Put an order on its spawner's queue (the engine's lock held): the pinned spawner of its one
        real cpu, started on first use (chained where its core is a chain core), or the general one."""
        cores = order.cores
        if len(cores) == 1:
            put = self._puts.get(cores[0])
            if put is not None and not stopping:
                put(order)
                return
            cpu: int | None = self._cpu_map.get(cores[0], cores[0])
        else:
            cpus = {self._cpu_map.get(c, c) for c in cores}
            cpu = cpus.pop() if len(cpus) == 1 else None
        if cpu is not None and not stopping:
            lane = self._pinned.get(cpu)
            if lane is None and len(self._pinned) < _MAX_PINNED and cpu in self._all_cpus:
                if len(cores) == 1 and cores[0] in self.chain_cores and self._helper_exe is not None:
                    chain = Chain(
                        spawners=self, engine=self._engine, cpu=cpu, exe=self._helper_exe, devnull=self.devnull
                    )
                    lane = self._pinned[cpu] = Lane(chain.queue, chain.thread, chain)
                else:
                    queue: SimpleQueue[Item] = SimpleQueue()
                    thread = threading.Thread(
                        target=self._loop, args=(queue, cpu), name=f"pilot-spawner-{cpu}", daemon=True
                    )
                    lane = self._pinned[cpu] = Lane(queue, thread, None)
                lane.thread.start()
            if lane is not None:
                if len(cores) == 1:
                    self._puts[cores[0]] = lane.queue.put if lane.chain is None else lane.chain.put
                lane.put(order)
                return
        self._orders.put(order)

    def cancel(self, ref: ProcessRef) -> None:
        """Withdraw the order of ``ref`` wherever a chain has queued it at its helper (the engine's lock
        held: a kill of an order not started yet)."""
        for lane in self._pinned.values():
            if lane.chain is not None:
                lane.chain.put(Cancel(ref))

    def pinned(self) -> list[Lane]:
        """The pinned spawners (the engine's lock held)."""
        return list(self._pinned.values())

    def stop(self, pinned: list[Lane]) -> None:
        """Have every spawner end once it has taken the orders queued before."""
        self._orders.put(None)
        for lane in pinned:
            lane.put(None)

    def close(self) -> None:
        """Once no spawner runs."""
        os.close(self.devnull)

    # -- spawner threads ------------------------------------------------------------------------

    def _loop(self, queue: SimpleQueue[Item] | None = None, cpu: int | None = None) -> None:
        """Spawn the orders of ``queue`` (default: the general one) in order. With ``cpu``, this thread
        runs on that cpu alone, so what it spawns inherits that pinning without a syscall per order."""
        name_os_thread()
        spawner = self.spawner(cpu, reaps=cpu in self._own_reaping)
        spawner.helper = self.start_helper()
        try:
            self.serve(self._orders if queue is None else queue, spawner)
        finally:
            if spawner.helper is not None:
                spawner.helper.close()

    def spawner(self, cpu: int | None, *, reaps: bool) -> _Spawner:
        """The calling thread's spawner state, the thread pinned to ``cpu`` first (if given and allowed)."""
        if cpu is not None:
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError as exc:
                log.warning("cannot pin a spawner thread; pinning per order", cpu=cpu, error=str(exc))
                cpu = None
        return _Spawner(pinned=cpu is not None, own_cwd=_own_cwd(), reaps=cpu is not None and reaps)

    def seal_fds(self) -> None:
        """Before a helper starts: no fd of the agent's but 0-2 reaches it (see _seal_fds)."""
        _seal_fds()

    def start_helper(self) -> ForkServer | None:
        """The calling spawner's helper (pinned like the thread), or None to spawn from this process."""
        if self._helper_exe is None:
            return None
        _seal_fds()  # (the helper closes every fd above its socket, where the kernel has close_range)
        try:
            return ForkServer(self._helper_exe, devnull=self.devnull)
        except (OSError, HelperGone) as exc:
            log.warning("cannot start the spawn helper; spawning from the agent's process", error=str(exc))
            return None

    def serve(self, queue: SimpleQueue[Item], spawner: _Spawner) -> None:
        """Start the orders of ``queue`` one by one until its None."""
        engine = self._engine
        while True:
            order = queue.get()
            if order is None:
                return
            if not isinstance(order, ProcessOrder):  # (a chain's item, for its helper: it has none now)
                continue
            spawned = False
            try:
                spawned = self._spawn(order, spawner)
            except Exception as exc:  # never let one order kill the spawner
                log.exception("spawn crashed", job=order.job_id, slot=order.slot)
                engine._emit(
                    TaskEvent(order.job_id, order.slot, "failed", time.time(), {"message": f"agent error: {exc}"})
                )
            finally:
                if not spawned:
                    engine._never_started(order)
            child, spawner.child = spawner.child, None
            if child is not None:
                # This cpu's task: wait for it here, and the order that waits for its core starts on this
                # thread right after, with no hand-over to another thread (and its wake-up) between.
                engine._reaper.reap(child)

    def _spawn(self, order: ProcessOrder, spawner: _Spawner) -> bool:
        """Start one order from a spawner thread; True when a process now runs for it."""
        ref = (order.job_id, order.slot)
        if not self._engine._taken(ref):
            return False
        prep = self.prepare(order, spawner)
        try:
            streams = self.open_streams(prep)
            helper = spawner.helper
            pin = not spawner.pinned and bool(order.cores)
            if pin and helper is None:
                os.sched_setaffinity(0, {self._cpu_map.get(c, c) for c in order.cores})
            try:
                t0, m0 = time.time(), time.monotonic()
                popen = None
                if helper is not None:
                    cpus = {self._cpu_map.get(c, c) for c in order.cores} if pin else None
                    pid = self._helper_spawn(spawner, helper, prep, streams, cpus)
                elif prep.full is None:  # (cannot be: without a helper, the whole environment is built)
                    raise RuntimeError("no environment for a spawn without the helper")
                elif spawner.own_cwd and not order.rlimits:
                    pid = self._posix_spawn(spawner, prep.argv, prep.cwd, prep.full, streams)
                else:
                    popen = subprocess.Popen(
                        prep.argv,
                        cwd=prep.cwd,
                        env=prep.full,
                        stdin=streams[0],
                        stdout=streams[1],
                        stderr=streams[2],
                        close_fds=True,
                        process_group=0,
                        preexec_fn=_limits(order.rlimits) if order.rlimits else None,
                    )
                    pid = popen.pid
            finally:
                if pin and helper is None:
                    os.sched_setaffinity(0, self._all_cpus)
        except (_OpenError, subprocess.SubprocessError, OSError) as exc:
            self.fail(prep, exc)
            return False
        finally:
            self.close_files(prep)
        run, event = prep.running(pid, popen, t0, m0)
        if self._engine._started(ref, run, event, reaps=spawner.reaps and popen is None):
            spawner.child = pid
        return True

    def prepare(self, order: ProcessOrder, spawner: _Spawner) -> Prepared:
        """What a task is started with: its directory, argv and environment, its mark's tag."""
        cwd = spawner.dirs.get(order.directory)
        if cwd is None:
            directory = order.directory
            cwd = os.path.join(self._cwd, os.path.expanduser(directory)) if directory else self._cwd
            if len(spawner.dirs) < _DIRS_KEPT:
                spawner.dirs[directory] = cwd
        tag = next(self._tags)
        mark = f"{self._mark}{tag}:{order.job_id}"
        base: forkserver.EnvBlock | None = None
        full: dict[str, str] | None = None
        env: Mapping[str, str] | None  # None: ChainMap(sent, the agent's), made only where needed (_over)
        if (
            (spawner.helper is not None or spawner.chained)
            and order.role == "rank"
            and order.inherit_environment
            and not order.pre_environment
            and not order.pre_unset
        ):
            # The agent's environment goes to the helper encoded once (_base_block); per task only
            # what is set over it.
            if order.environment:
                sent = environment.over_base(base=self._base_env, job=order.environment, extra=order.rank_environment)
            else:  # (what over_base gives then, with no call)
                sent = dict(order.rank_environment)
            self._add_node_variables(sent, order)
            sent[MARK] = mark
            common = self._base_env.keys() & sent.keys()  # (_base_block's key: its cached block, no call)
            base = self._base_blocks.get(frozenset(common) if common else _NONE_SET) or self._base_block(sent)
            env = None
        else:
            env = sent = full = self._environment(order)
            full[MARK] = mark
        env_file = None
        if order.role == "rank":
            exe, args = order.executable, order.arguments
            if "${" in exe or (args and "${" in "\0".join(args)):
                if env is None:
                    env = self._over(sent)
                argv = [environment.substitute(exe, env), *[environment.substitute(a, env) for a in args]]
            else:  # (most tasks: nothing to substitute, no call per string)
                argv = [exe, *args]
        else:
            script = os.path.join(cwd, os.path.expanduser(order.script)) if order.script else ""
            if order.role == "pre":
                env_file = str(self._workdir / f"pre-{order.job_id}.env")
                argv = ["/bin/sh", "-c", _PRE_SCRIPT, "pilot-pre", script, env_file]
            else:
                argv = ["/bin/sh", "-c", _POST_SCRIPT, "pilot-post", script]
        return Prepared(order, tag, argv, cwd, env, sent, base, full, env_file)

    def open_streams(self, prep: Prepared) -> tuple[int, int, int]:
        """The task's stdin, stdout and stderr (:class:`_OpenError` when one cannot be opened); what was
        opened goes to ``prep.files``, for :meth:`close_files` once the task has them."""
        order = prep.order
        if not names_streams(order):
            return _NO_STREAMS
        return self._streams(order, prep.cwd, prep.files)

    def close_files(self, prep: Prepared) -> None:
        if prep.files:
            for fd in set(prep.files):
                os.close(fd)
            prep.files.clear()

    def request(self, prep: Prepared, cpus: set[int] | None) -> bytes:
        """The helper's request for the task (forkserver.request)."""
        exe = prep.argv[0]
        path = exe if "/" in exe else _which(exe, self.environ(prep))
        limits = _limit_settings(prep.order.rlimits) if prep.order.rlimits else []
        return forkserver.request(path, prep.argv, prep.sent, cwd=prep.cwd, cpus=cpus, limits=limits, base=prep.base)

    def environ(self, prep: Prepared) -> Mapping[str, str]:
        """The task's whole environment."""
        return self._over(prep.sent) if prep.env is None else prep.env

    def fail(self, prep: Prepared, exc: Exception) -> None:
        """Report that the task could not start, and why, in the user's terms."""
        order = prep.order
        if isinstance(exc, _OpenError):
            message = str(exc)
        elif isinstance(exc, subprocess.SubprocessError):  # a limit the kernel refused in the child
            message = f"setting the ResourceLimits {order.rlimits} failed: {exc}"
        elif isinstance(exc, SpawnError) and exc.step == forkserver.STEP_RLIMIT:
            message = f"setting the ResourceLimits {order.rlimits} failed: {exc.strerror}"
        elif isinstance(exc, OSError):
            message = self._explain(exc, prep.argv, prep.cwd, self.environ(prep))
        else:
            message = f"agent error: {exc}"
        self._engine._emit(TaskEvent(order.job_id, order.slot, "failed", time.time(), {"message": message}))

    def _helper_spawn(
        self,
        spawner: _Spawner,
        helper: ForkServer,
        prep: Prepared,
        streams: tuple[int, int, int],
        cpus: set[int] | None,
    ) -> int:
        """Start the task through the spawner's helper. One that has gone is replaced; the order goes to
        the new one if the old never got it, else it fails (its task may have started: never start it
        twice), as it does when no new helper starts."""
        body = self.request(prep, cpus)
        try:
            return helper.ask(body, streams)
        except HelperGone as exc:
            order = prep.order
            log.error("the spawn helper ended; starting another", job=order.job_id, slot=order.slot, error=str(exc))
            helper.close()
            spawner.helper = self.start_helper()
            if exc.sent or spawner.helper is None:  # (without one, the next orders start from the agent)
                raise
        return spawner.helper.ask(body, streams)

    def _over(self, sent: Mapping[str, str]) -> Mapping[str, str]:
        """The environment of a task whose ``sent`` variables go over the agent's (the helper path)."""
        return ChainMap(dict(sent), self._base_env)

    def _base_block(self, over: dict[str, str]) -> forkserver.EnvBlock:
        """The agent's inherited environment without the variables ``over`` sets, encoded for the helper:
        once per set of such variables (mostly none or the same few), not once per task."""
        base = self._base_env
        common = base.keys() & over.keys()  # (iterates the smaller: the few variables set per task)
        key = frozenset(common) if common else _NONE_SET
        block = self._base_blocks.get(key)
        if block is None:
            block = forkserver.env_block({k: v for k, v in base.items() if k not in over})
            if len(self._base_blocks) < _BLOCKS_KEPT:  # (spawners share it: a race computes one twice)
                self._base_blocks[key] = block
        return block

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
        hosts = order.nodefile_hosts
        if hosts is not None:  # (the cached file with no call: written once per host list, _nodefile)
            env["PSIJ_NODEFILE"] = self._nodefiles.get(tuple(hosts)) or self._nodefile(hosts)
        if order.gpus or self._node.gpus:
            env.update(environment.gpu_environment(order.gpus, node_has_gpus=bool(self._node.gpus)))
        return env

    def _streams(self, order: ProcessOrder, cwd: str, files: list[int]) -> tuple[int, int, int]:
        """The task's stdin, stdout and stderr, opened here (``files``: what to close after the spawn)."""
        stdin = _open(order.stdin_path, cwd, "rb", files, "stdin_path")
        mode = "wb" if order.truncate_output else "ab"
        stdout = _open(order.stdout_path, cwd, mode, files, "stdout_path")
        if order.stderr_path is not None and order.stderr_path == order.stdout_path:
            stderr = stdout
        else:
            stderr = _open(order.stderr_path, cwd, mode, files, "stderr_path")
        if order.stream:  # what has no file goes to the node's stream (agent.output_streams)
            out, err = self.streams.pipes(order, files)
            stdout = stdout if out is None else out
            stderr = stderr if err is None else err
        return stdin, stdout, stderr

    def _posix_spawn(
        self, spawner: _Spawner, argv: list[str], cwd: str, env: dict[str, str], streams: tuple[int, int, int]
    ) -> int:
        """What ``Popen`` does for a task, for less than half its CPU: ``posix_spawn`` (vfork and exec;
        ``os.posix_spawn`` holds the GIL until the child has exec'd, which measured better than
        releasing it: fewer GIL hand-offs) in the task's directory (this thread's own cwd), a process group
        of its own, SIGPIPE and SIGXFSZ back to default, only fds 0-2 inherited (every other fd is
        close-on-exec: _seal_fds), the executable found in the task's own PATH."""
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
            devnull = self.devnull
            actions = [
                (os.POSIX_SPAWN_DUP2, devnull if fd == subprocess.DEVNULL else fd, i) for i, fd in enumerate(streams)
            ]
        return os.posix_spawn(path, argv, env, file_actions=actions, setpgroup=0, setsigdef=_DEFAULT_SIGNALS)

    def _explain(self, exc: OSError, argv: list[str], cwd: str, env: Mapping[str, str]) -> str:
        node = self._node.name
        if not os.path.isdir(cwd):
            return f"directory {cwd!r} does not exist on node {node}"
        exe = argv[0]
        if exc.errno == errno.ENOENT:
            if "/" in exe:
                return f"executable {exe!r} not found on node {node} (relative to {cwd!r})"
            return f"executable {exe!r} not found in PATH on node {node} (PATH={env.get('PATH', os.defpath)})"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return f"executable {exe!r} cannot be run on node {node}: permission denied"
        return f"cannot start {exe!r} on node {node}: {exc.strerror or exc}"

    def _nodefile(self, hosts: list[str]) -> str:
        key = tuple(hosts)
        path = self._nodefiles.get(key)  # (written once per key, under the lock: a read needs none)
        if path is not None:
            return path
        with self._nodefiles_lock:  # spawner threads (one per pinned cpu) share the files
            path = self._nodefiles.get(key)
            if path is None:
                path = str(self._workdir / f"nodes-{len(self._nodefiles)}.txt")
                Path(path).write_text("".join(h + "\n" for h in hosts))
                self._nodefiles[key] = path
        return path


def names_streams(order: ProcessOrder) -> bool:
    """Whether the order's task gets other streams than /dev/null (files opened for it, or the node's
    stream): opened when it starts, by whoever starts it."""
    return not (
        order.stdin_path is None and order.stdout_path is None and order.stderr_path is None and not order.stream
    )


def _open(path: str | None, cwd: str, mode: str, files: list[int], what: str) -> int:
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


def _limits(rlimits: list[list[Any]]) -> Callable[[], None]:
    """SSS ResourceLimits, set in the child between fork and exec so they hold from the first
    instruction (only orders that carry limits pay for the preexec path; the others keep vfork)."""
    settings = _limit_settings(rlimits)

    def apply() -> None:
        for res, limits in settings:
            resource.setrlimit(res, limits)

    return apply


def _limit_settings(rlimits: list[list[Any]]) -> list[tuple[int, tuple[int, int]]]:
    """SSS ResourceLimits as ``setrlimit`` arguments; _OpenError for a hard limit only root may raise."""
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
    return settings


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


def _which(exe: str, env: Mapping[str, str]) -> str:
    """``exe`` in the task's PATH, as Popen looks it up (unchanged when not found: the spawn then fails
    with ENOENT, explained by ``_explain``)."""
    for d in os.get_exec_path(env):
        path = os.path.join(d, exe)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return exe
