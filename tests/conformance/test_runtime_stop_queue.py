"""A send queued behind a run waiting on an approval, then the run stopped (the campaign's
"lost send" of issue 34): the acknowledged send is committed exactly once, as the next run's
input (docs/protocol.md, "Runs and history": a stopped waiting run is finalised by a worker, and
the commit that ends a run admits the queued input). These pass on the code the campaign ran:
its lost sends were commits its Postgres dropped in a crash restart (tests/servers.py,
tests/campaign/test_crash_durability.py); this keeps the server's side of the promise proven.

Breaks with: `runs_tx.commit` not calling `admit_next` (every case: the item stays queued)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.domain import MessageRole, RunStatus, Snapshot
from runtime.providers.scripted import ScriptedModel, text_response, tool_call_response
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import (
    ALICE,
    BOB,
    SCOPE,
    Runtime,
    first_text,
    run_of,
    settled,
)
from tests.conformance.test_runtime_actions import Recording, transfer_agent


def _user_texts(snapshot: Snapshot) -> list[str]:
    return [first_text(m) for m in snapshot.messages if m.role is MessageRole.USER]


async def _waiting_with_a_queued_send(rt: Runtime) -> tuple[str, str, str]:
    thread_id = await rt.thread()
    admission = await rt.service.send_message(ALICE, thread_id, "pay")
    assert admission.run_id is not None
    await rt.wait_status(thread_id, RunStatus.WAITING)
    queued = await rt.service.send_message(BOB, thread_id, "and then")
    assert queued.queued_item_id is not None and queued.run_id is None
    return thread_id, admission.run_id, queued.queued_item_id


async def test_a_send_queued_behind_a_waiting_run_survives_its_stop(
    runtime_for: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [tool_call_response("transfer", {"amount": 1}, "t1"), text_response("after the stop")]
    )
    rt = await runtime_for(transfer_agent(model, Recording()))
    thread_id, run_id, _ = await _waiting_with_a_queued_send(rt)
    stop = await rt.service.stop_run(ALICE, thread_id, run_id)
    assert stop.status is RunStatus.WAITING
    snapshot = await rt.wait_for(thread_id, lambda s: settled(s) and run_of(s).id != run_id)
    assert _user_texts(snapshot) == ["pay", "and then"]
    assert snapshot.queue == ()
    stopped = await rt.store.get_run(run_id)
    assert stopped.status is RunStatus.CANCELLED


# How the stop meets the action's resolution: the stop alone; the stop with no worker up (the
# next worker to start finalises it); a resume or a deny racing the stop; a resume just before
# the stop (the run resumed, then stopped while running).
ORDERS = ("stop", "stop-no-worker", "stop-and-resume", "stop-and-deny", "resume-then-stop")


@pytest.mark.parametrize("order", ORDERS)
async def test_a_queued_send_is_kept_once_whatever_the_stop_races(
    runtime_for: RuntimeFactory, order: str
) -> None:
    model = ScriptedModel(
        [
            tool_call_response("transfer", {"amount": 1}, "t1"),
            text_response("one"),
            text_response("two"),
        ]
    )
    rt = await runtime_for(transfer_agent(model, Recording()))
    thread_id, run_id, _ = await _waiting_with_a_queued_send(rt)
    snapshot = await rt.store.snapshot(thread_id, [SCOPE])
    action = snapshot.pending_actions[0]
    if order == "stop-no-worker":
        for worker in rt.workers:
            await worker.stop()
        rt.workers.clear()
    if order in ("stop", "stop-no-worker"):
        await rt.service.stop_run(ALICE, thread_id, run_id)
    elif order == "resume-then-stop":
        await rt.service.resume_action(BOB, thread_id, action.id, {"approved": True})
        await rt.service.stop_run(ALICE, thread_id, run_id)
    else:
        approved = order == "stop-and-resume"
        await asyncio.gather(
            rt.service.stop_run(ALICE, thread_id, run_id),
            rt.service.resume_action(BOB, thread_id, action.id, {"approved": approved}),
            return_exceptions=True,
        )
    if not rt.workers:
        await rt.start_worker()
    snapshot = await rt.wait_for(thread_id, lambda s: settled(s) and run_of(s).id != run_id)
    assert _user_texts(snapshot) == ["pay", "and then"]
    assert snapshot.queue == ()
