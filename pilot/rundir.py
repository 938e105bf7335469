"""The run directory: where a daemon keeps its addresses, pid, lock and logs, and how others find it.

Default root is ``$PILOT_HOME``, else ``~/.local/state/pilot``; each pilot has ``<root>/<name>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from pilot.security import KeyStore, check_private_dir, make_private_dir

INFO_FILE = "pilot.json"
_SUN_PATH_MAX = 100  # sockaddr_un.sun_path is 108 bytes with the terminator; keep a margin


def root() -> Path:
    home = os.environ.get("PILOT_HOME")
    return Path(home) if home else Path.home() / ".local" / "state" / "pilot"


@dataclass(frozen=True, slots=True)
class RunDir:
    path: Path

    @classmethod
    def named(cls, name: str = "default", *, base: Path | None = None) -> RunDir:
        return cls((base or root()) / name)

    @property
    def info_file(self) -> Path:
        return self.path / INFO_FILE

    @property
    def log_file(self) -> Path:
        return self.path / "daemon.log"

    @property
    def lock_file(self) -> Path:
        return self.path / "pilot.lock"

    @property
    def history_file(self) -> Path:
        """Every job of the pilot's earlier lives, kept when each stopped cleanly (:mod:`pilot.history`)."""
        return self.path / "history.db"

    @property
    def agents_dir(self) -> Path:
        return self.path / "agents"

    @property
    def keys_dir(self) -> Path:
        return self.path / "keys"

    @property
    def abandoned_file(self) -> Path:
        """Submit ids local clients gave up waiting for (one a line): every daemon of this run directory
        refuses them and cancels the jobs they made (:class:`AbandonedSubmits`)."""
        return self.path / "abandoned"

    def abandon(self, submit_ids: list[str]) -> None:
        """Add ``submit_ids`` to :attr:`abandoned_file`, durably, before the client tells anyone the jobs
        will not run. One ``O_APPEND`` write: lines of clients writing at once never interleave. Raises
        OSError."""
        data = "".join(s + "\n" for s in submit_ids).encode()
        fd = os.open(self.abandoned_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def socket_dir(self) -> Path:
        """Where ipc sockets go: the run dir, or a private short path when the run dir's is too long."""
        if len(str(self.path / "client.sock")) < _SUN_PATH_MAX:
            return self.path
        digest = hashlib.sha1(str(self.path.resolve()).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"pilot-{os.getuid()}-{digest}"

    def create(self) -> None:
        """Create the directories private, or check that existing ones are: a run directory others can
        enter exposes the ipc sockets and keys, so it raises :class:`pilot.security.SecurityError`
        (naming the path and the ``chmod`` that fixes it) instead of being silently repaired."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        make_private_dir(self.path)
        make_private_dir(self.agents_dir, what="agents directory")
        sd = self.socket_dir()
        if sd != self.path:
            make_private_dir(sd, what="socket directory")

    def check(self) -> None:
        """Refuse a run directory (or socket directory) that others can enter or that is not ours;
        for clients, before they trust the sockets and info they find there."""
        check_private_dir(self.path)
        sd = self.socket_dir()
        if sd != self.path:
            check_private_dir(sd, what="socket directory")

    def keys(self) -> KeyStore:
        """The pilot's CURVE keys, generated on first use; call with the run directory's lock held."""
        return KeyStore.open(self.keys_dir)

    def write_info(self, info: dict[str, Any]) -> None:
        tmp = self.info_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f, indent=2)
        os.replace(tmp, self.info_file)

    def read_info(self) -> dict[str, Any] | None:
        """The running daemon's info, or None when there is none (stale files are ignored)."""
        try:
            info = json.loads(self.info_file.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
            return None
        if not pid_alive(info["pid"]):
            return None
        return info

    def last_info(self) -> dict[str, Any] | None:
        """``pilot.json`` as left, whether or not its daemon still lives: a daemon resuming after a crash
        listens again where its predecessor did, so remote clients find it at the same endpoint."""
        try:
            info = json.loads(self.info_file.read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def remove_info(self) -> None:
        for p in (self.info_file, self.socket_dir() / "client.sock", self.socket_dir() / "agent.sock"):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        sd = self.socket_dir()
        if sd != self.path:
            try:
                sd.rmdir()
            except OSError:
                pass


class AbandonedSubmits:
    """A daemon's reading of :attr:`RunDir.abandoned_file`: the whole file first (what clients gave up on
    while no daemon, or an earlier one, ran), then the lines added since. A ``stat`` when nothing changed;
    while there is no file (as in most runs), an ``access``, which says so without an exception."""

    __slots__ = ("_file", "_inode", "_offset", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = os.fspath(path)  # (a Path is converted at every call: it is read before each submit)
        self._inode = 0  # 0: no file at the last look
        self._offset = 0

    def read(self) -> list[str]:
        """The complete lines added since the last call (all of them, the first time). Raises OSError."""
        if not self._inode and not os.access(self._file, os.F_OK):
            return []
        try:
            st = os.stat(self._file)
        except FileNotFoundError:
            self._inode = 0
            return []
        if st.st_ino != self._inode:  # a new file (removed by a daemon that stopped cleanly, then made again)
            self._inode, self._offset = st.st_ino, 0
        if st.st_size <= self._offset:
            return []
        with open(self._file, "rb") as f:
            f.seek(self._offset)
            data = f.read(st.st_size - self._offset)
        end = data.rfind(b"\n") + 1  # a line being written is read whole next time
        self._offset += end
        return [line for line in data[:end].decode("utf-8", "replace").split("\n") if 0 < len(line) <= 128]


def pid_alive(pid: int) -> bool:
    """A process with this pid runs; an exited one its parent (often init, for a detached daemon) has not
    reaped yet, a zombie, does not."""
    if pid <= 0:
        return False
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
