"""Job: a JobSpec plus the status the pilot reports, with PSI/J's ordering and waiting rules."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import structlog

from client.job_spec import JobSpec
from client.job_status import JobStatus
from pilot.model.job_state import JobState, states_between

if TYPE_CHECKING:
    from client.job_executor import JobExecutor

log = structlog.get_logger("client")

JobStatusCallback = Callable[["Job", JobStatus], None]
#: For each (current, new) pair of states, the states skipped on the way (states_between), or None when
#: ``new`` is no advance: computed once, as it is looked up for every status of every job.
_STEPS: dict[tuple[JobState, JobState], tuple[JobState, ...] | None] = {
    (old, new): tuple(states_between(old, new)) if not old.final and new.is_greater_than(old) else None
    for old in JobState
    for new in JobState
}


class Job:
    def __init__(self, spec: JobSpec | None = None) -> None:
        self.spec = spec
        self._id: str | None = None  # made when first asked for: most jobs are never asked
        self._native_id: str | None = None
        self._status = JobStatus(JobState.NEW)
        #: Guards the status and the statuses to fire. The condition ``wait()`` blocks on is made on this
        #: lock only when a thread has to block: a Condition is a dozen objects for the garbage collector
        #: to track (and to walk in every full collection while the job lives), and most jobs are final
        #: when they are waited for, or never waited for.
        self._lock = threading.Lock()
        self._cv: threading.Condition | None = None
        self._waiting = 0  # threads in wait(): a status notifies only when there are some
        self._callback: JobStatusCallback | None = None
        self._to_fire: list[JobStatus] | None = None  # entered while another thread fires, not given yet
        self._firing = False
        self.executor: JobExecutor | None = None

    @property
    def id(self) -> str:
        job_id = self._id
        if job_id is None:
            with self._lock:
                if self._id is None:
                    self._id = str(uuid.uuid4())
                job_id = self._id
        return job_id

    @property
    def native_id(self) -> str | None:
        return self._native_id

    @property
    def status(self) -> JobStatus:
        return self._status

    def set_job_status_callback(self, cb: JobStatusCallback | Any | None) -> None:
        """A callable ``(job, status)`` or an object with ``job_status_changed(job, status)``."""
        if cb is not None and not callable(cb):
            cb = cb.job_status_changed
        self._callback = cb

    set_status_callback = set_job_status_callback

    def cancel(self) -> None:
        from client.exceptions import SubmitException

        if self._status.final:
            return
        if self.executor is None:
            raise SubmitException("the job was never submitted")
        self.executor.cancel(self)

    def wait(
        self,
        timeout: timedelta | float | None = None,
        target_states: JobState | Sequence[JobState] | None = None,
    ) -> JobStatus | None:
        """Until a target state (or any later one) or a final state; None on timeout."""
        status = self._status
        if status.final:  # reached whatever the targets, and never left
            return status
        timeout, reached = wait_terms(lambda: self._status.state, timeout, target_states)
        with self._lock:
            if reached():
                return self._status
            cv = self._cv
            if cv is None:
                cv = self._cv = threading.Condition(self._lock)
            self._waiting += 1
            try:
                if not cv.wait_for(reached, timeout):
                    return None
            finally:
                self._waiting -= 1
            return self._status

    def _fire(self, entered: list[JobStatus]) -> None:
        """Run the callbacks, the job's then its executor's; one that raises is logged and does not stop
        the others (nor ``submit``)."""
        cb = self._callback
        executor = self.executor
        for status in entered:
            if cb is not None:
                try:
                    cb(self, status)
                except Exception:
                    log.exception("job status callback failed", job=self._native_id, state=str(status.state))
            executor_cb = executor._callback if executor is not None else None
            if executor_cb is not None:
                try:
                    executor_cb(self, status)
                except Exception:
                    log.exception("executor status callback failed", job=self._native_id, state=str(status.state))

    def _set_status(self, status: JobStatus) -> None:
        """Apply ``status`` and run the callbacks for every state entered, strictly in order: statuses
        arrive on two threads (QUEUED on the submitting one, the rest on the connection's delivering
        worker), so one thread at a time fires what is queued and the other leaves its states to it. No
        lock is held while a callback runs (a callback may call ``wait``)."""
        with self._lock:
            old = self._status
            skipped = _STEPS[(old.state, status.state)]
            if skipped is None:  # no advance: a status never goes back
                batch = []
            else:  # the states entered, skipped ones synthesised
                since = old.time if old.state is not JobState.NEW else None  # (NEW: this clock's)
                batch = _synthesised(skipped, since, status) if skipped else []
                batch.append(status)
                self._status = status
                if self._waiting and self._cv is not None:
                    self._cv.notify_all()
            if self._to_fire is not None:  # left by a callback that raised: they go first
                batch, self._to_fire = self._to_fire + batch, None
            if not batch:
                return
            if self._firing:
                self._to_fire = batch
                return
            self._firing = True
        while True:
            try:
                self._fire(batch)
            except BaseException:
                with self._lock:
                    self._firing = False
                raise
            with self._lock:
                if self._to_fire is None:
                    self._firing = False
                    return
                batch, self._to_fire = self._to_fire, None

    def __repr__(self) -> str:
        return f"Job[id={self.id}, native_id={self._native_id}, {self._status}]"


def _synthesised(skipped: tuple[JobState, ...], since: float | None, status: JobStatus) -> list[JobStatus]:
    """Statuses for the states ``status`` skipped, timed by :func:`_entered_at` and kept in order: none
    after a later one's (an instant job's QUEUED, timed at its end, would otherwise come after its
    ACTIVE, timed at its process's start) and none before the time of the state the job was in
    (``since``: the agent's clock may be behind the daemon's), unless ``status`` itself is."""
    end = status.time
    if since is not None and end is not None and since > end:
        since = end
    if len(skipped) == 1:  # (the common case: a short task's ACTIVE, timed at or before its end)
        t = _entered_at(skipped[0], status)
        return [JobStatus(skipped[0], time=since if t is not None and since is not None and t < since else t)]
    stamps = [_entered_at(s, status) for s in skipped]
    later = end
    for i in range(len(stamps) - 1, -1, -1):
        t = stamps[i]
        if t is not None and later is not None and t > later:
            stamps[i] = t = later
        later = t if t is not None else later
    out = []
    for s, t in zip(skipped, stamps, strict=True):
        if t is not None and since is not None and t < since:
            t = since
        since = t if t is not None else since
        out.append(JobStatus(s, time=t))
    return out


def _entered_at(skipped: JobState, status: JobStatus) -> float | None:
    """When a state no status was sent for was entered: ACTIVE when the job's process started (a task
    that started and ended between two reports is reported by its end, whose Delivered carries its
    start), any other at the time of the status that skipped it."""
    started = (status.metadata or {}).get("started") if skipped is JobState.ACTIVE else None
    if (
        isinstance(started, int | float)
        and not isinstance(started, bool)
        and status.time is not None
        and started <= status.time
    ):
        return float(started)
    return status.time


def wait_terms(
    state: Callable[[], JobState],
    timeout: timedelta | float | None,
    target_states: JobState | Sequence[JobState] | None,
) -> tuple[float | None, Callable[[], bool]]:
    """PSI/J's wait() arguments as seconds and a test of the job's ``state()``: a target state (or a
    later one) or a final state reached. The sync and the async Job share it."""
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if target_states is None:
        targets: list[JobState] = []
    elif isinstance(target_states, JobState):
        targets = [target_states]
    else:
        targets = list(target_states)

    def reached() -> bool:
        s = state()
        return bool(s.final or any(s is t or s.is_greater_than(t) for t in targets))

    return timeout, reached
