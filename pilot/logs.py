"""structlog set-up shared by daemon, agents and the CLI: JSON when not a TTY, console otherwise.

Every event passes :class:`pilot.security.RedactSecrets` last before rendering: task environments are
dropped unless the level is debug, and secret-looking values are masked at every level.

A log line that cannot be written (the run directory's file system is full, the terminal went away) is
dropped, never raised into the caller: the daemon and its agents log from everywhere, and a full disk
must not stop them (the daemon says so in 'pilot status' instead; see :mod:`pilot.journal_guard`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

import structlog

from pilot.security import RedactSecrets


def configure(*, level: str = "info", stream: TextIO | None = None, json: bool | None = None) -> None:
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            RedactSecrets(keep_environments=level.lower() == "debug"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=_Unfailing(stream)),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


class _Unfailing:
    """The stream a logger prints to, for whom a failed write drops the line: a full file system (ENOSPC,
    EDQUOT) or a closed terminal must not raise out of a log call. A stream with a file descriptor is
    written with one ``os.write`` per line, bypassing Python's buffer, which would otherwise keep a line
    that failed and fail again at every later flush."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._pending: list[str] = []
        try:
            self._fd: int | None = stream.fileno()
            stream.flush()
        except (OSError, ValueError, AttributeError):
            self._fd = None
        #: Lines that could not be written.
        self.dropped = 0

    def write(self, text: str) -> int:
        self._pending.append(text)
        return len(text)

    def flush(self) -> None:
        text, self._pending = "".join(self._pending), []
        if not text:
            return
        try:
            if self._fd is None:
                self._stream.write(text)
                self._stream.flush()
                return
            data = text.encode("utf-8", "replace")
            while data:
                data = data[os.write(self._fd, data) :]
        except (OSError, ValueError):
            self.dropped += 1

    def isatty(self) -> bool:
        return self._stream.isatty()
