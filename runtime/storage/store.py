"""The durable store interface, split by concern: each caller asks for the part it uses.

`Store` is the composition every backend (`SqliteStore`, `PostgresStore`) implements. Rules
every implementation enforces itself (callers cannot break them):
- every committed change bumps the thread's version by exactly one and returns it;
- methods taking `scopes` find nothing outside them (`NotFound`, same as an unknown id);
- fenced writes (`lease`) fail with `LeaseLost`, changing nothing, when the lease expired by
  the database clock or a newer token exists for the resource;
- tail-message invariant: only the tail is updated; nothing is appended after a tail that
  still holds a pending action; input during an active run is queued, never appended;
- transient connection errors are retried with backoff, each retry counted.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

from runtime.approvals import Reassignment
from runtime.authorization import ThreadMatch
from runtime.domain import (
    Admission,
    InboxEntry,
    InputPolicy,
    Lease,
    Message,
    Origin,
    Principal,
    QueuedItem,
    Resolution,
    Role,
    Run,
    Snapshot,
    Thread,
)
from runtime.storage.store_models import (
    ActOp,
    ActResult,
    AdmissionLimits,
    CommitResult,
    EpisodeStart,
    HistoryRead,
    InputOp,
    ResolveOp,
    ResolveResult,
    RetryRun,
    RewriteOp,
    RewriteResult,
    RunChange,
    RunLeaseRenewal,
    RunStart,
    Scopes,
    SetVisibility,
    StartedRun,
    StepCommit,
    StopOp,
    StopResult,
    TailUpdate,
    Truncate,
)
from runtime.storage.thread_query import ThreadQuery


class StoreLifecycle(Protocol):
    """Opening, closing and migrating the database (`async with` opens and closes too)."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def migrate(self) -> list[str]: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class ThreadIndex(Protocol):
    """Batched lookups by thread id with no scope check (internal callers only: the worker's
    per-scope announcements, the gateways' version polls and the action inbox)."""

    async def thread_versions(self, thread_ids: Sequence[str]) -> dict[str, int]: ...
    async def thread_scopes(self, thread_ids: Sequence[str]) -> dict[str, str]: ...


class ThreadStore(ThreadIndex, Protocol):
    """Threads and their snapshots, as a principal with `scopes` sees them."""

    async def create_thread(
        self,
        scope: str,
        title: str = "",
        metadata: dict[str, Any] | None = None,
        private_metadata: dict[str, Any] | None = None,
        *,
        thread_id: str | None = None,
        owner: str | None = None,
    ) -> Thread:
        """A new thread; `owner` is the creating principal's subject (kept as committed state,
        shown in snapshots and lists; None: no owner)."""
        ...

    async def get_thread(self, thread_id: str, scopes: Scopes) -> Thread: ...
    async def thread_version(self, thread_id: str, scopes: Scopes) -> int:
        """The thread's version: what `get_thread` would say of it, in one indexed read;
        `NotFound` outside `scopes` exactly as for an unknown id."""
        ...

    async def rename_thread(self, thread_id: str, scopes: Scopes, title: str) -> Thread:
        """Set the thread's title: a change like any other, so one version more (the thread
        returned has it); `InvalidInput`/`TooLarge` for a title creation would refuse."""
        ...

    async def update_metadata(
        self, thread_id: str, scopes: Scopes, patch: dict[str, Any]
    ) -> Thread:
        """Apply a JSON merge patch (RFC 7396) to the public metadata: a change like any
        other, so one version more; `TooLarge` when the result exceeds the metadata bound."""
        ...

    async def list_threads(
        self, scopes: Scopes, limit: int = 100, query: ThreadQuery | None = None
    ) -> list[Thread]:
        """At most `limit` threads of `scopes` that `query` keeps, by update time (newest
        first) then id; `query.after` pages on (`thread_query.page_cursor`)."""
        ...

    async def snapshot(
        self,
        thread_id: str,
        scopes: Scopes,
        *,
        include_hidden: bool = False,
        message_limit: int | None = None,
        before: int | None = None,
    ) -> Snapshot:
        """`message_limit`: only the last that many messages (before position `before`), with
        `page` set; pending actions, run and queue are whole either way."""
        ...


