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
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, TextIO, TypeVar

import structlog

from pilot.security import RedactSecrets, mask_text

R = TypeVar("R")


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
#: Field names as JSON strings (the same few come with every line).
_keys: dict[str, str] = {}
#: Recent string values as they are written (masked, quoted): most repeat from line to line (a state, a
#: node's name, a job's name); emptied when full (each line's job id is new).
_texts: dict[str, str] = {}
_TEXTS_MOST = 4096
#: Only short values are kept: a job's name or message is the user's, of any length.
_TEXT_LONGEST = 256


def json_string(value: str) -> str:
    """``value`` masked and quoted as a JSON string. ASCII digits (a job's id, new on every line) are
    their own JSON and name no secret: quoted at once, not kept."""
    if value.isdigit() and value.isascii():
        return '"' + value + '"'
    out = _texts.get(value)
    if out is None:
        out = _quote(mask_text(value))
        if len(value) <= _TEXT_LONGEST:
            if len(_texts) >= _TEXTS_MOST:
                _texts.clear()
            _texts[value] = out
    return out


def info_lines(logger: Any, event: str, rows: Sequence[dict[str, Any]]) -> None:
    """One info line per row (the row's fields, then ``event``), all written with one ``write``.

    For events that come by the thousand per second (a job's end): the same line structlog renders from
    ``logger.info(event, **row)`` -- level, one UTC timestamp for all, secrets masked as
    :class:`RedactSecrets` masks them -- without its per-line chain of processors and its write per line.
    A row of plain fields (strings, numbers, lists of strings, under names that are neither a secret's
    nor an environment's) is rendered here in one pass; any other row goes through ``RedactSecrets`` and
    json's encoder."""
    info_lines_of(logger, event, rows, fields=_as_fields)


def _as_fields(row: dict[str, Any]) -> dict[str, Any]:
    return row


def info_lines_of(
    logger: Any,
    event: str,
    items: Sequence[R],
    *,
    fields: Callable[[R], dict[str, Any]],
    body: Callable[[R], str | None] | None = None,
) -> None:
    """:func:`info_lines` of ``fields(item)`` for each item. ``body``, when given, renders an item's
    fields as :func:`_plain` would (``"k": v, ...``, strings through :func:`json_string`) without
    building them first, or returns None to leave the item to the general path: a line that comes once
    per job rendered by a function written for it."""
    if not items:
        return
    direct = _direct
    if direct is None or _context_bound():
        for item in items:
            logger.info(event, **fields(item))
        return
    out, redact = direct
    stamp = datetime.datetime.now(tz=datetime.UTC).isoformat().replace("+00:00", "Z")
    # The fields every line ends with, rendered once: what json renders of {"event": ..., "level": "info",
    # "timestamp": ...}, without its encoder's set-up (a loop turn often ends one job or two).
    end = ', "event": ' + json_string(event) + ', "level": "info", "timestamp": ' + _quote(stamp) + "}"
    lines = []
    for item in items:
        text = body(item) if body is not None else None
        if text is None:
            row = fields(item)
            text = _plain(row, redact)
            if text is None:
                tail = {"event": mask_text(event), "level": "info", "timestamp": stamp}
                lines.append(_encode({**redact(None, "info", dict(row)), **tail}))
                continue
        lines.append("{" + text + end if text else "{" + end[2:])
    lines.append("")
    out.write("\n".join(lines))
    out.flush()


def _context_bound() -> bool:
    """Whether structlog's context variables hold anything (then lines go through structlog, which adds
    them). Asked once per batch of lines (0.2 us)."""
    return bool(structlog.contextvars.get_contextvars())


def _plain(row: dict[str, Any], redact: RedactSecrets) -> str | None:
    """The row's fields as JSON (``"k": v, ...``, as json.dumps separates them), secrets in its strings
    masked; None if a field is not plain (then the caller takes the general path)."""
    parts = []
    for k, v in row.items():
        key = _keys.get(k)
        if key is None:
            if type(k) is not str or not redact.plain_name(k):
                return None
            key = _keys[k] = _quote(k) + ": "
        t = type(v)
        if t is str:
            parts.append(key + json_string(v))
        elif v is None:
            parts.append(key + "null")
        elif t is int:
            parts.append(key + int.__repr__(v))
        elif t is float and v - v == 0:  # finite (json writes the others as NaN, Infinity)
            parts.append(key + float.__repr__(v))
        elif t is bool:
            parts.append(key + ("true" if v else "false"))
        elif t is list and all(type(x) is str for x in v):
            parts.append(key + "[" + ", ".join([json_string(x) for x in v]) + "]")
        else:
            return None
    return ", ".join(parts)


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
