"""The process's log lines (SPEC §17): each with a UTC timestamp, as text or as JSON.

``text``: ``2026-12-04T20:31:07.123Z INFO webapp.web.live.runs: chat ... run ... completed``.
``json``: one object a line, ``{"time", "level", "logger", "message"}`` (plus
``exception`` with its traceback), for a log collector. uvicorn's own loggers
are routed through the same handler (its default setup has no timestamps).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[str, ...] = ("text", "json")


def utc_time(record: logging.LogRecord) -> str:
    """The record's time as ISO 8601 in UTC, to the millisecond."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return f"{utc_time(record)} {super().format(record)}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": utc_time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False)


def configure_logging(level: str, log_format: str = "text") -> None:
    """The app's loggers at ``level``; libraries (httpx logs every request at INFO) at
    WARNING, except when debugging. Every line through one handler on stderr."""
    if log_format not in LOG_FORMATS:
        raise ValueError(
            f"the log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}"
        )
    app_level = getattr(logging, level.upper())
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(
        level=logging.DEBUG if app_level == logging.DEBUG else logging.WARNING,
        handlers=[handler],
        force=True,
    )
    logging.getLogger("webapp").setLevel(app_level)
    logging.getLogger("webapp.access").setLevel(logging.INFO)  # on when --access-log is
