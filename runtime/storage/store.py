"""The durable store interface: source of truth for threads, messages, runs, queue and leases."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from runtime.domain import (
    Admission,
    InboxEntry,
    InputPolicy,
    Lease,
    Message,
    MessageRole,
    NewMessage,
    Part,
    Principal,
    QueuedItem,
    Resolution,
    Role,
    Run,
    RunStatus,
    Snapshot,
    Thread,
    Visibility,
)

Scopes = Collection[str]


class AdmissionLimits(BaseModel):
    """Bounds checked atomically with queue admission; None: unbounded."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    queue_max_items: int | None = None
    queue_max_bytes: int | None = None
    # Active runs (queued or running) of the thread's scope, counted when a new run starts.
    scope_max_active_runs: int | None = None
    retry_after: float = 5.0


class TailUpdate(BaseModel):
    """Replace the parts of the thread's tail message. Rejected unless `message_id` is the tail."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    message_id: str
    parts: tuple[Part, ...]


class RunChange(BaseModel):
    """A guarded run transition committed with a fenced write."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    status: RunStatus
    error: str | None = None


class StepCommit(BaseModel):
    """Everything one fenced runtime write changes, committed in one transaction.

    Order inside the transaction: tail update, appends, run transition, queue admission.
    A terminal run transition admits the thread's next queued item (a new user message and a new
    queued run) in the same transaction when `admit_next` is set.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    update_tail: TailUpdate | None = None
    append: tuple[NewMessage, ...] = ()
    run: RunChange | None = None
    # Stored on the run: chunks below it are part of committed state (clients drop them).
    next_seq: int | None = None
    admit_next: bool = True


class Truncate(BaseModel):
    """Regenerate: delete `from_message_id` and every later message, then start a new run
    from the last remaining user message (in the same transaction).

    `expected_version` (on every rewrite op): when set, the rewrite commits only if the thread
    is still at that version, so metadata patches computed from what was read cannot be lost."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    from_message_id: str
    started_by: str
    expected_version: int | None = None


class SetVisibility(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    message_id: str
    visibility: Visibility
    expected_version: int | None = None


class RetryRun(BaseModel):
    """Retry: the thread's latest run, failed or cancelled, is answered again: its messages are
    deleted and a new run starts from the same input message (in the same transaction)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    run_id: str
    started_by: str
    expected_version: int | None = None


RewriteOp = Truncate | SetVisibility | RetryRun


class RewriteResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    thread_id: str
    version: int
    run_id: str | None = None
    removed_message_ids: tuple[str, ...] = ()


class ResolveResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    thread_id: str
    version: int
    run_id: str | None
    # True when this resolution was the last pending one of the run: the run is runnable again.
    run_resumed: bool


class CommitVersion(int):
    """What `Store.commit` returns: the thread's version after the commit (an `int`, used as
    one), whether the commit `admitted` a queued input as a new queued run (a terminal run
    transition does, when input was queued; workers wake up to look for work only then), and
    whether it `released` the run lease (a terminal run transition does, in its transaction:
    the worker then has no lease left to release)."""

    admitted: bool
    released: bool

    def __new__(cls, version: int, admitted: bool = False, released: bool = False) -> CommitVersion:
        value = super().__new__(cls, version)
        value.admitted = admitted
        value.released = released
        return value


def commit_admitted(version: int) -> bool:
    """Whether a commit that returned `version` admitted a queued input; True when it cannot
    tell (a `Store.commit` that returns a plain `int`), so no admitted run waits for a poll."""
    return version.admitted if isinstance(version, CommitVersion) else True


def commit_released(version: int) -> bool:
    """Whether a commit that returned `version` released its run lease; False when it cannot
    tell (a plain `int`), so the worker releases the lease itself (a release of a lease that
    is gone deletes nothing)."""
    return version.released if isinstance(version, CommitVersion) else False


class HistoryRead(BaseModel):
    """Messages of a thread from a position on, with the thread's history epoch: +1 on every
    history rewrite, so messages before the tail read earlier are still current while it stays
    the same (appends add positions; only the tail is ever updated otherwise)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    epoch: int
    messages: tuple[Message, ...]


class StartedRun(BaseModel):
    """What `start_episode` did: the run before and after it, the thread's version after it,
    and the thread."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    before: Run
    run: Run
    version: int
    thread: Thread


class EpisodeStart(StartedRun):
    """What `begin_episode` read and did in one transaction: `StartedRun`, and the thread's
    messages from a position on."""

    history: HistoryRead


class RunStart(BaseModel):
    """What `start_run` did: the run lease, `started` where the episode was started with it
    (None: the caller starts it, `begin_episode`), and `history` where the thread's messages
    were read with the start (None: not read)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    lease: Lease
    started: StartedRun | None = None
    history: HistoryRead | None = None


class StopResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    thread_id: str
    version: int
    run_id: str
    status: RunStatus


