"""How Vigil's processes log: text for a terminal (the CLI's default), or one JSON object a line
for a log pipeline (`--log-format json`, the chart's default).

A JSON line holds `time` (RFC 3339, UTC, milliseconds), `level`, `logger` and `message`; the
fields of what the line is about: `controller`, `namespace`, `name` and, once known, `attempt`
(set by the worker around each reconcile, `reconciling`, so that every line logged inside one
carries them without each call naming them; `bind` adds what is learnt on the way), or given to
one call as `extra=about(...)`; then any other `extra=` the call gave; and `exc_info`, the
traceback as one string. The context is a ContextVar, set and reset once a reconcile (a
fraction of a microsecond), and copied onto a record only when one is made (a line at a level
logged), by the record factory `configure` installs: so it is the context of the code that
logged, whenever and wherever the line is written.

Nothing here decides what is logged: no caller logs a token or a request's headers (the beat
and metrics servers log the verdict, never the credential).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Hashable, Mapping
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import IO, Any, Literal

LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIELDS = "fields"  # the `extra=` key of `about`: a dict, merged into the line
CONTEXT = "vigil_context"  # the record's copy of the reconcile's context
_HANDLER = "vigil"

_context: ContextVar[dict[str, Any] | None] = ContextVar("vigil_log_context", default=None)
# What every LogRecord has: anything else on a record came from a call's `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def reconciling(controller: str, key: Hashable) -> Token[dict[str, Any] | None]:
    """The context of one reconcile of `key` by `controller`, until `done(token)`: a key
    (namespace, name) names the object; any other key (a sweep) only the controller."""
    context: dict[str, Any] = {"controller": controller}
    if isinstance(key, tuple) and len(key) >= 2 and isinstance(key[0], str) and isinstance(key[1], str):
        context["namespace"], context["name"] = key[0], key[1]
    return _context.set(context)


def done(token: Token[dict[str, Any] | None]) -> None:
    _context.reset(token)


def bind(**fields: Any) -> None:
    """Adds `fields` (attempt=3; None: not known, left out) to the current reconcile's context;
    outside one, nothing."""
    context = _context.get()
    if context is not None:
        context.update((k, v) for k, v in fields.items() if v is not None)


def about(namespace: str | None = None, name: str | None = None, **more: Any) -> dict[str, Any]:
    """`extra=` for one call outside a reconcile: `log.info("...", extra=about(ns, job, attempt=2))`.
    (`name` cannot be an `extra=` key of its own: LogRecord.name is the logger's.)"""
    fields = {"namespace": namespace, "name": name, **more}
    return {FIELDS: {k: v for k, v in fields.items() if v is not None}}


def rfc3339(created: float) -> str:
    """A Unix time as RFC 3339 in UTC, to the millisecond: 2026-12-07T04:20:00.123Z."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object a line (a message's newlines escaped), keys as the module says."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _STANDARD:
                continue
            if key in (FIELDS, CONTEXT) and isinstance(value, Mapping):
                line.update(value)
            else:
                line[key] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def _with_context(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        made = make(*args, **kwargs)
        context = _context.get()
        if context:
            setattr(made, CONTEXT, dict(context))  # as it is now: a later bind is not this line's
        return made

    record.vigil = True  # type: ignore[attr-defined]  # installed once, whatever configure's calls
    return record


def formatter(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def configure(level: str, log_format: LogFormat = "text", stream: IO[str] | None = None) -> None:
    """The root logger at `level` (debug, info, warning, error), writing to stderr in `log_format`;
    replaces the handler of a call before, and no other (a test runner's capture stays)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(log_format))
    handler.set_name(_HANDLER)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    factory = logging.getLogRecordFactory()
    if not getattr(factory, "vigil", False):
        logging.setLogRecordFactory(_with_context(factory))
