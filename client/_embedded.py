"""Finding the pilot: an explicit url, the running daemon in the run directory, or an embedded one.

An embedded pilot is a daemon process this client starts in a private run directory and stops at
close or exit. It watches its parent and exits if the client dies without stopping it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from client.exceptions import SubmitException
from pilot.rundir import RunDir, root


class EmbeddedPilot:
    #: Embedded pilots this process started: each gets a run directory of its own, so that one started
    #: after another stopped never resumes its journal (kept when that one did not stop cleanly).
    started = 0

    def __init__(self, *, config: str | None) -> None:
        k = EmbeddedPilot.started
        EmbeddedPilot.started += 1
        name = f"embedded-{os.getpid()}" + (f"-{k}" if k else "")
        self.rundir = RunDir((root() / name).resolve())
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self.client_url = ""
        self.keep = False  # keep the run directory after a clean stop (its jobs' history and output)

    def start(self, *, timeout: float = 60.0) -> str:
        cmd = [
            sys.executable,
            "-m",
            "pilot",
            "up",
            "--foreground",
            "--embedded",
            "--rundir",
            str(self.rundir.path),
            "--parent-pid",
            str(os.getpid()),
        ]
        if self.config:
            cmd += ["--config", self.config]
        self.rundir.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = open(self.rundir.path / "embedded.log", "ab")
        try:
            self.process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.rundir.read_info()
            if info is not None and info.get("pid") == self.process.pid:
                self.client_url = str(info["client_url"])
                return self.client_url
            if self.process.poll() is not None:
                break
            time.sleep(0.01)
        tail = _tail(self.rundir.path / "embedded.log")
        self.stop()
        raise SubmitException(f"the embedded pilot did not start: {tail}", transient=False)

    def stop(self, *, timeout: float = 15.0) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.returncode == 0 and not self.keep:
            # A clean stop leaves nothing worth keeping unless asked; a failed one keeps its logs for the user.
            shutil.rmtree(self.rundir.path, ignore_errors=True)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_lock = threading.Lock()
_embedded: EmbeddedPilot | None = None
_users = 0


def resolve(url: str | None) -> tuple[str, bool, RunDir | None]:
    """The daemon's client address, whether it is this process's embedded pilot, and its run directory
    when known (where a client looks to tell a dead daemon from a slow one, and when it is back)."""
    global _embedded, _users
    if url:
        if url.startswith(("ipc://", "tcp://")):
            return url, False, None
        rundir = RunDir(Path(url).expanduser())
        info = rundir.read_info()
        if info is None:
            raise SubmitException(f"no pilot is running in {url}", transient=True)
        return str(info["client_url"]), False, rundir
    name = os.environ.get("PILOT_NAME", "default")
    rundir = RunDir.named(name)
    info = rundir.read_info()
    if info is not None:
        return str(info["client_url"]), False, rundir
    with _lock:
        if _embedded is None or _embedded.process is None or _embedded.process.poll() is not None:
            _embedded = EmbeddedPilot(config=os.environ.get("PILOT_CONFIG"))
            _embedded.start()
            if _users == 0:
                atexit.register(_stop_at_exit)
        _users += 1
        return _embedded.client_url, True, _embedded.rundir


def running() -> RunDir | None:
    """The run directory of this process's embedded pilot while it runs (benchmarks find its daemon
    there), else None."""
    with _lock:
        if _embedded is None or _embedded.process is None or _embedded.process.poll() is not None:
            return None
        return _embedded.rundir


def keep_rundir() -> RunDir | None:
    """Keep this process's embedded pilot's run directory when it stops, so that 'pilot logs', 'show'
    and 'history' find its jobs afterwards (``pilot run`` asks when some of its jobs failed); its run
    directory, or None when no embedded pilot runs."""
    with _lock:
        if _embedded is None or _embedded.process is None:
            return None
        _embedded.keep = True
        return _embedded.rundir


def release() -> None:
    """One user of the embedded pilot is done; the last one stops it."""
    global _users
    with _lock:
        _users -= 1
        if _users <= 0 and _embedded is not None:
            _users = 0
            _stop_embedded()


def _stop_embedded() -> None:
    from client._connection import Connection

    if _embedded is None or _embedded.process is None:
        return
    Connection.close_url(_embedded.client_url, shutdown=True)
    _embedded.stop()


def _stop_at_exit() -> None:
    with _lock:
        _stop_embedded()
