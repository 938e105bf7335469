"""The node's output stream: streamed tasks write to pipes, one thread here reads them all and appends
framed records to one file per node (:mod:`pilot.model.output_stream`), instead of two files per task.

One thread, one selector, whatever the number of tasks. A task that writes faster than the disk takes
waits on its own pipe; the agent's loop never touches the pipes, and readers of the file are not known
here, so a slow reader slows nobody.
"""

from __future__ import annotations

import os
import selectors
import threading
import time
from pathlib import Path
from typing import Final

import structlog

from pilot.model.output_stream import SUFFIX, pack
from pilot.model.process_order import ProcessOrder
from pilot.thread_names import name_os_thread

log = structlog.get_logger("agent.streams")

_READ: Final = 1 << 16
#: Seconds the collector keeps reading at the agent's stop, for what its last tasks wrote.
_STOP_GRACE: Final = 5.0


class StreamCollector:
    def __init__(self, *, node: str, workdir: Path) -> None:
        self.path = workdir / "streams" / f"{node}{SUFFIX}"
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._new: list[tuple[int, str, int, str]] = []  # (read fd, job id, slot, stream) to register
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._out: int | None = None
        self._stopping = False
        self._lost = 0
        self._thread = threading.Thread(target=self._run, name="pilot-streams", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def pipes(self, order: ProcessOrder, files: list[int]) -> tuple[int | None, int | None]:
        """Write ends for the order's streamed stdout and stderr (None where it names a file), added to
        ``files`` (closed after the spawn); their read ends are this thread's from now on."""
        ends: list[int | None] = []
        for path, stream in ((order.stdout_path, "out"), (order.stderr_path, "err")):
            if path is not None:
                ends.append(None)
                continue
            r, w = os.pipe2(os.O_CLOEXEC)
            files.append(w)
            with self._lock:
                self._new.append((r, order.job_id, order.slot, stream))
            ends.append(w)
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:  # full of wake-ups the thread has yet to read: it will see these too
            pass
        return ends[0], ends[1]

    def stop(self) -> None:
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(timeout=_STOP_GRACE + 5)

    def _run(self) -> None:
        name_os_thread()
        deadline: float | None = None
        try:
            while True:
                if self._stopping and deadline is None:
                    deadline = time.monotonic() + _STOP_GRACE
                if deadline is not None and (len(self._sel.get_map()) == 1 or time.monotonic() > deadline):
                    return
                for key, _ in self._sel.select(timeout=0.5 if deadline is not None else None):
                    if key.data is None:
                        self._take_new()
                    else:
                        self._read(key.fd, key.data)
        except Exception:
            log.exception("output stream collector failed", path=str(self.path))
        finally:
            for key in list(self._sel.get_map().values()):
                os.close(key.fd)
            self._sel.close()
            os.close(self._wake_w)
            if self._out is not None:
                os.close(self._out)

    def _take_new(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            new, self._new = self._new, []
        for fd, job_id, slot, stream in new:
            self._sel.register(fd, selectors.EVENT_READ, (job_id, slot, stream))

    def _read(self, fd: int, ref: tuple[str, int, str]) -> None:
        data = os.read(fd, _READ)
        if not data:
            self._sel.unregister(fd)
            os.close(fd)
            return
        if self._out is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._out = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        view = memoryview(pack(ref[0], ref[1], ref[2], data))
        try:
            while view:  # one writer: a short write goes on where it stopped
                view = view[os.write(self._out, view) :]
        except OSError as exc:  # a full disk: the output is lost, the tasks are not stalled
            if not self._lost:
                log.error("output stream write failed; output is dropped", path=str(self.path), error=str(exc))
            self._lost += 1
