"""The wire's enumerations: roles, message roles and visibility, tool-part and run states, wait
kinds and input policies, declared once for the server (runtime.domain) and the client."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """Principal role. `backend` and `admin` are trusted actors."""

    USER = "user"
    BACKEND = "backend"
    ADMIN = "admin"


class Visibility(StrEnum):
    VISIBLE = "visible"
    HIDDEN = "hidden"


class MessageRole(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"


class ToolState(StrEnum):
    INPUT_AVAILABLE = "input-available"
    AWAITING_ACTION = "awaiting-action"
    RUNNING = "running"
    OUTPUT_AVAILABLE = "output-available"
    OUTPUT_ERROR = "output-error"
    SKIPPED = "skipped"
    REJECTED = "rejected"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in _FINAL_TOOL_STATES


_FINAL_TOOL_STATES = frozenset(
    {
        ToolState.OUTPUT_AVAILABLE,
        ToolState.OUTPUT_ERROR,
        ToolState.SKIPPED,
        ToolState.REJECTED,
        ToolState.CANCELLED,
    }
)


class WaitKind(StrEnum):
    APPROVAL = "approval"
    CLIENT_TOOL = "client-tool"
    MANUAL_RESULT = "manual-result"


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)

    @property
    def is_active(self) -> bool:
        return not self.is_terminal


class InputPolicy(StrEnum):
    ENQUEUE = "enqueue"
    REJECT = "reject"
    INTERRUPT = "interrupt"


__all__ = [
    "InputPolicy",
    "MessageRole",
    "Role",
    "RunStatus",
    "ToolState",
    "Visibility",
    "WaitKind",
]
