"""Logging set-up for the CLI: diagnostics on stderr, and tokens redacted from every log line."""

from __future__ import annotations

import copy
import logging
import re
import sys
from typing import Any
from urllib.parse import unquote_plus

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


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactTokens())


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration with token redaction on its handlers."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_tokens"] = {"()": RedactTokens}
    for handler in config["handlers"].values():
        handler.setdefault("filters", []).append("redact_tokens")
    return config
