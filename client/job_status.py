"""JobStatus: a state, when it was entered, and what came with it (exit code, message, Delivered)."""

from __future__ import annotations

import time as _time
from typing import Any

from pilot.model.job_state import JobState


class JobStatus:
    __slots__ = ("exit_code", "message", "metadata", "state", "time")

    def __init__(
        self,
        state: JobState,
        time: float | None = None,
        message: str | None = None,
        exit_code: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.state = state
        self.time = _time.time() if time is None else time
        self.message = message
        self.exit_code = exit_code
        self.metadata = metadata

    @property
    def final(self) -> bool:
        return self.state.final

    def is_final(self) -> bool:
        return self.state.final

    def __repr__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in ("exit_code", "message") if getattr(self, k) is not None)
        return f"JobStatus[{self.state}, time={self.time:.3f}{extra}]"
