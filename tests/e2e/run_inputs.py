"""AG-UI `RunAgentInput` bodies, as the e2e tests post them to `/v1/ag-ui`."""

from __future__ import annotations

import uuid
from typing import Any


def agui_input(
    thread_id: str, text: str | None = None, *, run_id: str = "r", **extra: Any
) -> dict[str, Any]:
    """A run on `thread_id` saying `text` (none: no new message); `extra` adds or replaces
    fields (`resume`, `forwardedProps`, ...)."""
    messages = [] if text is None else [{"id": uuid.uuid4().hex, "role": "user", "content": text}]
    return {
        "threadId": thread_id,
        "runId": run_id,
        "state": {},
        "messages": messages,
        "tools": [],
        "context": [],
        "forwardedProps": {},
        **extra,
    }


def approve(action_id: str) -> list[dict[str, Any]]:
    """The `resume` field that approves `action_id`."""
    return [{"interruptId": action_id, "status": "resolved", "payload": {"approved": True}}]
