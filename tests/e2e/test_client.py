"""The Python client (threadline_client) against real processes: two gateways, a worker,
Postgres and Redis. Nothing of Threadline is mocked."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from pydantic import BaseModel

from tests.e2e import cluster, harness
from tests.services import require_postgres, require_redis
from threadline_client import (
    ActionConflict,
    Conflict,
    Forbidden,
    InvalidPayload,
    NotFound,
    Snapshot,
    SyncThreadlineClient,
    ThreadlineClient,
    ThreadWatch,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
RUN_TIMEOUT = 30.0


class Approval(BaseModel):
    approved: bool
    note: str | None = None


@dataclass
class Setup:
    cluster: cluster.Cluster
    tokens: dict[str, str]

    def gateway(self, index: int) -> harness.ServerHandle:
        return self.cluster.gateways[index]

    def client(self, name: str, index: int = 0) -> ThreadlineClient:
        return ThreadlineClient(self.gateway(index).url, self.tokens[name])


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    require_postgres()
    require_redis()
    with cluster.cluster(
        ["gateway", "gateway", "worker"], extra={"THREADLINE_DEMO_DELAY_MS": "20"}
    ) as running:
        tokens = running.tokens(
            {
                "alice": ("alpha", "user", "alice"),
                "svc": ("alpha", "backend", "svc"),
                "carol": ("beta", "user", "carol"),
            }
        )
        yield Setup(running, tokens)


def done(watch: ThreadWatch) -> bool:
    snapshot = watch.snapshot
    return (
        watch.settled
        and snapshot is not None
        and snapshot.run is not None
        and snapshot.run.status in ("completed", "waiting")
        and not snapshot.queue
    )


def held(watch: ThreadWatch) -> Snapshot:
    """The watch's snapshot, there once any predicate below has held."""
    assert watch.snapshot is not None
    return watch.snapshot


def done_at(version: int) -> Callable[[ThreadWatch], bool]:
    """`done` at or after `version`."""
    return lambda w: done(w) and held(w).version >= version


async def test_threads_send_is_idempotent_and_regenerate_and_stop_answer(setup: Setup) -> None:
    async with setup.client("alice") as tl:
        created = await tl.create_thread("client", metadata={"k": 1})
        thread_id = created.thread.id
        assert created.thread.metadata == {"k": 1}
        assert thread_id in [t.id for t in (await tl.list_threads()).threads]
        first = await tl.send(thread_id, "hello", client_request_id="req-1")
        again = await tl.send(thread_id, "hello", client_request_id="req-1")
        assert again.duplicate and (again.run_id, again.message_id) == (
            first.run_id,
            first.message_id,
        )
        async with tl.watch(thread_id) as watch:
            await watch.until(done, RUN_TIMEOUT)
        assert held(watch).assistant_text() == "You said: hello"
        assert [m.role for m in held(watch).messages] == ["user", "assistant"]
        regenerated = await tl.regenerate(thread_id)
        stopped = await tl.stop(thread_id, regenerated.run_id)
        assert stopped.run_id == regenerated.run_id
        with pytest.raises(NotFound):
            await tl.snapshot("thr_does_not_exist")
    async with setup.client("carol") as other:
        with pytest.raises(NotFound):  # another scope's thread is not found, never forbidden
            await other.snapshot(thread_id)


async def test_resume_raises_typed_errors_and_names_the_winner(setup: Setup) -> None:
    async with setup.client("alice") as alice, setup.client("svc", 1) as svc:
        thread_id = (await alice.create_thread("approval")).thread.id
        await alice.send(thread_id, "please email bob@example.com the minutes")
        async with alice.watch(thread_id) as watch:
            await watch.until(lambda w: done(w) and bool(held(w).pending_actions), RUN_TIMEOUT)
        (action,) = held(watch).pending_actions
        assert action.tool_name == "send_email" and "approved" in action.payload_schema["required"]
        with pytest.raises(InvalidPayload) as invalid:
            await svc.resume(action, {"approved": "maybe"}, thread_id=thread_id)
        assert invalid.value.errors and invalid.value.errors[0]["loc"] == ["approved"]
        with pytest.raises(Forbidden):  # manual results are for trusted roles only
            await alice.submit_result(action, output="x", thread_id=thread_id, manual=True)
        answer = await svc.resume(action, Approval(approved=True, note="ok"), thread_id=thread_id)
        assert answer.version > held(watch).version
        with pytest.raises(ActionConflict) as conflict:
            await alice.resume(action.id, {"approved": False}, thread_id=thread_id)
        assert conflict.value.resolved_by == "svc" and conflict.value.status == 409


