"""The transaction function of an act: resolutions, stops and a user message, committed whole."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from runtime.domain import Admission
from runtime.storage.sql import actions_tx, queue_tx, runs_tx
from runtime.storage.sql.core import Conn, lock_thread
from runtime.storage.store import (
    ActOp,
    ActResult,
    AdmissionLimits,
    InputOp,
    ResolveOp,
    ResolveResult,
    StopResult,
)


async def act(
    conn: Conn,
    thread_id: str,
    scopes: Collection[str],
    ops: Sequence[tuple[ActOp, str]],
    limits: AdmissionLimits | None,
) -> ActResult:
    """Each op through the transaction function its own store method runs, in order, on one
    connection: a refusal raises out of the transaction, so none of them commits. `ops` pairs
    each op with its client tools already encoded (empty for ops other than `InputOp`)."""
    # The thread lock first, as every write on a thread: concurrent acts on the same action are
    # ordered by it, and the later one sees the earlier one's resolution (its `conflict`).
    thread = await lock_thread(conn, thread_id, scopes)
    start = int(thread["version"])
    resolved: list[ResolveResult] = []
    stopped: list[StopResult] = []
    admission: Admission | None = None
    for op, tools_json in ops:
        if isinstance(op, ResolveOp):
            resolved.append(
                await actions_tx.resolve(
                    conn, thread_id, scopes, op.action_id, op.resolution, op.expected_version
                )
            )
        elif isinstance(op, InputOp):
            admission = await queue_tx.submit_input(
                conn,
                thread_id,
                scopes,
                text=op.text,
                submitted_by=op.submitted_by,
                client_request_id=op.client_request_id,
                policy=op.policy,
                tools_json=tools_json,
                limits=limits,
            )
        else:
            stopped.append(await runs_tx.request_stop(conn, thread_id, scopes, op.run_id))
    # `bump` moves the version at most once per transaction, whichever op asked first.
    version = conn.bumped.get(thread_id, start)
    return ActResult(
        thread_id=thread_id,
        version=version,
        changed=thread_id in conn.bumped,
        resolved=tuple(r.model_copy(update={"version": version}) for r in resolved),
        stopped=tuple(s.model_copy(update={"version": version}) for s in stopped),
        admission=None if admission is None else _at(admission, version),
    )


def _at(admission: Admission, version: int) -> Admission:
    # A duplicate reports the version it was admitted at; anything else the act's.
    return admission if admission.duplicate else admission.model_copy(update={"version": version})
