"""structlog set-up shared by daemon, agents and the CLI: JSON when not a TTY, console otherwise.

Every event passes :class:`pilot.security.RedactSecrets` last before rendering: task environments are
dropped unless the level is debug, and secret-looking values are masked at every level.

A log line that cannot be written (the run directory's file system is full, the terminal went away) is
dropped, never raised into the caller: the daemon and its agents log from everywhere, and a full disk
must not stop them (the daemon says so in 'pilot status' instead; see :mod:`pilot.journal_guard`).
"""

from __future__ import annotations

import datetime
import json as _json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import structlog

from pilot.security import RedactSecrets, mask_text


def configure(*, level: str = "info", stream: TextIO | None = None, json: bool | None = None) -> None:
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    global _direct
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    redact = RedactSecrets(keep_environments=level.lower() == "debug")
    out = _Unfailing(stream)
    number = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.PrintLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    _direct = (out, redact) if json and number <= logging.INFO else None


#: Where :func:`info_lines` writes JSON lines itself, and the redaction they pass: set by :func:`configure`
#: when it renders JSON at info level or below; None otherwise (then each line goes through structlog).
_direct: tuple[_Unfailing, RedactSecrets] | None = None


#: structlog's JSONRenderer's ``json.dumps(line, default=...)``, its encoder made once (not per line).
_encode = _json.JSONEncoder(default=repr).encode


def info_lines(logger: Any, event: str, rows: Sequence[dict[str, Any]]) -> None:
    """One info line per row (the row's fields, then ``event``), all written with one ``write``.

    For events that come by the thousand per second (a job's end): the same line structlog renders from
    ``logger.info(event, **row)`` -- level, one UTC timestamp for all, secrets masked by the same
    :class:`RedactSecrets` -- without its per-line chain of processors and its write per line. The rows
    are consumed (the line's fields are added to them)."""
    if not rows:
        return
    direct = _direct
    if direct is None or structlog.contextvars.get_contextvars():
        for row in rows:
            logger.info(event, **row)
        return
    out, redact = direct
    stamp = datetime.datetime.now(tz=datetime.UTC).isoformat().replace("+00:00", "Z")
    event = mask_text(event)  # masked once, as are the row's fields each
    lines = []
    for row in rows:
        line = redact(None, "info", row)
        line["event"], line["level"], line["timestamp"] = event, "info", stamp
        lines.append(_encode(line))
    lines.append("")
    out.write("\n".join(lines))
    out.flush()


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