async def test_watch_survives_a_redis_client_kill_and_a_gateway_restart(setup: Setup) -> None:
    text = " ".join(f"word{i:03d}" for i in range(120))  # ~200 pieces, about 4 s of streaming
    async with setup.client("alice", 1) as tl:
        thread_id = (await tl.create_thread("outages")).thread.id
        async with tl.watch(thread_id) as watch:
            await watch.until(lambda w: w.snapshot is not None and w.settled)
            sent = await tl.send(thread_id, text)
            await watch.until(lambda w: len(w.state.live_text()) > 40, RUN_TIMEOUT)
            pids = [p.process.pid for p in setup.cluster.processes]
            killed = await cluster.kill_redis_clients(pids, ("-pubsub", "-cmd"))
            assert len(killed) >= len(pids), killed
            # Then the watched gateway itself goes away and comes back on the same port.
            gateway = setup.gateway(1)
            seen_before = watch.connections
            await asyncio.to_thread(gateway.stop)
            setup.cluster.processes.remove(gateway)
            restarted = await asyncio.to_thread(
                harness.start, "gateway", gateway.env, gateway.port, log_dir=setup.cluster.log_dir
            )
            setup.cluster.processes.append(restarted)
            await watch.until(lambda w: w.connections > seen_before, RUN_TIMEOUT)
            await watch.until(done, RUN_TIMEOUT)
            final = await tl.snapshot(thread_id)
            await watch.until(lambda w: w.settled and w.snapshot == final, RUN_TIMEOUT)
        kinds = {event.kind for event in list(watch._events)}
    assert final.run is not None and final.run.id == sent.run_id
    assert final.run.status == "completed"
    assert final.assistant_text() == f"You said: {text}"
    assert watch.state.live_text() == ""  # nothing live left on top of the committed state
    assert "disconnected" in kinds and watch.fetches >= 2


def test_the_sync_wrapper_from_plain_code(setup: Setup) -> None:
    with SyncThreadlineClient(setup.gateway(0).url, setup.tokens["alice"]) as tl:
        assert tl.me().subject == "alice"
        thread_id = tl.create_thread("sync").thread.id
        tl.send(thread_id, "from a script")
        final = tl.wait(
            thread_id, lambda s: s.run is not None and s.run.status == "completed", RUN_TIMEOUT
        )
        assert isinstance(final, Snapshot)
        assert final.assistant_text() == "You said: from a script"
        assert tl.snapshot(thread_id) == final


def run_status(status: str, run_id: str | None = None) -> Callable[[ThreadWatch], bool]:
    """Settled with the run in `status` (and, given `run_id`, that run)."""

    def holds(watch: ThreadWatch) -> bool:
        snapshot = watch.snapshot
        return (
            watch.settled
            and snapshot is not None
            and snapshot.run is not None
            and snapshot.run.status == status
            and run_id in (None, snapshot.run.id)
        )

    return holds


async def test_retry_restarts_a_stopped_run_and_history_pages_back(setup: Setup) -> None:
    async with setup.client("alice") as tl:
        thread_id = (await tl.create_thread("retry and pages")).thread.id
        async with tl.watch(thread_id) as watch:
            for word in ("one", "two", "three"):
                sent = await tl.send(thread_id, word)
                # Done at or after the send's version: the watch may not have seen it yet, and
                # the previous run's completion must not pass for this one's.
                await watch.until(done_at(sent.version), RUN_TIMEOUT)
            with pytest.raises(Conflict):  # a completed run is not retried
                await tl.retry(thread_id)
            long = " ".join(f"w{i}" for i in range(300))  # 300 chunks: seconds to stream
            admission = await tl.send(thread_id, long)
            assert admission.run_id is not None
            await tl.stop(thread_id, admission.run_id)
            await watch.until(run_status("cancelled"), RUN_TIMEOUT)
            retried = await tl.retry(thread_id)
            assert retried.run_id != admission.run_id
            await watch.until(run_status("completed", retried.run_id), RUN_TIMEOUT)
        whole = await tl.snapshot(thread_id, limit=500)
        assert whole.page is not None and whole.page.before is None
        assert whole.messages[-1].text == f"You said: {long}"
        assert [m.text for m in whole.messages if m.role == "user"] == ["one", "two", "three", long]
        # Pages of 3, newest first, back to the first message; together the whole thread.
        pages = [page async for page in tl.pages(thread_id, page_size=3)]
        assert [len(p.messages) for p in pages] == [3, 3, 2]
        assert pages[0].messages == whole.messages[-3:]
        assert await tl.history(thread_id, page_size=3) == whole.messages
    with SyncThreadlineClient(setup.gateway(1).url, setup.tokens["alice"]) as sync:
        assert [len(p.messages) for p in sync.pages(thread_id, page_size=3)] == [3, 3, 2]
        assert sync.history(thread_id, page_size=5) == whole.messages
        with pytest.raises(Conflict):
            sync.retry(thread_id)
