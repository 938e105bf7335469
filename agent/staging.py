"""The agent's stager: the staging orders (stage-in, stage-out, cleanup) of the jobs this node runs,
carried out here, on the job's node, before its processes start and after they end.

Transfers block (a copy, an HTTP fetch), so they run in a small pool of worker threads, never in the
agent's loop; the loop only hands orders over and collects their events (one ``exited`` with exit code 0
when every step is done, or one ``failed`` naming the file and the cause), woken through the same
``notify`` as the process engine. A killed order stops at once, its transfer under way broken off
(:class:`agent.transfers.Stop`), and is reported not done. Steps go in the order given; relative paths
are under the order's directory (the job's). The agents of a job's nodes may stage into one directory
at once (a shared filesystem): every step is safe to run twice concurrently (files land whole by a
rename, a path already removed is no error).
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import structlog

from agent.stage_cache import StageCache
from agent.transfers import TRANSFERS, Interrupted, Stop, TransferError
from agent.transfers.file import link, local_path, place
from pilot.model.process_order import ProcessOrder
from pilot.model.staging import REMOVE, Step, url_parts
from pilot.wire.messages import ProcessRef, TaskEvent

log = structlog.get_logger("agent.staging")

#: Staging orders carried out at once; the others wait their turn (a node's disk and network are shared).
WORKERS: Final = 4


class Stager:
    def __init__(self, *, node: str, workdir: Path, notify: Callable[[], None], workers: int = WORKERS) -> None:
        self._node = node
        self._cwd = os.getcwd()  # the agent's: a job's relative directory is under it, as for its processes
        self._notify = notify
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stager")
        self._lock = threading.Lock()
        self._orders: dict[ProcessRef, tuple[Future[None], Stop]] = {}  # ref -> (its run, its stop)
        self._events: list[TaskEvent] = []
        self.cache = StageCache(workdir / "stage-cache" / node)

    # -- called from the agent's loop -------------------------------------------------------------

    def submit(self, order: ProcessOrder) -> None:
        ref = (order.job_id, order.slot)
        stop = Stop()
        with self._lock:
            if ref in self._orders:
                return  # (a daemon that resent it: the one under way reports)
            self._orders[ref] = (self._pool.submit(self._run, order, stop), stop)

    def kill(self, ref: ProcessRef, *, reason: str) -> bool:
        """Stop ``ref`` now (its transfer under way is broken off); False if unknown."""
        with self._lock:
            held = self._orders.get(ref)
            if held is None:
                return False
            future, stop = held
            if not future.cancel():
                stop.set(reason)  # (its hooks only shut sockets down: quick)
                return True
            del self._orders[ref]
            self._events.append(TaskEvent(ref[0], ref[1], "exited", time.time(), {"reason": reason, "spawned": False}))
        self._notify()
        return True

    def running(self) -> list[ProcessRef]:
        with self._lock:
            return list(self._orders)

    def drain(self) -> list[TaskEvent]:
        if not self._events:  # (most turns: no lock. One appended after this look comes with a notify)
            return []
        with self._lock:
            events, self._events = self._events, []
        return events

    def snapshot(self) -> tuple[list[ProcessRef], list[TaskEvent]]:
        """Orders under way and events not drained, together (what a REGISTER tells a restarted daemon)."""
        with self._lock:
            events, self._events = self._events, []
            return list(self._orders), events

    def busy(self) -> bool:
        with self._lock:
            return bool(self._orders)

    def stop(self) -> None:
        """Orders not begun are dropped (the agent is going: its daemon hears of them as lost); those
        under way are stopped (their transfers broken off)."""
        with self._lock:
            stops = [stop for _, stop in self._orders.values()]
        for stop in stops:
            stop.set("agent exiting")
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- in a worker thread -----------------------------------------------------------------------

    def _run(self, order: ProcessOrder, stop: Stop) -> None:
        ref = (order.job_id, order.slot)
        base = Path(self._cwd, os.path.expanduser(order.directory))
        counts = {"transfers": 0, "cache_hits": 0}
        data: dict[str, Any]
        try:
            for raw in order.staging:
                stop.check()
                self._step(order.role, Step.from_wire(raw), base, counts, stop)
            kind, data = "exited", {"exit_code": 0, "staging": counts}
        except Exception as exc:  # every failure ends the order, with its cause
            if stop.reason is not None:  # stopped: what the broken transfer raised is not the cause
                kind, data = "exited", {"reason": stop.reason, "spawned": False}
                log.info("staging stopped", node=self._node, job=order.job_id, role=order.role, reason=stop.reason)
            else:
                message = str(exc) if isinstance(exc, _StepFailed) else f"{order.role}: {exc!r}"
                kind, data = "failed", {"message": message}
                log.warning("staging failed", node=self._node, job=order.job_id, role=order.role, error=message)
        with self._lock:
            self._orders.pop(ref, None)
            self._events.append(TaskEvent(ref[0], ref[1], kind, time.time(), data))
        self._notify()

    def _step(self, role: str, step: Step, base: Path, counts: dict[str, int], stop: Stop) -> None:
        if step.action == REMOVE:
            _remove(base / step.source)
            return
        what = "stage-in" if role == "stage_in" else "stage-out"
        try:
            if role == "stage_in":
                self._stage_in(step, base / step.target, counts, stop)
            else:
                source = base / step.source
                if not os.path.lexists(source):
                    if step.if_present:
                        return
                    raise TransferError(f"{source} does not exist (StageOutFlags.IF_PRESENT skips a missing file)")
                TRANSFERS[url_parts(step.target)[0]].put(source, step.target, mode=step.action, stop=stop)
                counts["transfers"] += 1
        except Interrupted:
            raise
        except (TransferError, OSError, KeyError) as exc:
            cause = f"no transfer module for {exc}" if isinstance(exc, KeyError) else str(exc)
            raise _StepFailed(
                f"{what} of {step.source!r} to {step.target!r} on node {self._node} failed: {cause}"
            ) from None

    def _stage_in(self, step: Step, target: Path, counts: dict[str, int], stop: Stop) -> None:
        scheme = url_parts(step.source)[0]
        transfer = TRANSFERS[scheme]
        target.parent.mkdir(parents=True, exist_ok=True)
        key = step.source
        if not transfer.cached:  # a file: through the cache only when copied, and a regular file
            version = _file_version(step.source) if scheme == "file" and step.action == "copy" else None
            if version is None:
                transfer.fetch(step.source, target, mode=step.action, stop=stop)
                counts["transfers"] += 1
                return
            key = version
        cached, hit = self.cache.get(
            key, lambda path: transfer.fetch(step.source, path, mode="copy", stop=stop), stop=stop
        )
        counts["cache_hits" if hit else "transfers"] += 1
        if step.action == "link":
            link(cached, target)
        else:  # COPY (and MOVE, which a remote source cannot do): the task's own copy, writable (the
            # cache entry is read-only)
            place(cached, target, mode="copy", stop=stop)
            os.chmod(target, 0o644)


class _StepFailed(Exception):
    """A step's failure, its message naming the file, the node and the cause."""


def _file_version(url: str) -> str | None:
    """A ``file`` source's cache key: the URL and the file's identity and version (a file changed or
    replaced since is a new entry); None for what is not a regular file (a directory is copied whole)."""
    try:
        st = os.stat(local_path(url))
    except (OSError, TransferError):
        return None  # the copy itself reports what is wrong with it
    if not stat.S_ISREG(st.st_mode):
        return None
    return f"{url}#{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def _remove(path: Path) -> None:
    """Cleanup: a missing path is no error (it may never have been made, a stage-out moved it, or
    another node of the job removed it from a shared directory first)."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, onerror=_gone_is_fine)


def _gone_is_fine(function: Any, path: str, exc_info: Any) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


__all__ = ["Stager"]
