"""structlog set-up: JSON lines in production, readable console output in a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


class ResilientStream:
    """A log stream that outlives its reader: a closed pipe (EPIPE), a full or vanished journal
    socket, or EIO on a dead terminal drops the log line; it never ends the process."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.lost = 0  # lines dropped because the stream failed

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except (OSError, ValueError):  # ValueError: the stream was closed under us
            self.lost += 1
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self.lost += 1

    def isatty(self) -> bool:
        try:
            return bool(self._stream.isatty())
        except (OSError, ValueError):
            return False


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog once for the process. fmt: json | console | auto (console on a TTY).

    level and fmt are checked where they are read (config.OPTIONS: log.level, log.format)."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: Any = structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=ResilientStream(sys.stderr)),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    # uvicorn and other libraries log through the standard library: keep them quiet and on stderr.
    logging.basicConfig(level=max(_LEVELS[level], logging.WARNING), stream=ResilientStream(sys.stderr))


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
