"""The spawn helper: tasks start from a process of a few hundred KiB, so their peak RSS is their own.

Linux carries the high-water RSS of the address space that calls ``exec`` into the new program's
``ru_maxrss``. A task the agent spawns itself (vfork or fork) so reports at least the agent's own size,
tens of MiB for ``/bin/true``. Each spawner thread therefore starts its tasks through a helper of its
own (``forkserver.c``): a small static C program that gets the request over a unix socket (argv, the
environment, the directory, the three streams as SCM_RIGHTS, the cpus, the limits) and starts the task
with ``clone(CLONE_VM | CLONE_VFORK | CLONE_PARENT)``. The task is the agent's child, not the
helper's: the agent waits for it by pid or pidfd with its rusage as before, and process group,
marks and kills do not change. A helper started by a pinned spawner inherits its cpu, and so do its
tasks.

Started with the argument ``chain``, the same program serves one core's chained spawner instead
(:mod:`agent.chaining`): there its tasks are its own children, which it reaps.

The helper is compiled with the system C compiler at the agent's start, once per source and machine,
into ``$XDG_CACHE_HOME/pilot-jobs`` (``~/.cache``; the agent's workdir when that is not writable). Where
no compiler works, or with ``PILOT_AGENT_FORKSERVER=0`` (to compare the two paths), the agent spawns
tasks itself as before and logs why: the tasks' ``max_rss`` then includes the agent's size.
"""

from __future__ import annotations

import array
import errno
import hashlib
import os
import platform
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import structlog

log = structlog.get_logger("agent.processes")

#: ``PILOT_AGENT_FORKSERVER=0`` makes the agent spawn tasks itself (posix_spawn from its own process).
ENV_FORKSERVER: Final = "PILOT_AGENT_FORKSERVER"

_SOURCE: Final = Path(__file__).with_name("forkserver.c")
_COMPILE_TIMEOUT: Final = 120.0  # seconds
_UINT64: Final = (1 << 64) - 1
_REPLY: Final = struct.Struct("3i")
_HEAD: Final = struct.Struct("4I")
_LIMIT: Final = struct.Struct("IIQQ")
_LEN: Final = struct.Struct("I")
_MAX_BODY: Final = 64 << 20  # forkserver.c's MAX_BODY
_EXIT_WAIT: Final = 2.0  # seconds a closed helper gets to exit
_ALL_NULL: Final = (subprocess.DEVNULL,) * 3  # the streams of a task that names none
_FS_ENCODING: Final = sys.getfilesystemencoding()
_FS_ERRORS: Final = sys.getfilesystemencodeerrors()

# The steps forkserver.c names in a failed reply (its STEP_ constants).
_STEP_REQUEST: Final = 1
_STEP_EXEC: Final = 7
STEP_RLIMIT: Final = 3
_STEP_NAMES: Final = {
    1: "request",
    2: "setting the cpu affinity",
    3: "setting the resource limits",
    4: "redirecting the streams",
    5: "changing directory",
    6: "creating its process group",
    7: "exec",
    8: "clone",
}

_build_lock = threading.Lock()


#: Environment variables encoded for a request once, for many (:func:`env_block`): (count, bytes).
EnvBlock = tuple[int, bytes]


def env_block(env: Mapping[str, str]) -> EnvBlock:
    """``env`` as a request carries it (each ``NAME=value`` NUL-terminated); ValueError as posix_spawn."""
    items = [f"{k}={v}" for k, v in env.items()]
    text = "\0".join(items)
    if text.count("\0") != max(len(items) - 1, 0):
        raise ValueError("embedded null byte")
    if "=" in "".join(env):
        raise ValueError("illegal environment variable name")
    return len(items), (os.fsencode(text) + b"\0" if items else b"")


class HelperGone(Exception):
    """The helper ended or broke its protocol: its spawner starts a new one. ``sent``: the request may
    have reached it (a task may have started); else it never did, and the order can go to the new one."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class SpawnError(OSError):
    """The task could not start; ``step`` says where (``STEP_RLIMIT``: a limit the kernel refused)."""

    def __init__(self, err: int, step: int) -> None:
        super().__init__(err, os.strerror(err))
        self.step = step

    def __str__(self) -> str:
        return f"{_STEP_NAMES.get(self.step, 'spawn')} failed: {self.strerror}"


def enabled() -> bool:
    """Whether tasks start through helpers (the default) rather than from the agent's process."""
    return os.environ.get(ENV_FORKSERVER, "").strip().lower() not in ("0", "no", "false", "off")


