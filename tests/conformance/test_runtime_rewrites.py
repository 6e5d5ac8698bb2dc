"""History rewrites as the spec describes them: versioned, metadata read under the admin lease,
and the retry rewrite of a failed or cancelled run through both rewrite phases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from runtime.agent import Agent
from runtime.compose import compose_lifecycle
from runtime.domain import RunStatus, RunTrigger, Visibility
from runtime.errors import Conflict, VersionMismatch
from runtime.lifecycle import (
    AgentLifecycle,
    MetadataPatch,
    PrepareRunDecision,
    RewriteContext,
    RewriteOutcome,
    RunContext,
    StepContext,
)
from runtime.providers.scripted import ScriptedModel, text_response
from tests.conformance.runtime_fixtures import RuntimeFactory
from tests.conformance.runtime_harness import (
    ALICE,
    SCOPE,
    GatedLeases,
    first_text,
    run_of,
    settled,
)
from threadline_wire.chunks import StreamChunk


class Counting(AgentLifecycle):
    """Counts rewrites in public metadata, computing the patch from what it was handed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.observed: list[tuple[str, str | None]] = []

    async def prepare_history_rewrite(self, ctx: RewriteContext) -> MetadataPatch | None:
        count = int(ctx.metadata.get("rewrites", 0))
        self.seen.append((ctx.kind, count))
        return MetadataPatch(public={"rewrites": count + 1})

    async def history_rewritten(self, ctx: RewriteContext, outcome: RewriteOutcome) -> None:
        self.observed.append((outcome.kind, outcome.run_id))


async def test_prepare_history_rewrite_reads_metadata_under_the_admin_lease(
    runtime_for: RuntimeFactory,
) -> None:
    """prepareHistoryRewrite "returns thread metadata patches that commit in the same
    transaction as the history change": computed from metadata read under the admin lease,
    no concurrent rewrite's patch is lost; a stale `expected_version` changes nothing.

    Breaks with: rewrites.rewrite handing the hook `thread = before` (the early read)."""
    lifecycle = Counting()
    rt = await runtime_for(Agent(model=ScriptedModel([text_response("a")]), lifecycle=lifecycle))
    thread_id = await rt.thread()
    await rt.service.send_message(ALICE, thread_id, "q")
    done = await rt.wait_for(thread_id, settled)
    first, second = (m.id for m in done.messages)
    gated = GatedLeases(rt.store)
    rt.service.store = gated
    slow = asyncio.create_task(
        rt.service.set_visibility(ALICE, thread_id, first, Visibility.HIDDEN)
    )
    await asyncio.wait_for(gated.waiting.wait(), 10)
    await rt.service.set_visibility(ALICE, thread_id, second, Visibility.HIDDEN)
    gated.gate.set()
    await slow
    thread = await rt.store.get_thread(thread_id, [SCOPE])
    assert thread.metadata["rewrites"] == 2
    assert lifecycle.seen == [("visibility", 0), ("visibility", 1)]
    with pytest.raises(VersionMismatch):
        await rt.service.set_visibility(
            ALICE, thread_id, first, Visibility.VISIBLE, expected_version=thread.version - 1
        )
    assert (await rt.store.get_thread(thread_id, [SCOPE])).version == thread.version
    await rt.service.set_visibility(
        ALICE, thread_id, first, Visibility.VISIBLE, expected_version=thread.version
    )


async def test_retry_rewrites_a_failed_run_through_both_rewrite_phases(
    runtime_for: RuntimeFactory,
) -> None:
    """ "Regeneration, retry, and stored message-visibility changes use two additional phases":
    retrying a failed run removes its messages, starts a new run (trigger retry) from the same
    input, and runs prepareHistoryRewrite and historyRewritten; a completed run is refused.

    Breaks with: rewrites_tx._retry not executing its `DELETE FROM messages ...`."""
    attempts: list[int] = []

    class Attempts(Counting):
        async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision | None:
            attempts.append(ctx.episode)
            return None

    lifecycle = Attempts()
    model = ScriptedModel([text_response("half"), text_response("whole answer")])
    broken = {"on": True}

    class Breaker:
        def transform_step_stream(
            self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
        ) -> AsyncIterator[StreamChunk]:
            async def run() -> AsyncIterator[StreamChunk]:
                async for chunk in stream:
                    yield chunk
                    if broken["on"]:
                        raise RuntimeError("step broke")

            return run()

    agent = Agent(model=model, lifecycle=compose_lifecycle(lifecycle, Breaker()))
    rt = await runtime_for(agent)
    thread_id = await rt.thread()
    admission = await rt.service.send_message(ALICE, thread_id, "q")
    failed = await rt.wait_status(thread_id, RunStatus.FAILED)
    assert [m.role for m in failed.messages] == ["user", "assistant"]
    broken["on"] = False
    result = await rt.service.retry(ALICE, thread_id, admission.run_id)
    assert result.removed_message_ids == (failed.messages[1].id,)
    done = await rt.wait_for(
        thread_id, lambda s: settled(s) and s.run is not None and s.run.id == result.run_id
    )
    assert run_of(done).status is RunStatus.COMPLETED
    assert [first_text(m) for m in done.messages] == ["q", "whole answer"]
    run = await rt.store.get_run(result.run_id or "")
    assert run.trigger is RunTrigger.RETRY and run.input_message_id == failed.messages[0].id
    assert lifecycle.seen == [("retry", 0)]
    assert lifecycle.observed == [("retry", result.run_id)]
    assert done.thread.metadata["rewrites"] == 1
    with pytest.raises(Conflict):
        await rt.service.retry(ALICE, thread_id, result.run_id)
    assert len(attempts) == 2  # prepare_run ran for the failed run and for its retry
