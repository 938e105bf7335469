"""Waiting for the engine's children, and taking each exit with ``wait4`` for its rusage (Delivered).

- With pidfds (Linux 5.3 and later), the reaper thread waits for the children no pinned spawner waits
  for itself (several cpus, several cores on one cpu, rlimits) by their pidfds in one epoll; no thread
  ever calls ``wait4(-1)``, which would take a pinned spawner's child. A pinned spawner reaps its own
  child through :meth:`Reaper.reap` on its own thread; a chained one's tasks are its helper's
  children, reaped by the helper (:mod:`agent.chaining`).
- Without, the reaper thread blocks in ``wait4(-1)``; a sentinel child that lives as long as the engine
  keeps it there while no task runs (see _start_sentinel). It also takes the exits of the processes the
  agent adopted as child subreaper (a task's descendants whose parent died), which ``_finish`` drops; with
  pidfds, the tree thread reaps those (:mod:`agent.trees`).

The reaper thread alone owns the epoll, the read end of its wake pipe and the sentinel's pid. Which
children it waits for (``_reaped_by_fd``, ``_polled``) is guarded by the engine's lock, not one of its
own: a spawner adds a child in the same locked step that puts it in the engine's table, so the reaper
never sees "nothing left to wait for" while a task is being registered. Every exit goes to the engine's
``_finish``, which owns what follows (the table, the cores, the event).
"""

from __future__ import annotations

import os
import select
import threading
import time
from typing import TYPE_CHECKING, Final

import structlog

from pilot.thread_names import name_os_thread

if TYPE_CHECKING:
    from agent.processes import ProcessEngine

log = structlog.get_logger("agent.processes")

#: ``PILOT_AGENT_PIDFDS=0`` makes an agent reap as it does where pidfds are missing (to compare, or to
#: work around a kernel whose pidfds misbehave).
ENV_PIDFDS: Final = "PILOT_AGENT_PIDFDS"

_POLL_INTERVAL: Final = 0.05  # seconds between the reaper's looks when stopping, or at a child without pidfd


