"""Logging for the CLI and uvicorn: one format (text or JSON), tokens redacted, ids added."""

from __future__ import annotations

import logging
import logging.config
import re
import uuid
from typing import Any, Literal
from urllib.parse import unquote_plus

from opentelemetry import trace
from pythonjsonlogger.core import RESERVED_ATTRS

from runtime import log_context

LogFormat = Literal["text", "json"]

REDACTED = "[redacted]"
# A query parameter. Old websocket clients send `?token=`, and uvicorn logs request lines
# verbatim: whatever encoding the client chose (`%74oken=`, `TOKEN=`, `tok%2565n=`) is
# what the log would show, and Starlette decodes the key before the gateway reads it.
_PARAM = re.compile(r"(?P<key>(?:^|(?<=[?&;]))[^=&;\s\"'#?]+)=(?P<value>[^&;\s\"'#]*)")
# A run of characters a token may be written with in a URL, header or message, percent
# escapes included; and one of our tokens (`tl_` + URL-safe characters) once it is decoded.
_RUN = re.compile(r"[A-Za-z0-9_\-.~+%]{8,}")
_TOKEN = re.compile(r"(?<![A-Za-z0-9])tl_[A-Za-z0-9_\-]{16,}")
_MAX_DECODES = 4  # `%2574` is `%74` is `t`: decode until nothing changes, a few times at most


def _decoded(text: str) -> str:
    for _ in range(_MAX_DECODES):
        decoded = unquote_plus(text)
        if decoded == text:
            break
        text = decoded
    return text


def _param(match: re.Match[str]) -> str:
    key = match.group("key")
    if _decoded(key).strip().casefold().endswith("token"):
        return f"{key}={REDACTED}"
    return match.group(0)


def _run(match: re.Match[str]) -> str:
    text = match.group(0)
    return REDACTED if _TOKEN.search(_decoded(text)) else text


def redact(text: str) -> str:
    """`text` without any token: values of `token` parameters in any encoding (repeated,
    any case, percent-encoded key or value), and anything that decodes to a `tl_` token."""
    if "=" in text:
        text = _PARAM.sub(_param, text)
    return _RUN.sub(_run, text)


def _redact_arg(arg: object) -> object:
    if isinstance(arg, str):
        return redact(arg)
    if isinstance(arg, (int, float)) or arg is None:
        return arg  # keeps %d and %f working
    shown = str(arg)
    cleaned = redact(shown)
    return arg if cleaned == shown else cleaned


class RedactTokens(logging.Filter):
    """Redacts tokens from a record's message, arguments, traceback and stack."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            # Kept as arguments: uvicorn's access formatter unpacks them.
            record.args = tuple(_redact_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redact_arg(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            # Formatted here, so the handler's formatter uses this text (it caches it).
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The JSON keys of every line; the ids follow when known (LogContext).
JSON_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
JSON_RENAMES = {"asctime": "time", "levelname": "level", "name": "logger"}


class LogContext(logging.Filter):
    """Adds the ids known where the record was made: request, thread and run (runtime's
    context variables), and the current span's trace and span ids."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in log_context.current().items():
            setattr(record, name, value)
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            record.trace_id = format(span.trace_id, "032x")
            record.span_id = format(span.span_id, "016x")
        return True


def logging_config(level: str, fmt: LogFormat = "text") -> dict[str, Any]:
    """One `logging.config.dictConfig` for the app and uvicorn: a single stderr handler whose
    format is `fmt`, token redaction then the ids on every record; uvicorn's loggers propagate
    to it instead of keeping formats of their own."""
    formatter: dict[str, Any] = {"format": TEXT_FORMAT}
    if fmt == "json":
        formatter = {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": JSON_FORMAT,
            "rename_fields": JSON_RENAMES,
            # uvicorn's extra `color_message` repeats the message with terminal escapes.
            "reserved_attrs": [*RESERVED_ATTRS, "color_message"],
        }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"redact_tokens": {"()": RedactTokens}, "log_context": {"()": LogContext}},
        "formatters": {"default": formatter},
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "default",
                "filters": ["redact_tokens", "log_context"],
            }
        },
        "root": {"level": level.upper(), "handlers": ["default"]},
        "loggers": {
            name: {"handlers": [], "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


def setup_logging(level: str, fmt: LogFormat = "text") -> None:
    logging.config.dictConfig(logging_config(level, fmt))


def uvicorn_log_config(fmt: LogFormat = "text", level: str = "info") -> dict[str, Any]:
    """The same configuration, for uvicorn's `log_config` (it applies it again at start)."""
    return logging_config(level, fmt)


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def _given_id(headers: Any) -> str | None:
    """The caller's `X-Request-ID` when it is a plain short token (the last one sent, as a
    dict of the headers would keep), scanned without copying the headers."""
    given = None
    for name, value in headers:
        if name == b"x-request-id":
            given = value
    if given is None:
        return None
    text: str = given.decode("latin-1")
    return text if _REQUEST_ID.fullmatch(text) else None


class RequestIds:
    """ASGI middleware: every HTTP request and websocket gets a request id for its log lines:
    the caller's `X-Request-ID` when it is a plain short token, else a new one; HTTP responses
    echo it in `X-Request-ID`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request_id = _given_id(scope.get("headers") or ()) or uuid.uuid4().hex

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (b"x-request-id", request_id.encode())]
                message = {**message, "headers": headers}
            await send(message)

        with log_context.bound(request_id=request_id):
            await self.app(scope, receive, send_with_id)
