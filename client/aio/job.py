"""AsyncJob: a job whose ``wait()`` and ``cancel()`` are awaited, for workflow engines on asyncio or trio.

It wraps the sync client's :class:`~client.job.Job`, which the sync machinery drives on its threads
(native id, exactly-once submit, restart following); the status seen here is the one the event loop
has been handed (``client/aio/_loop.py``), so ``status``, ``wait()`` and the executor's ``events()``
always agree, and waiting costs no thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import anyio

from client.exceptions import SubmitException
from client.job import Job, wait_terms
from client.job_spec import JobSpec
from client.job_status import JobStatus
from pilot.model.job_state import JobState

if TYPE_CHECKING:
    from client.aio.executor import AsyncJobExecutor


class AsyncJob:
    """A JobSpec and the status the pilot reports, in PSI/J's order (NEW < QUEUED < ACTIVE < final)."""

    def __init__(self, spec: JobSpec | None = None) -> None:
        self._job = Job(spec)  # what the sync client submits and updates (on its threads)
        self._status = JobStatus(JobState.NEW)  # as handed to the event loop
        self._changed: anyio.Event | None = None  # made by a waiter, set (and dropped) at the next status
        self.executor: AsyncJobExecutor | None = None

    @property
    def spec(self) -> JobSpec | None:
        return self._job.spec

    @spec.setter
    def spec(self, spec: JobSpec | None) -> None:
        self._job.spec = spec

    @property
    def id(self) -> str:
        """This client's id of the job (a uuid), known before it is submitted."""
        return self._job.id

    @property
    def native_id(self) -> str | None:
        """The pilot's id of the job (what ``pilot show``/``pilot logs`` take); None until submitted."""
        return self._job.native_id

    @property
    def status(self) -> JobStatus:
        return self._status

    async def wait(
        self,
        timeout: timedelta | float | None = None,  # noqa: ASYNC109 -- PSI/J's wait(timeout, target_states)
        target_states: JobState | Sequence[JobState] | None = None,
    ) -> JobStatus | None:
        """Until a target state (or any later one) or a final state, as :meth:`client.Job.wait`; None
        after ``timeout`` seconds. Cancelling the awaiting task only stops the waiting."""
        timeout, reached = wait_terms(lambda: self._status.state, timeout, target_states)

        with anyio.move_on_after(timeout):
            while not reached():
                if self._changed is None:
                    self._changed = anyio.Event()
                await self._changed.wait()
            return self._status
        return None

    async def cancel(self) -> None:
        """Cancel the job (nothing if it is final already): its CANCELED status follows."""
        if self._status.final:
            return
        if self.executor is None:
            raise SubmitException("the job was never submitted")
        await self.executor.cancel(self)

    def _advance(self, status: JobStatus) -> None:
        """On the loop: the next state the job entered (the sync Job has ordered and filled them in)."""
        self._status = status
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def __repr__(self) -> str:
        return f"AsyncJob[id={self.id}, native_id={self.native_id}, {self._status}]"