def build(*, workdir: Path) -> str | None:
    """The helper's executable, compiled now unless a cached one for this source and machine exists;
    None (logged) when it cannot be had: the agent then spawns tasks itself."""
    try:
        source = _SOURCE.read_bytes()
    except OSError as exc:
        log.warning("spawn helper source missing; tasks' max_rss includes the agent's", error=str(exc))
        return None
    key = hashlib.sha256(source + platform.machine().encode()).hexdigest()[:16]
    name = f"forkserver-{platform.machine()}-{key}"
    directories = [workdir]
    try:
        directories.insert(0, Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pilot-jobs")
    except RuntimeError:  # no home directory: the helper is built in the workdir, for this agent only
        pass
    with _build_lock:  # one compile for the spawners of this process
        for directory in directories:
            exe = directory / name
            if _trusted(exe):
                return str(exe)
        cc = os.environ.get("CC")
        compiler = shutil.which(cc) if cc else shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            log.warning(
                "no C compiler for the spawn helper; tasks' max_rss includes the agent's size: install cc",
                CC=cc,
            )
            return None
        errors: list[str] = []
        for directory in directories:
            try:
                directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                errors.append(f"{directory}: {exc}")
                continue
            error = _compile(compiler, directory / name)
            if error is None:
                return str(directory / name)
            errors.append(error)
    log.warning("cannot build the spawn helper; tasks' max_rss includes the agent's size", errors=errors)
    return None


def _trusted(exe: Path) -> bool:
    """A cached helper this user built and nobody else can change."""
    try:
        st = exe.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022 and os.access(exe, os.X_OK)


def _compile(compiler: str, target: Path) -> str | None:
    """Compile the helper to ``target`` (static when the C library allows, so it maps no shared
    library: a smaller start for every task); None, or what went wrong."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".forkserver-", dir=target.parent)
    except OSError as exc:
        return f"{target.parent}: {exc}"
    os.close(fd)
    error = ""
    try:
        for static in (["-static"], []):
            try:
                done = subprocess.run(
                    [compiler, "-O2", *static, "-o", tmp, str(_SOURCE)],
                    capture_output=True,
                    text=True,
                    timeout=_COMPILE_TIMEOUT,
                    stdin=subprocess.DEVNULL,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"{compiler}: {exc}"
            if done.returncode == 0:
                try:
                    os.chmod(tmp, 0o700)
                    os.replace(tmp, target)  # atomic: agents sharing the cache see all of it or none
                except OSError as exc:
                    return f"{target}: {exc}"
                return None
            error = done.stderr.strip()[-2000:]
        return f"{compiler} failed: {error}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class ForkServer:
    """One running helper, used by one spawner thread only (no lock)."""

    def __init__(self, exe: str, *, devnull: int) -> None:
        """Start the helper (from the calling thread: it inherits that thread's cpu affinity)."""
        self._devnull = devnull
        self.pid, self._sock, self._pidfd = start(exe, [exe], devnull=devnull)
        try:  # an empty request: the helper answers "bad request" once it runs
            if self._ask(b"", (devnull, devnull, devnull)) != (0, 22, _STEP_REQUEST):
                raise HelperGone("the spawn helper answered a test request wrongly")
        except HelperGone:
            self.close()
            raise

    def ask(self, body: bytes, streams: tuple[int, int, int]) -> int:
        """Start the task of a request (:func:`request`) with ``streams`` as its stdin, stdout and stderr;
        its pid. :class:`SpawnError` when it could not (a child that started and failed before exec is
        reaped here); :class:`HelperGone` when the helper is."""
        pid, err, step = self._ask(body, stream_fds(streams, devnull=self._devnull))
        if err:
            if pid > 0:
                try:
                    os.waitpid(pid, 0)  # the agent's child: it exited before exec
                except ChildProcessError:
                    pass  # reaped by the reaper's wait4(-1) (without pidfds): it drops an unknown pid
            raise SpawnError(err, step)
        if pid <= 0:
            raise HelperGone(f"the spawn helper answered pid {pid}")
        return pid

    def _ask(self, body: bytes, fds: tuple[int, ...] | None) -> tuple[int, int, int]:
        """``fds``: the task's stdin, stdout and stderr; None: /dev/null for all three, which the request
        then carries no fd for (the helper's own 0-2 are the agent's /dev/null: no fd to pass and close)."""
        rights = [] if fds is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        try:
            self._sock.sendmsg([_LEN.pack(len(body)), body], rights)
        except OSError as exc:  # (a stream socket takes all of it or, the helper gone, none: EPIPE)
            raise HelperGone(f"the spawn helper is gone: {exc}", sent=False) from None
        try:
            reply = self._sock.recv(_REPLY.size, socket.MSG_WAITALL)
        except OSError as exc:
            raise HelperGone(f"the spawn helper is gone: {exc}") from None
        if len(reply) != _REPLY.size:
            raise HelperGone("the spawn helper is gone")
        out: tuple[int, int, int] = _REPLY.unpack(reply)
        return out

    def close(self) -> None:
        """End the helper (it exits at the end of its socket) and reap it."""
        self._sock.close()
        fd, self._pidfd = self._pidfd, None
        stop(self.pid, fd)


def stream_fds(streams: tuple[int, int, int], *, devnull: int) -> tuple[int, int, int] | None:
    """The fds a request carries for a task's stdin, stdout and stderr (``subprocess.DEVNULL``: the
    agent's /dev/null); None when all three are /dev/null: the helper's own 0-2 are that."""
    if streams == _ALL_NULL:
        return None
    a, b, c = (devnull if fd == subprocess.DEVNULL else fd for fd in streams)
    return a, b, c


def start(exe: str, argv: list[str], *, devnull: int) -> tuple[int, socket.socket, int | None]:
    """Start a helper with ``argv`` (its 0-2 /dev/null, fd 3 its socket): its pid, the agent's end of the
    socket, and a pidfd to reap it by (None without pidfds)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.posix_spawn(
            exe,
            argv,
            {},
            file_actions=[
                *((os.POSIX_SPAWN_DUP2, devnull, i) for i in range(3)),
                (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3),
            ],
        )
    except OSError:
        ours.close()
        raise
    finally:
        theirs.close()
    try:  # to reap it by pidfd: after its exit its pid may be a task's, which a waitpid would take
        pidfd: int | None = os.pidfd_open(pid)
    except (OSError, AttributeError):
        pidfd = None  # without pidfds the reaper's wait4(-1) reaps it (and drops an unknown pid)
    return pid, ours, pidfd


def stop(pid: int, pidfd: int | None) -> None:
    """Reap a helper whose socket was closed (it exits at the end of it), by its pidfd."""
    if pidfd is None:
        return
    try:
        if select.select([pidfd], [], [], _EXIT_WAIT)[0]:
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
        else:
            log.warning("the spawn helper did not exit", pid=pid)
    except ChildProcessError:
        pass  # reaped already, by the tree thread (which reaps the agent's children that are no task)
    except OSError as exc:  # P_PIDFD is Linux 5.4: on 5.3 it stays a zombie until the agent ends
        log.debug("cannot reap the spawn helper", error=str(exc))
    finally:
        os.close(pidfd)


def request(
    path: str,
    argv: list[str],
    env: Mapping[str, str],
    *,
    cwd: str,
    cpus: Iterable[int] | None,
    limits: list[tuple[int, tuple[int, int]]],
    base: EnvBlock | None = None,
) -> bytes:
    """A request's body (see forkserver.c). ValueError as posix_spawn for a NUL in a string or an ``=``
    in a variable's name; :class:`SpawnError` (E2BIG) for one the helper would refuse."""
    mask = b""
    if cpus is not None:
        bits = 0
        for c in cpus:
            bits |= 1 << c
        mask = bits.to_bytes((bits.bit_length() + 63) // 64 * 8, "little")
    envc = len(env) + (base[0] if base is not None else 0)
    parts = [_HEAD.pack(len(argv), envc, len(mask), len(limits)), mask]
    if limits:
        parts += [_LIMIT.pack(res, 0, soft & _UINT64, hard & _UINT64) for res, (soft, hard) in limits]
    # One join and one encoding for all the strings (per string: several times the cost), then the
    # checks posix_spawn makes, on the whole.
    strings = [path, cwd, *argv, *map("=".join, env.items())]  # (NAME=value with no Python call per item)
    text = "\0".join(strings)
    if text.count("\0") != len(strings) - 1:
        raise ValueError("embedded null byte")
    if "=" in "".join(env):
        raise ValueError("illegal environment variable name")
    parts.append(text.encode(_FS_ENCODING, _FS_ERRORS) + b"\0")  # (os.fsencode, without its Python frame)
    if base is not None:
        parts.append(base[1])
    body = b"".join(parts)
    if len(body) > _MAX_BODY:  # (the helper would end at such a request; exec would refuse it anyway)
        raise SpawnError(errno.E2BIG, _STEP_EXEC)
    return body
