"""The authorization hook's vocabulary: what a command asks (`Authorization`), what the hook
answers (`Allow`, `Deny`, `Narrow`). docs/authorization.md says how a deployment names its hook."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from runtime.domain import Principal

FORBIDDEN_BY_POLICY = "forbidden_by_policy"


class AccessKind(StrEnum):
    """What a command does to its resource, so a hook need not know every command's name."""

    CREATE = "create"  # a new thread (thread.create, thread.open of a new client id)
    READ = "read"  # snapshots, queued items, subscribing and presence, opening a client thread
    LIST = "list"  # lists across threads: thread.list, actions.list, actions.subscribe
    WRITE = "write"  # every command that changes a thread (send, resume, stop, rename, …)
    ADMIN = "admin"  # tokens, schedules, webhooks
    SESSION = "session"  # the caller's own session: me, ping, unsubscribes


@dataclass(frozen=True)
class ThreadResource:
    """The thread a command names, as committed (or, for a creation, as it would be)."""

    id: str | None  # None: a thread.create whose id the store has not chosen yet
    scope: str
    owner: str | None  # the creator's subject; None for threads created before owners
    metadata: Mapping[str, Any] = field(default_factory=dict)  # public metadata only


@dataclass(frozen=True)
class Authorization:
    """One command, asked once before it has any effect, on every transport.

    `thread` is the thread a thread-bound command names (None for lists, administration and
    session commands, and for a thread id the caller's scopes do not hold: that command is
    refused `not_found` before the hook is asked). `transport` is where the command came from
    (`http`, `websocket`, …) for hooks that log; it never changes what a command means.
    """

    principal: Principal
    command: str
    action: AccessKind
    thread: ThreadResource | None = None
    transport: str | None = None

    @property
    def subject(self) -> str:
        return self.principal.subject

    @property
    def thread_id(self) -> str | None:
        return None if self.thread is None else self.thread.id

    @property
    def owner(self) -> str | None:
        return None if self.thread is None else self.thread.owner

    @property
    def metadata(self) -> Mapping[str, Any]:
        return {} if self.thread is None else self.thread.metadata


@dataclass(frozen=True)
class ThreadMatch:
    """Threads whose owner is `owner` (when given) and whose public metadata holds every key
    of `metadata` at that string value. No condition at all matches every thread."""

    owner: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = [
            k for k, v in self.metadata.items() if not isinstance(k, str) or not isinstance(v, str)
        ]
        if bad:
            raise TypeError(f"ThreadMatch metadata must map strings to strings: {bad!r}")

    def matches(self, thread: ThreadResource) -> bool:
        if self.owner is not None and thread.owner != self.owner:
            return False
        return all(thread.metadata.get(key) == value for key, value in self.metadata.items())


@dataclass(frozen=True)
class Allow:
    """The command runs, under the scope and permission rules it has anyway."""


@dataclass(frozen=True)
class Deny:
    """The command is refused before any effect: HTTP 403, a websocket `error` frame, with
    `code` (default `forbidden_by_policy`) and `message`."""

    message: str = "the deployment's authorization policy refuses this"
    code: str = FORBIDDEN_BY_POLICY


@dataclass(frozen=True)
class Narrow:
    """Only threads matching one of `any_of` (none: no thread at all). A list keeps those (the
    store applies the filter, so pages and cursors stay exact); a command on one thread runs if
    that thread matches and is refused like a `Deny` if not."""

    any_of: tuple[ThreadMatch, ...] = ()
    message: str = "the deployment's authorization policy does not let you see this thread"

    def matches(self, thread: ThreadResource) -> bool:
        return any(match.matches(thread) for match in self.any_of)


Decision = Allow | Deny | Narrow
AuthorizeHook = Callable[[Authorization], "Decision | Awaitable[Decision]"]


def load_authorize_hook(spec: str) -> AuthorizeHook:
    """Load `module:attribute` (THREADLINE_AUTHORIZE): a callable taking an `Authorization`
    and answering a decision, or awaiting one."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"authorization hook {spec!r} must look like 'module:callable'")
    hook: Any = importlib.import_module(module_name)
    for name in attr.split("."):
        hook = getattr(hook, name)
    if not callable(hook):
        raise TypeError(f"authorization hook {spec} is not callable")
    checked: AuthorizeHook = hook
    return checked


def allow_all(request: Authorization) -> Decision:
    """The default hook: every command keeps today's scope and permission rules."""
    return Allow()


__all__ = [
    "FORBIDDEN_BY_POLICY",
    "AccessKind",
    "Allow",
    "Authorization",
    "AuthorizeHook",
    "Decision",
    "Deny",
    "Narrow",
    "ThreadMatch",
    "ThreadResource",
    "allow_all",
    "load_authorize_hook",
]
