"""Spawning and reaping, off the event loop.

One spawner thread turns orders into processes (``Popen`` without a shell, vfork path, new session so
the whole tree can be signalled, pinned by setting the spawning thread's own affinity, which the child
inherits). One reaper thread blocks in ``wait4(-1)``, which gives each exit's rusage for Delivered. Both
hand events to the loop through a list and a self-pipe, so a burst of exits costs one wake-up.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
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


@dataclass(slots=True)
class Running:
    order: ProcessOrder
    popen: subprocess.Popen[bytes]
    started: float  # wall clock
    started_mono: float
    env_file: str | None = None
    env: dict[str, str] | None = None  # a pre process's environment before its script ran
    reason: str | None = None  # why the agent signalled it (walltime, canceled, ...)
    peak_tree_rss: int = 0


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
        self._orders: SimpleQueue[ProcessOrder | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._by_pid: dict[int, Running] = {}
        self._by_key: dict[Key, Running] = {}
        self._early: dict[int, tuple[int, Any, float]] = {}
        self._cancelled: dict[Key, str] = {}
        self._core_users: Counter[int] = Counter()
        self._waiting: list[ProcessOrder] = []
        self._events: list[Event] = []
        self._stopping = False
        self._pending_orders = 0
        #: Orders accepted and not yet started or failed: a key leaves this set only in the same locked
        #: step that records its first event, so :meth:`snapshot` never misses a process.
        self._pending_keys: Counter[Key] = Counter()
        self._nodefiles: dict[tuple[str, ...], str] = {}
        self._all_cpus = sorted(os.sched_getaffinity(0))
        self._base_env = environment.inherited()
        self._threads = [
            threading.Thread(target=self._spawn_loop, name="pilot-spawner", daemon=True),
            threading.Thread(target=self._reap_loop, name="pilot-reaper", daemon=True),
        ]

    # -- called from the event loop ------------------------------------------------------------

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def submit(self, orders: list[ProcessOrder]) -> None:
        """Queue orders for the spawner. One marked ``after_cores`` waits here until no process this
        agent runs (or was told to run) uses its cores: the daemon placed it behind them."""
        with self._lock:
            for order in orders:
                if order.after_cores and any(self._core_users[c] for c in order.cores):
                    self._waiting.append(order)
                else:
                    self._accept(order)

    def _accept(self, order: ProcessOrder) -> None:
        # Called with the lock held.
        for c in order.cores:
            self._core_users[c] += 1
        self._pending_orders += 1
        self._pending_keys[(order.job_id, order.slot)] += 1
        self._orders.put(order)

    def _release(self, order: ProcessOrder) -> None:
        """The order's process is gone (or never started): free its cores, start who waited on them."""
        with self._lock:
            for c in order.cores:
                self._core_users[c] -= 1
            if self._waiting:
                still = []
                for w in self._waiting:
                    if any(self._core_users[c] for c in w.cores):
                        still.append(w)
                    else:
                        self._accept(w)
                self._waiting = still

    def drain(self) -> list[Event]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def kill(self, key: Key, *, reason: str, sig: int = signal.SIGTERM) -> bool:
        """Signal the process group of ``key``; an order not started yet is dropped. False if unknown."""
        with self._lock:
            run = self._by_key.get(key)
            if run is None:
                waiting = next((w for w in self._waiting if (w.job_id, w.slot) == key), None)
                if waiting is not None:
                    self._waiting.remove(waiting)
                    self._events.append(
                        Event(key[0], key[1], "exited", time.time(), {"reason": reason, "spawned": False})
                    )
                elif self._pending_orders:
                    self._cancelled[key] = reason
                else:
                    return False
                notify = waiting is not None
            else:
                notify = False
                if run.reason is None:
                    run.reason = reason
                pid = run.popen.pid
        if run is None:
            if notify:
                self._notify()
            return True
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
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
                proc = psutil.Process(run.popen.pid)
                rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            run.peak_tree_rss = max(run.peak_tree_rss, rss)

    def stop(self) -> None:
        """Stop spawning; the caller has killed what runs. Threads end once the last child is reaped."""
        with self._lock:
            self._stopping = True
            self._cv.notify_all()
        self._orders.put(None)
        for t in self._threads:
            t.join(timeout=10)

    # -- spawner thread -------------------------------------------------------------------------

    def _spawn_loop(self) -> None:
        while True:
            order = self._orders.get()
            if order is None:
                return
            spawned = False
            try:
                spawned = self._spawn(order)
            except Exception as exc:  # never let one order kill the spawner
                log.exception("spawn crashed", job=order.job_id, slot=order.slot)
                self._emit(Event(order.job_id, order.slot, "failed", time.time(), {"message": f"agent error: {exc}"}))
            finally:
                with self._lock:
                    self._pending_orders -= 1
                    key = (order.job_id, order.slot)
                    self._pending_keys[key] -= 1
                    if self._pending_keys[key] <= 0:
                        del self._pending_keys[key]
                if not spawned:
                    self._release(order)

    def _spawn(self, order: ProcessOrder) -> bool:
        """Start one order; True when a process now runs for it."""
        key = (order.job_id, order.slot)
        with self._lock:
            cancelled = self._cancelled.pop(key, None)
        if cancelled is not None:
            self._emit(Event(order.job_id, order.slot, "exited", time.time(), {"reason": cancelled, "spawned": False}))
            return False
        cwd = os.path.expanduser(order.directory) if order.directory else os.getcwd()
        extra = dict(order.rank_environment)
        if order.nodefile_hosts is not None:
            extra["PSIJ_NODEFILE"] = self._nodefile(order.nodefile_hosts)
        extra.update(environment.gpu_environment(order.gpus, node_has_gpus=bool(self._node.gpus)))
        env = environment.build(
            inherit=order.inherit_environment,
            base=self._base_env,
            job=order.environment,
            pre=order.pre_environment,
            pre_unset=order.pre_unset,
            extra=extra,
        )
        env_file = None
        script = os.path.join(cwd, os.path.expanduser(order.script)) if order.script else ""
        if order.role == "rank":
            argv = [environment.substitute(order.executable, env)]
            argv += [environment.substitute(a, env) for a in order.arguments]
        elif order.role == "pre":
            env_file = str(self._workdir / f"pre-{order.job_id}.env")
            argv = ["/bin/sh", "-c", _PRE_SCRIPT, "pilot-pre", script, env_file]
        else:
            argv = ["/bin/sh", "-c", _POST_SCRIPT, "pilot-post", script]
        files: list[int] = []
        try:
            stdin = self._open(order.stdin_path, cwd, "rb", files, "stdin_path")
            mode = "wb" if order.truncate_output else "ab"
            stdout = self._open(order.stdout_path, cwd, mode, files, "stdout_path")
            if order.stderr_path is not None and order.stderr_path == order.stdout_path:
                stderr = stdout
            else:
                stderr = self._open(order.stderr_path, cwd, mode, files, "stderr_path")
            pinned = bool(order.cores)
            if pinned:
                os.sched_setaffinity(0, {self._cpu_map.get(c, c) for c in order.cores})
            try:
                t0, m0 = time.time(), time.monotonic()
                popen = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=stdin,
                    stdout=stdout,
                    stderr=stderr,
                    close_fds=True,
                    start_new_session=True,
                )
            finally:
                if pinned:
                    os.sched_setaffinity(0, self._all_cpus)
        except _OpenError as exc:
            self._emit(Event(order.job_id, order.slot, "failed", time.time(), {"message": str(exc)}))
            return False
        except OSError as exc:
            self._emit(
                Event(order.job_id, order.slot, "failed", time.time(), {"message": self._explain(exc, argv, cwd, env)})
            )
            return False
        finally:
            for fd in set(files):
                os.close(fd)
        run = Running(order, popen, t0, m0, env_file, env if env_file is not None else None)
        with self._lock:
            self._by_pid[popen.pid] = run
            self._by_key[key] = run
            early = self._early.pop(popen.pid, None)
            self._cv.notify()
        self._emit(Event(order.job_id, order.slot, "started", t0, {"pid": popen.pid}))
        if early is not None:
            self._finish(popen.pid, *early)
        return True

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
        path = self._nodefiles.get(key)
        if path is None:
            path = str(self._workdir / f"nodes-{len(self._nodefiles)}.txt")
            Path(path).write_text("".join(h + "\n" for h in hosts))
            self._nodefiles[key] = path
        return path

    # -- reaper thread --------------------------------------------------------------------------

    def _reap_loop(self) -> None:
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

    def _finish(self, pid: int, status: int, rusage: Any, mono: float) -> None:
        with self._lock:
            run = self._by_pid.pop(pid, None)
            if run is None:
                self._early[pid] = (status, rusage, mono)
                return
            key = (run.order.job_id, run.order.slot)
        code = os.waitstatus_to_exitcode(status)
        run.popen.returncode = code
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
            self._events.append(event)
        self._notify()
        self._release(run.order)

    def _emit(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
        self._notify()


_MODES: Final = {
    "rb": os.O_RDONLY,
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
}


class _OpenError(Exception):
    pass


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
