"""`GET /v1/ag-ui/info`: what this AG-UI endpoint supports, as AG-UI's `AgentCapabilities`."""

from __future__ import annotations

from typing import Any

from ag_ui.core import (
    AgentCapabilities,
    HumanInTheLoopCapabilities,
    IdentityCapabilities,
    MultimodalCapabilities,
    MultimodalInputCapabilities,
    StateCapabilities,
    ToolsCapabilities,
    TransportCapabilities,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.protocol.wire_errors import wire_error
from server.transports.http_routes import request_caller
from server.transports.sse.agui_input import SERVER_STATE_KEYS

# Declared next to the rules they describe (agui_input: content and state; agui: connect and
# cancel), and asserted against them by tests/e2e/test_agui.py.
CAPABILITIES = AgentCapabilities(
    identity=IdentityCapabilities(name="threadline", type="threadline"),
    transport=TransportCapabilities(streaming=True, resumable=True),
    tools=ToolsCapabilities(supported=True, client_provided=True),
    state=StateCapabilities(snapshots=True, deltas=True, persistent_state=True),
    multimodal=MultimodalCapabilities(
        input=MultimodalInputCapabilities(
            image=False, audio=False, video=False, pdf=False, file=False
        )
    ),
    human_in_the_loop=HumanInTheLoopCapabilities(supported=True, approvals=True, interrupts=True),
    custom={
        "threadline": {
            # Anything but text in a message's content is refused (422), never dropped.
            "inputContent": ["text"],
            # The shared state is the server's: a client may echo these keys, not set any.
            "clientState": {"writable": False, "serverKeys": sorted(SERVER_STATE_KEYS)},
            # connectAgent(): POST /v1/ag-ui/connect joins the run in flight, read only.
            "connect": "/v1/ag-ui/connect",
            # A resume entry with status "cancelled" stops the interrupt's run.
            "cancelInterrupt": "stops the run",
        }
    },
)


def capabilities() -> dict[str, Any]:
    return CAPABILITIES.model_dump(mode="json", by_alias=True, exclude_none=True)


async def info_endpoint(request: Request) -> Response:
    """Authenticated like every route of the API (it says nothing of any thread)."""
    try:
        await request_caller(request)
    except Exception as exc:
        return wire_error(exc).response()
    return JSONResponse({"protocol": "ag-ui", "capabilities": capabilities()})
