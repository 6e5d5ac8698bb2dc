"""JSON responses rendered with orjson, and the error body shape shared by HTTP and websocket."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


def dumps(content: Any) -> bytes:
    # `default=str` keeps an odd detail value (a datetime, a set) from turning into a 500.
    return orjson.dumps(content, default=_fallback, option=orjson.OPT_NON_STR_KEYS)


def _fallback(value: Any) -> Any:
    if isinstance(value, frozenset | set | tuple):
        return sorted(value, key=str)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True)
    return str(value)


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **details}}
