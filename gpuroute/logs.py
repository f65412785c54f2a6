"""How every long-running command logs: one setup for the router, the global tier, the agent,
the fake engine and the demo. JSON lines for collectors (python-json-logger over orjson: a
stdlib `logging.Formatter`, so every existing `logging.getLogger(...)` call site logs JSON
unchanged), readable text for a person at a terminal, and each record about a request
carrying that request's id (gpuroute/request_context.py)."""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from typing import IO, Any

import orjson
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.orjson import OrjsonFormatter

from gpuroute.log_flags import FORMAT_ENV, FORMATS, LEVEL_ENV, LEVELS, env_setting
from gpuroute.request_context import REQUEST_ID

# the record's own attributes renamed to the names log pipelines expect
JSON_NAMES = {"levelname": "level", "name": "logger"}


class RequestIdFilter(logging.Filter):
    """Stamps the current request's id on a record (unless the call named one itself):
    a handler's filter, so it sees every logger's records, the libraries' too."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            request_id = REQUEST_ID.get()
            if request_id is not None:
                record.request_id = request_id
        return True


class TextFormatter(logging.Formatter):
    """`2025-01-02 10:00:00,123 INFO gpuroute.router [req 3f2a...] message key=value ...`:
    the request's id where there is one, so a person can grep a request's lines too, and
    the fields the call passed (those JSON lines carry as keys) after the message."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(request)s %(message)s%(fields)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record.request = "" if request_id is None else f" [req {request_id}]"
        extra = (
            f" {key}={_text(value)}"
            for key, value in vars(record).items()
            if key not in _NOT_FIELDS and value is not None
        )
        record.fields = "".join(extra)
        return super().format(record)


_NOT_FIELDS = {*RESERVED_ATTRS, "message", "request", "fields", "request_id"}


def _text(value: object) -> str:
    """A field as text: an object or a list as JSON (a decision-log entry), else as is."""
    if isinstance(value, dict | list | tuple):
        return orjson.dumps(value, default=str).decode()
    return str(value)


def log_entry(logger: logging.Logger, kind: str, entry: dict[str, Any], field: str) -> None:
    """A structured entry (a routing decision) as one record: its `kind` the message and
    the entry a field (`field`), an object in a JSON line, JSON after `field=` in text."""
    logger.info(kind, extra={field: entry})


class JsonFormatter(OrjsonFormatter):
    """One JSON object a line: time (ISO 8601, UTC, first, for a person skimming them),
    level, logger, message, then whatever the call passed in `extra` (the access log's
    fields) and the request's id."""

    def __init__(self) -> None:
        super().__init__(
            "{levelname}{name}{message}",
            style="{",
            rename_fields=JSON_NAMES,
            reserved_attrs=[*RESERVED_ATTRS, "request", "fields"],
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        when = datetime.fromtimestamp(record.created, tz=UTC)
        log_data["time"] = when.isoformat(timespec="milliseconds")
        super().add_fields(log_data, record, message_dict)


def resolve_format(fmt: str, stream: IO[str]) -> str:
    """`auto`: text when a person reads the stream (a terminal), JSON otherwise."""
    if fmt != "auto":
        return fmt
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


class _Handler(logging.StreamHandler):
    """Ours, so that configuring again replaces it and leaves others' (pytest's) alone."""


def configure(
    level: str = "info", fmt: str = "auto", stream: IO[str] | None = None, *, export: bool = False
) -> str:
    """Install the one root handler; returns the format chosen. `export`: the settings go
    into the environment for the processes this one starts."""
    if level not in LEVELS or fmt not in FORMATS:
        raise ValueError(f"log level {level!r} or format {fmt!r} unknown")
    stream = stream if stream is not None else sys.stderr
    handler = _Handler(stream)
    chosen = resolve_format(fmt, stream)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    if export:
        os.environ[LEVEL_ENV], os.environ[FORMAT_ENV] = level, fmt
    return chosen


def configured() -> bool:
    return any(isinstance(h, _Handler) for h in logging.getLogger().handlers)


def ensure_configured(level: str = "info") -> None:
    """For entry points not reached through the CLI (tests, `runtime.run_from_config`
    called directly): the defaults, or the environment's, unless already set up."""
    if not configured():
        configure(env_setting(LEVEL_ENV, LEVELS, level), env_setting(FORMAT_ENV, FORMATS, "auto"))


def configure_from(args: Any) -> None:
    """The command's `--log-level` and `--log-format` (gpuroute/log_flags.py) applied, and
    passed on to the processes it starts."""
    configure(args.log_level, args.log_format, export=True)