class Reaper:
    def __init__(self, *, engine: ProcessEngine) -> None:
        self._engine = engine
        #: Children are waited for one by one (a pidfd each, or by the pinned spawner that started them),
        #: never with ``wait4(-1)``: see _loop. False where pidfds are missing (Linux < 5.3).
        self.pidfds = _pidfds_work()
        self._epoll = select.epoll() if self.pidfds else None
        self._reaped_by_fd: dict[int, int] = {}  # pidfd -> pid of the children the reaper waits for
        self._polled: set[int] = set()  # children without a pidfd (none could be opened): looked at often
        self._wake_pipe = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK) if self.pidfds else None
        if self._epoll is not None and self._wake_pipe is not None:
            self._epoll.register(self._wake_pipe[0], select.EPOLLIN)
        self._sentinel: int | None = None  # the pid of the sentinel child (see _start_sentinel)
        self._sentinel_fd: int | None = None  # the write end of its stdin, which only stop() closes
        self.thread = threading.Thread(target=self._loop, name="pilot-reaper", daemon=True)

    def start(self, *, devnull: int) -> None:
        if not self.pidfds:
            self._sentinel = self._start_sentinel(devnull)
        self.thread.start()

    def _start_sentinel(self, devnull: int) -> int | None:
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
                file_actions=[(os.POSIX_SPAWN_DUP2, read, 0), *((os.POSIX_SPAWN_DUP2, devnull, i) for i in (1, 2))],
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

    def take_sentinel_fd(self) -> int | None:
        """The sentinel's pipe, for :meth:`stop` to close (the engine's lock held)."""
        fd, self._sentinel_fd = self._sentinel_fd, None
        return fd

    def stop(self, sentinel_fd: int | None) -> None:
        """Let the thread end once the last child is reaped (the engine is stopping)."""
        if sentinel_fd is not None:
            os.close(sentinel_fd)  # the sentinel reads EOF and exits: the reaper's wait4 returns it
        self._wake()

    def watch(self, pid: int) -> None:
        """Have the reaper wait for ``pid`` (the engine's lock held): by a pidfd, or, where none can be
        opened (out of file descriptors), by a look every ``_POLL_INTERVAL``."""
        assert self._epoll is not None
        try:
            fd = os.pidfd_open(pid)
        except OSError as exc:
            if not self._polled:
                log.warning("no pidfd for a task; looking for its exit every 50 ms", error=str(exc))
            self._polled.add(pid)
            self._wake()
            return
        self._reaped_by_fd[fd] = pid
        self._epoll.register(fd, select.EPOLLIN)

    def _wake(self) -> None:
        if self._wake_pipe is not None:
            try:
                os.write(self._wake_pipe[1], b"\0")
            except BlockingIOError:
                pass  # woken already

    def reap(self, pid: int) -> None:
        """Wait for one child that has exited or will (nobody else waits for it) and report it."""
        try:
            _, status, rusage = os.wait4(pid, 0)
        except ChildProcessError:  # not ours to wait for any more: cannot happen, never block on it
            log.error("a task's exit was taken by someone else", pid=pid)
            return
        self._engine._finish(pid, status, rusage, time.monotonic())

    # -- the reaper thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        name_os_thread()
        if self._epoll is not None:
            self._reap_by_pidfd(self._epoll)
            return
        engine = self._engine
        sentinel = self._sentinel
        while sentinel is not None:  # wait4 blocks even with no task: nothing needs to wake this thread
            try:
                pid, status, rusage = os.wait4(-1, 0)
            except ChildProcessError:  # someone else reaped the sentinel (no code of the agent's does)
                break
            if pid == sentinel:
                sentinel = None  # stopping (or it was killed): wait as below, until the last task exits
            else:
                engine._finish(pid, status, rusage, time.monotonic())
        cv = engine._cv
        while True:
            with cv:
                while not engine._by_pid and not engine._stopping:
                    cv.wait()
                if not engine._by_pid and engine._stopping and not engine._pending_orders:
                    return
            try:
                pid, status, rusage = os.wait4(-1, 0)
            except ChildProcessError:
                with cv:
                    if engine._stopping and not engine._by_pid:
                        return
                    cv.wait(timeout=0.05)
                continue
            engine._finish(pid, status, rusage, time.monotonic())

    def _reap_by_pidfd(self, ep: select.epoll) -> None:
        """Wait for the children no pinned spawner waits for itself, each by its pidfd; never
        ``wait4(-1)``, which would take a pinned spawner's child from under it. Ends once stopping with
        no child left to wait for and no order being started."""
        assert self._wake_pipe is not None
        engine = self._engine
        lock = engine._lock
        wake = self._wake_pipe[0]
        while True:
            with lock:
                if engine._stopping and not self._reaped_by_fd and not self._polled and not engine._pending_orders:
                    break
                look = engine._stopping or bool(self._polled)
            for fd, _ in ep.poll(_POLL_INTERVAL if look else -1):
                if fd == wake:
                    try:
                        os.read(wake, 4096)
                    except BlockingIOError:
                        pass
                    continue
                with lock:
                    pid = self._reaped_by_fd.pop(fd, None)
                if pid is not None:  # (every fd but the wake pipe's is a child's pidfd)
                    ep.unregister(fd)
                    os.close(fd)
                    self.reap(pid)  # readable: it has exited
            if self._polled:
                for pid in list(self._polled):
                    try:
                        done, status, rusage = os.wait4(pid, os.WNOHANG)
                    except ChildProcessError:  # cannot happen: nobody else waits for it
                        log.error("a task's exit was taken by someone else", pid=pid)
                        done, rusage = pid, None
                    if done:
                        with lock:
                            self._polled.discard(pid)
                        if rusage is not None:
                            engine._finish(pid, status, rusage, time.monotonic())
        ep.close()
        for fd in self._wake_pipe:
            os.close(fd)


def _pidfds_work() -> bool:
    """Whether this system gives pidfds (Linux 5.3 or later): then children are waited for one by one."""
    if not hasattr(os, "pidfd_open") or os.environ.get(ENV_PIDFDS, "").strip() in ("0", "no", "false", "off"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True
