"""structlog set-up shared by daemon, agents and the CLI: JSON when not a TTY, console otherwise.

Every event passes :class:`pilot.security.RedactSecrets` last before rendering: task environments are
dropped unless the level is debug, and secret-looking values are masked at every level.
"""

from __future__ import annotations

import logging
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
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
