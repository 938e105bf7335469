"""JobExecutor('pilot'): PSI/J's executor backed by a pilot daemon.

``get_instance('pilot', url=...)`` connects to the daemon at ``url`` (an ``ipc://``/``tcp://`` address
or a run directory), else to the running default pilot (``PILOT_HOME``, ``PILOT_NAME``), else starts
an embedded local pilot (``PILOT_CONFIG`` picks its config) that stops when the executor closes.

``request_timeout`` (keyword-only, seconds, default 10) bounds how long ``submit``, ``cancel``, ``list``,
``attach`` and ``pilot_status`` wait for the pilot's answer; they then raise ``SubmitException`` with
``transient=True``. A daemon that is gone is reported at once, not at the timeout. The executor follows
a daemon restarted on the same run directory by itself: jobs it holds that are not final are attached
again, so their callbacks and ``Job.wait()`` resume (or they end FAILED if the new daemon lost them).
"""

from __future__ import annotations

from typing import Any

from client._backend import Backend
from client._connection import DEFAULT_REQUEST_TIMEOUT, StatusSink
from client._translate import spec_to_wire
from client.exceptions import InvalidStateException
from client.job import Job, JobStatusCallback
from client.job_status import JobStatus
from pilot import __version__
from pilot.model.job_state import JobState


class JobExecutorConfig:
    """Kept for psij-python compatibility; the pilot needs no per-executor configuration."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class JobExecutor:
    def __init__(
        self,
        url: str | None = None,
        config: JobExecutorConfig | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        self.url = url
        self.config = config or JobExecutorConfig()
        self._backend = Backend(url, request_timeout=request_timeout)
        self._callback: JobStatusCallback | None = None

    @property
    def request_timeout(self) -> float:
        """Seconds a request waits for the pilot's answer before a transient SubmitException."""
        return self._backend.request_timeout

    @staticmethod
    def get_instance(
        name: str = "pilot",
        version_constraint: str | None = None,
        url: str | None = None,
        config: JobExecutorConfig | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> JobExecutor:
        if name.lower() != "pilot":
            raise ValueError(f'No such executor "{name}". Available executors: [pilot]')
        return JobExecutor(url=url, config=config, request_timeout=request_timeout)

    @property
    def name(self) -> str:
        return "pilot"

    @property
    def version(self) -> str:
        return __version__

    # -- PSI/J operations ---------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if job.status.state is not JobState.NEW or job.executor is not None:
            raise InvalidStateException(f"job {job.id} was already submitted (state {job.status.state})")
        description = spec_to_wire(job.spec)

        def on_id(native_id: str) -> StatusSink:
            job._native_id = native_id
            return lambda s: _apply(job, s)

        job.executor = self
        try:
            t = self._backend.submit(description, on_id)
        except BaseException:
            job.executor = None
            raise
        job._set_status(JobStatus(JobState.QUEUED, time=t))

    def cancel(self, job: Job) -> None:
        if job.native_id is None:
            raise InvalidStateException(f"job {job.id} was never submitted")
        if job.status.final:
            return
        self._backend.cancel(job.native_id)

    def list(self) -> list[str]:
        return self._backend.list()

    def attach(self, job: Job, native_id: str) -> None:
        if job.status.state is not JobState.NEW:
            raise InvalidStateException(f"job {job.id} is not new; attach needs a fresh Job")

        job._native_id = str(native_id)
        job.executor = self
        try:
            status = self._backend.attach(str(native_id), lambda s: _apply(job, s))
        except BaseException:
            job.executor = None
            raise
        _apply(job, status)

    def set_job_status_callback(self, cb: JobStatusCallback | Any | None) -> None:
        if cb is not None and not callable(cb):
            cb = cb.job_status_changed
        self._callback = cb

    def _notify_callback(self, job: Job, status: JobStatus) -> None:
        cb = self._callback
        if cb is not None:
            cb(job, status)

    # -- beyond PSI/J -------------------------------------------------------------------------------

    def pilot_status(self) -> dict[str, Any]:
        """The pilot's own status: allocation, nodes, job counts (what ``pilot status`` shows)."""
        return self._backend.status()

    def close(self) -> None:
        """Done with this executor; the last user of an embedded pilot stops it."""
        self._backend.close()

    def __enter__(self) -> JobExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JobExecutor[pilot, {self.url or 'default'}]"


def status_from_wire(raw: list[Any]) -> JobStatus:
    _, state, t, exit_code, message, metadata = raw
    return JobStatus(JobState(state), time=float(t), message=message, exit_code=exit_code, metadata=metadata)


def _apply(job: Job, raw: list[Any]) -> None:
    try:
        status = status_from_wire(raw)
    except (ValueError, TypeError):
        return
    job._set_status(status)
