"""`/readyz`: whether this process can serve now (storage, bus, migrations), and why not."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.protocol.responses import JSONResponse

# Each check is bounded: a load balancer's probe must get an answer, not a hang.
CHECK_TIMEOUT = 2.0
PROBE_CHANNEL = "threadline:readyz"


async def _storage(store: Any) -> str | None:
    await store.db_time()
    pending = getattr(store, "pending_migrations", None)
    if pending is not None:
        missing = await pending()
        if missing:
            return f"migrations not applied: {', '.join(missing)} (run `threadline migrate`)"
    return None


async def _bus(bus: Any) -> str | None:
    if not bool(getattr(bus, "healthy", True)):
        return "the bus connection is lost (gateways are polling versions meanwhile)"
    await bus.publish(PROBE_CHANNEL, b"")
    return None


async def check(state: Any) -> dict[str, str]:
    """A reason per component that is not ready ("storage", "bus"); empty when all are."""
    problems: dict[str, str] = {}
    for name, probe in (("storage", _storage), ("bus", _bus)):
        component = getattr(state, "store" if name == "storage" else "bus", None)
        if component is None:
            problems[name] = "not open yet"
            continue
        try:
            reason = await asyncio.wait_for(probe(component), CHECK_TIMEOUT)
        except TimeoutError:
            reason = f"no answer within {CHECK_TIMEOUT:g} s"
        except Exception as exc:
            reason = f"unreachable: {type(exc).__name__}: {exc}"
        if reason is not None:
            problems[name] = reason
    return problems


async def readyz(request: Request) -> Response:
    """`GET /readyz`: 200 `{"status": "ready"}`, or 503 with a reason per failing check."""
    problems = await check(request.app.state)
    if problems:
        return JSONResponse({"status": "unavailable", "reasons": problems}, status_code=503)
    return JSONResponse({"status": "ready", "role": request.app.state.settings.role})