class MessageStore(Protocol):
    """A thread's messages in position order (internal: no scope check)."""

    async def message_authors(self, thread_id: str, message_ids: Sequence[str]) -> dict[str, str]:
        """The author of each message of `message_ids` in the thread (the permission policy's
        `author`): who started the run that wrote it, or submitted it (a user message)."""
        ...

    async def list_messages(
        self, thread_id: str, up_to_position: int | None = None
    ) -> list[Message]: ...
    async def read_history(self, thread_id: str, from_position: int = 0) -> HistoryRead:
        """Messages at `from_position` and after, and the history epoch (`HistoryRead`);
        `NotFound` for an unknown thread."""
        ...


class QueueStore(Protocol):
    """Input and queue admission: what a user sends becomes a run or waits in the queue."""

    async def submit_input(
        self,
        thread_id: str,
        scopes: Scopes,
        *,
        text: str,
        submitted_by: str,
        client_request_id: str | None = None,
        policy: InputPolicy = InputPolicy.ENQUEUE,
        client_tools: Sequence[dict[str, Any]] = (),
        limits: AdmissionLimits | None = None,
    ) -> Admission: ...
    async def cancel_queued_item(self, thread_id: str, scopes: Scopes, item_id: str) -> int: ...
    async def list_queue(self, thread_id: str) -> list[QueuedItem]: ...


class RunStore(Protocol):
    """Runs by id or thread (internal: the worker is not a principal), and stop requests."""

    async def get_run(self, run_id: str) -> Run: ...
    async def active_run(self, thread_id: str) -> Run | None: ...
    async def find_runnable_runs(self, limit: int = 10) -> list[Run]: ...
    async def request_stop(self, thread_id: str, scopes: Scopes, run_id: str) -> StopResult: ...


class LeaseStore(Protocol):
    """Leases on runs and threads, by the database clock."""

    async def acquire_run_lease(self, run_id: str, owner: str, ttl: float) -> Lease | None: ...
    async def acquire_admin_lease(self, thread_id: str, owner: str, ttl: float) -> Lease | None: ...
    async def renew_lease(self, lease: Lease, ttl: float) -> Lease: ...
    async def renew_run_leases(self, leases: Sequence[Lease], ttl: float) -> list[RunLeaseRenewal]:
        """Renew many run leases at once (a worker's heartbeat: one call, whatever the number
        of its runs), each as `renew_lease` would; the answers in the leases' order,
        each with whether its run was asked to stop or cancelled. A lost lease is an answer
        (`lease` None), not an error."""
        ...

    async def release_lease(self, lease: Lease) -> None: ...
    async def db_time(self) -> float: ...


class EpisodeStore(LeaseStore, Protocol):
    """What an episode does under its run lease: start, then fenced step commits."""

    async def start_run(
        self,
        run_id: str,
        owner: str,
        ttl: float,
        *,
        thread_id: str | None = None,
        history_from: int = 0,
    ) -> RunStart | None:
        """`acquire_run_lease`, and `start_episode` with it where the backend does both at once
        (`RunStart.started`: Postgres in one statement, SQLite in one transaction); None when
        no lease was granted. Where
        `started` is None, the episode is still to be started (`begin_episode`). With
        `thread_id` (the run's thread, as the caller believes), such a start also reads the
        thread's messages from `history_from` on, after it (`RunStart.history`; None when the
        run is not on that thread)."""
        ...

    async def start_episode(self, lease: Lease) -> tuple[Run, int]: ...
    async def begin_episode(self, lease: Lease, history_from: int = 0) -> EpisodeStart:
        """`start_episode` plus the reads an episode starts with (the run as it was, the
        thread, `read_history(history_from)`), in the same transaction: one round trip set
        instead of four."""
        ...

    async def commit(self, lease: Lease, commit: StepCommit) -> CommitResult:
        """The fenced step commit: the thread's version after it and whether a terminal
        transition admitted queued input (`CommitResult`). A terminal transition also releases
        the run lease, in the same transaction: later writes under it fail with `LeaseLost`."""
        ...


