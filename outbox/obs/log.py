"""Structured logging: one JSON object per line, `event` plus fields, secrets scrubbed.

Library code logs with `logger.info("event.name", extra={...fields})`. `configure()` installs
the JSON formatter on the root logger and routes `warnings` through it, so every line a
command writes to stderr is one JSON object: the package's, asyncpg's, asyncio's (its
exception handler's "Resetting connection with an active transaction ..." included), and an
application's own loggers. The worker and CLI call it; a library user keeps their own logging.
DSN passwords that any part of the package has seen are registered here and removed from every
line this formatter writes.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import IO, Any

import orjson

from outbox.redact import REDACTED, redact_text

__all__ = [
    "FORMATS",
    "JsonFormatter",
    "TextFormatter",
    "add_secrets",
    "configure",
    "get_logger",
    "scrub",
    "unconfigure",
]

_secrets: set[str] = set()
_secrets_lock = threading.Lock()

# Attributes every LogRecord has; anything else on a record came from `extra=` and is a field.
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def add_secrets(secrets: Iterable[str]) -> None:
    """Register strings (DSN passwords) that must never appear in a log line."""
    with _secrets_lock:
        _secrets.update(s for s in secrets if s)


def scrub(line: str) -> str:
    """Remove DSN shapes and every registered secret from `line`."""
    line = redact_text(line)
    for secret in sorted(_secrets, key=len, reverse=True):
        # A secret can appear raw or JSON-escaped (a quote or backslash in a password).
        for form in {secret, orjson.dumps(secret).decode()[1:-1]}:
            line = line.replace(form, REDACTED)
    return line


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "event", ...fields}` on one line."""

    def __init__(self, *, tracebacks: bool = False) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                data[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            data["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            if self.tracebacks:
                data["traceback"] = self.formatException(record.exc_info)
        line = orjson.dumps(data, default=str).decode()
        return scrub(line)


class TextFormatter(JsonFormatter):
    """`--log-format text`, for humans: `ts level event key=value ...` on one line (a value
    with spaces or quotes is JSON-quoted), then the traceback, if the record has one, on lines
    of its own as Python prints it, each indented under the record's line."""

    def format(self, record: logging.LogRecord) -> str:
        data = orjson.loads(super().format(record))  # scrubbed of secrets, as JSON is
        head = f"{data.pop('ts')} {data.pop('level'):<7} {data.pop('event')}"
        data.pop("logger", None)
        trace = data.pop("traceback", None)
        fields = " ".join(f"{k}={_text_value(v)}" for k, v in data.items())
        line = f"{head} {fields}" if fields else head
        if isinstance(trace, str) and trace:
            line += "".join(f"\n    {text}" for text in trace.rstrip().splitlines())
        return line


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    if isinstance(value, str) and (not value or any(c in value for c in ' "\n\t=')):
        return orjson.dumps(value).decode()
    return text


class _Fields(logging.Filter):
    """Fields every record of the process carries (the worker's id), unless it sets them."""

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__()
        self.fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.fields.items():
            if key not in record.__dict__:
                setattr(record, key, value)
        return True


FORMATS = ("json", "text")


def configure(
    level: str = "info",
    stream: IO[str] | None = None,
    *,
    fmt: str = "json",
    fields: dict[str, Any] | None = None,
) -> None:
    """Send every record (and every warning) to `stream` (stderr), one line each: JSON, or
    `fmt="text"` for humans; `fields` go on every line (e.g. the worker's id)."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}, expected json or text")
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter = TextFormatter if fmt == "text" else JsonFormatter
    handler.setFormatter(formatter(tracebacks=numeric <= logging.DEBUG))
    if fields:
        handler.addFilter(_Fields(fields))
    handler._outbox = True  # type: ignore[attr-defined]
    unconfigure()
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(numeric)
    logging.captureWarnings(True)


def unconfigure() -> None:
    """Remove what `configure()` installed (tests that configure in-process)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_outbox", False)]:
        root.removeHandler(old)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