class Store(Protocol):
    """One async interface implemented by `SqliteStore` and `PostgresStore`.

    Rules every implementation enforces itself (callers cannot break them):
    - every committed change bumps the thread's version by exactly one and returns it;
    - methods taking `scopes` find nothing outside them (`NotFound`, same as an unknown id);
    - fenced writes (`lease`) fail with `LeaseLost`, changing nothing, when the lease expired by
      the database clock or a newer token exists for the resource;
    - tail-message invariant: only the tail is updated; nothing is appended after a tail that
      still holds a pending action; input during an active run is queued, never appended;
    - transient connection errors are retried with backoff, each retry counted.
    """

    # lifecycle
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def migrate(self) -> list[str]: ...

    # threads and snapshots
    async def create_thread(
        self,
        scope: str,
        title: str = "",
        metadata: dict[str, Any] | None = None,
        private_metadata: dict[str, Any] | None = None,
        *,
        thread_id: str | None = None,
    ) -> Thread: ...
    async def get_thread(self, thread_id: str, scopes: Scopes) -> Thread: ...
    async def list_threads(self, scopes: Scopes, limit: int = 100) -> list[Thread]: ...
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

    async def thread_versions(self, thread_ids: Sequence[str]) -> dict[str, int]: ...

    # input and queue admission
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

    # runs (internal: the worker is not a principal)
    async def get_run(self, run_id: str) -> Run: ...
    async def active_run(self, thread_id: str) -> Run | None: ...
    async def find_runnable_runs(self, limit: int = 10) -> list[Run]: ...
    async def list_messages(
        self, thread_id: str, up_to_position: int | None = None
    ) -> list[Message]: ...
    async def message_authors(self, thread_id: str, message_ids: Sequence[str]) -> dict[str, str]:
        """The author of each message of `message_ids` in the thread (the permission policy's
        `author`): who started the run that wrote it, or submitted it (a user message)."""
        ...

    async def read_history(self, thread_id: str, from_position: int = 0) -> HistoryRead:
        """Messages at `from_position` and after, and the history epoch (`HistoryRead`);
        `NotFound` for an unknown thread."""
        ...

    async def request_stop(self, thread_id: str, scopes: Scopes, run_id: str) -> StopResult: ...

    # leases (database clock)
    async def acquire_run_lease(self, run_id: str, owner: str, ttl: float) -> Lease | None: ...
    async def acquire_admin_lease(self, thread_id: str, owner: str, ttl: float) -> Lease | None: ...
    async def renew_lease(self, lease: Lease, ttl: float) -> Lease: ...
    async def release_lease(self, lease: Lease) -> None: ...
    async def start_run(
        self,
        run_id: str,
        owner: str,
        ttl: float,
        *,
        thread_id: str | None = None,
        history_from: int = 0,
    ) -> RunStart | None:
        """`acquire_run_lease`, and `start_episode` with it where the backend does both in one
        round trip (Postgres: `RunStart.started`); None when no lease was granted. Where
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

    # fenced runtime writes
    async def commit(self, lease: Lease, commit: StepCommit) -> int:
        """The fenced step commit; returns the thread's version after it, a `CommitVersion`
        where the store says whether a terminal transition admitted queued input. A terminal
        transition also releases the run lease, in the same transaction: later writes under
        it fail with `LeaseLost`."""
        ...

    # pending actions
    async def resolve_action(
        self,
        thread_id: str,
        scopes: Scopes,
        action_id: str,
        resolution: Resolution,
        expected_version: int | None = None,
    ) -> ResolveResult: ...
    async def pending_actions(
        self,
        scopes: Scopes,
        *,
        limit: int = 100,
        after: str | None = None,
        thread_ids: Sequence[str] | None = None,
    ) -> list[InboxEntry]: ...
    async def thread_scopes(self, thread_ids: Sequence[str]) -> dict[str, str]: ...

    # history rewrites (admin lease)
    async def rewrite_history(
        self,
        lease: Lease,
        op: RewriteOp,
        public_patch: dict[str, Any] | None = None,
        private_patch: dict[str, Any] | None = None,
    ) -> RewriteResult: ...

    # principals
    async def create_token(
        self,
        token_hash: str,
        subject: str,
        role: Role,
        scopes: Collection[str],
        expires_in: float | None = None,
        display_name: str | None = None,
    ) -> None: ...
    async def principal_for_token(self, token_hash: str) -> Principal | None:
        """The principal of a token that exists, is not revoked and has not expired."""
        ...

    async def revoke_token(self, token_hash: str) -> bool: ...
    async def token_expires_in(self, token_hash: str) -> float | None:
        """Seconds until the token expires by the database clock; None if it never does."""
        ...

    async def db_time(self) -> float: ...


__all__ = [
    "CommitVersion",
    "EpisodeStart",
    "HistoryRead",
    "MessageRole",
    "ResolveResult",
    "RewriteResult",
    "RunChange",
    "RunStart",
    "Scopes",
    "SetVisibility",
    "StartedRun",
    "StepCommit",
    "StopResult",
    "Store",
    "TailUpdate",
    "Truncate",
    "commit_admitted",
    "commit_released",
]
