"""What the store interface takes and returns: write requests and result models."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from runtime.domain import (
    Admission,
    InputPolicy,
    Lease,
    Message,
    NewMessage,
    Part,
    Resolution,
    Run,
    RunStatus,
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


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What `Store.commit` returns: the thread's `version` after the commit, whether the commit
    `admitted` a queued input as a new queued run (a terminal run transition does, when input
    was queued; workers wake up to look for work only then), and whether it `released` the run
    lease (a terminal run transition does, in its transaction: the worker then has no lease left
    to release). A dataclass, not a model: one is built per step commit, on the hot path."""

    version: int
    admitted: bool = False
    released: bool = False


@dataclass(frozen=True, slots=True)
class RunLeaseRenewal:
    """One run lease's part of `renew_run_leases`: the renewed lease, or None when it expired
    or was taken over (the holder must stop at once); and whether the run was asked to stop
    or cancelled meanwhile (a stop signal the bus may have lost)."""

    lease: Lease | None
    stop: bool


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


# --- one act of several commands (AG-UI's `RunAgentInput`), committed whole ---------------


class ResolveOp(BaseModel):
    """Resolve the pending action `action_id` (as `Store.resolve_action`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    action_id: str
    resolution: Resolution
    expected_version: int | None = None


class StopOp(BaseModel):
    """Stop the run `run_id` of the thread (as `Store.request_stop`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    run_id: str


class InputOp(BaseModel):
    """Submit a user message (as `Store.submit_input`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    text: str
    submitted_by: str
    client_request_id: str | None = None
    policy: InputPolicy = InputPolicy.ENQUEUE
    client_tools: tuple[dict[str, Any], ...] = ()


ActOp = ResolveOp | StopOp | InputOp


class ActResult(BaseModel):
    """What `Store.act` committed: the thread's version after it, and each op's own result in
    the order given (`resolved`, `stopped`, `admission`: None without an `InputOp`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    thread_id: str
    version: int
    changed: bool  # False: nothing committed (a duplicate input, a stop only flagged)
    resolved: tuple[ResolveResult, ...] = ()
    stopped: tuple[StopResult, ...] = ()
    admission: Admission | None = None
