"""Logging set-up for the CLI: diagnostics on stderr, and tokens redacted from every log line."""

from __future__ import annotations

import copy
import logging
import re
import sys
from typing import Any

# Websocket URLs carry `?token=`; uvicorn logs request lines verbatim.
_TOKEN_PARAM = re.compile(r"(token=)[^&\s\"']+")
_REDACTED = r"\1[redacted]"


def redact(text: str) -> str:
    return _TOKEN_PARAM.sub(_REDACTED, text)


class RedactTokens(logging.Filter):
    """Rewrites `token=...` in a record's message and string arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
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