class ActionStore(Protocol):
    """Pending actions (approvals, client tools): resolving them and the scope-wide inbox."""

    async def resolve_action(
        self,
        thread_id: str,
        scopes: Scopes,
        action_id: str,
        resolution: Resolution,
        expected_version: int | None = None,
    ) -> ResolveResult: ...
    async def reassign_action(
        self,
        thread_id: str,
        scopes: Scopes,
        action_id: str,
        change: Reassignment,
        origin: Origin | None = None,
    ) -> ResolveResult:
        """Hand a pending approval to another subject or group when its policy permits
        delegation (`runtime.approvals.reassigned`); audited; `run_resumed` is always False."""
        ...

    async def act(
        self,
        thread_id: str,
        scopes: Scopes,
        ops: Sequence[ActOp],
        limits: AdmissionLimits | None = None,
    ) -> ActResult:
        """Resolutions, stops and a user message in one transaction, in the order given, each
        as its own method would (`resolve_action`, `request_stop`, `submit_input` with `limits`):
        a refusal of any (a resolution losing a race, a full queue) commits none of them. The
        version bumps once."""
        ...

    async def pending_actions(
        self,
        scopes: Scopes,
        *,
        limit: int = 100,
        after: str | None = None,
        thread_ids: Sequence[str] | None = None,
        allowed: Sequence[ThreadMatch] | None = None,
    ) -> list[InboxEntry]:
        """`allowed`: an authorization hook's `Narrow.any_of` (None: every thread of `scopes`)."""
        ...


class RewriteStore(Protocol):
    """History rewrites (regenerate, retry, visibility), under a thread's admin lease."""

    async def rewrite_history(
        self,
        lease: Lease,
        op: RewriteOp,
        public_patch: dict[str, Any] | None = None,
        private_patch: dict[str, Any] | None = None,
    ) -> RewriteResult: ...


class TokenStore(Protocol):
    """API tokens, stored by hash: who a token names, until it expires or is revoked."""

    async def create_token(
        self,
        token_hash: str,
        subject: str,
        role: Role,
        scopes: Collection[str],
        expires_in: float | None = None,
        display_name: str | None = None,
        groups: Collection[str] = (),
    ) -> None: ...
    async def principal_for_token(self, token_hash: str) -> Principal | None:
        """The principal of a token that exists, is not revoked and has not expired."""
        ...

    async def live_tokens(self, token_hashes: Collection[str]) -> set[str]:
        """Those of `token_hashes` whose tokens exist, are not revoked and have not expired,
        in one read however many are asked about (a gateway rechecks every open connection's
        token this way)."""
        ...

    async def revocation_count(self) -> int:
        """How many tokens were ever revoked: it grows by one in the transaction that revokes a
        token and never otherwise, so a caller that reads the same count twice knows nothing
        was revoked in between (a gateway rechecks its tokens only when it moved)."""
        ...

    async def token_grant(self, token_hash: str) -> tuple[Principal, float | None] | None:
        """`principal_for_token` and the seconds the token has left by the database clock (None:
        it never expires), in one read: what a cache of principals needs to know."""
        ...

    async def revoke_token(self, token_hash: str) -> bool: ...
    async def token_expires_in(self, token_hash: str) -> float | None:
        """Seconds until the token expires by the database clock; None if it never does."""
        ...


class EngineStore(EpisodeStore, RunStore, MessageStore, ThreadIndex, Protocol):
    """What the worker and its episodes use."""


class Store(
    StoreLifecycle,
    ThreadStore,
    MessageStore,
    QueueStore,
    RunStore,
    EpisodeStore,
    ActionStore,
    RewriteStore,
    TokenStore,
    Protocol,
):
    """Every part together: what `SqliteStore` and `PostgresStore` implement."""


__all__ = [
    "ActOp",
    "ActResult",
    "ActionStore",
    "AdmissionLimits",
    "CommitResult",
    "EngineStore",
    "EpisodeStart",
    "EpisodeStore",
    "HistoryRead",
    "InputOp",
    "LeaseStore",
    "MessageStore",
    "QueueStore",
    "ResolveOp",
    "ResolveResult",
    "RetryRun",
    "RewriteOp",
    "RewriteResult",
    "RewriteStore",
    "RunChange",
    "RunLeaseRenewal",
    "RunStart",
    "RunStore",
    "Scopes",
    "SetVisibility",
    "StartedRun",
    "StepCommit",
    "StopOp",
    "StopResult",
    "Store",
    "StoreLifecycle",
    "TailUpdate",
    "ThreadIndex",
    "ThreadStore",
    "TokenStore",
    "Truncate",
]
