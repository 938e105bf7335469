"""The ``pilot`` executor for psij-python 0.9.11: psij's Job objects, our daemon behind them."""

from __future__ import annotations

import builtins
from typing import Any

import psij

from client._backend import Backend
from client._translate import spec_to_wire
from client.exceptions import InvalidJobException, SubmitException


class PilotJobExecutor(psij.JobExecutor):
    def __init__(self, url: str | None = None, config: psij.JobExecutorConfig | None = None) -> None:
        super().__init__(url=url, config=config or psij.JobExecutorConfig())
        self._backend = Backend(url)

    def submit(self, job: psij.Job) -> None:
        spec = self._check_job(job)
        try:
            description = spec_to_wire(spec)

            def on_id(native_id: str) -> None:
                job._native_id = native_id
                self._backend.connection.subscribe(native_id, lambda s: self._apply(job, s))

            t = self._backend.submit(description, on_id)
        except InvalidJobException as exc:
            job.executor = None
            raise psij.InvalidJobException(exc.message) from None
        except SubmitException as exc:
            job.executor = None
            raise psij.SubmitException(exc.message, transient=exc.transient) from None
        self._set_job_status(job, psij.JobStatus(psij.JobState.QUEUED, time=t))

    def cancel(self, job: psij.Job) -> None:
        if job.native_id is None:
            raise psij.InvalidJobException("the job was never submitted")
        if job.status.final:
            return
        try:
            self._backend.cancel(job.native_id)
        except SubmitException as exc:
            raise psij.SubmitException(exc.message, transient=exc.transient) from None

    def list(self) -> builtins.list[str]:
        try:
            return self._backend.list()
        except SubmitException as exc:
            raise psij.SubmitException(exc.message, transient=exc.transient) from None

    def attach(self, job: psij.Job, native_id: str) -> None:
        job.executor = self
        job._native_id = str(native_id)
        try:
            status = self._backend.attach(str(native_id), lambda s: self._apply(job, s))
        except InvalidJobException as exc:
            raise psij.InvalidJobException(exc.message) from None
        except SubmitException as exc:
            raise psij.SubmitException(exc.message, transient=exc.transient) from None
        self._apply(job, status)

    def close(self) -> None:
        self._backend.close()

    def _apply(self, job: psij.Job, raw: builtins.list[Any]) -> None:
        _, state, t, exit_code, message, metadata = raw
        try:
            st = psij.JobState[state]
        except KeyError:
            return
        current = job.status
        if current.final:
            return  # psij-python does not stop a second final state; we must
        self._set_job_status(job, psij.JobStatus(st, time=t, message=message, exit_code=exit_code, metadata=metadata))
