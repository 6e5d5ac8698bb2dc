"""What a run publishes, on every bus: a commit's last chunks go with its invalidation in one bus
operation, after the write, chunks first; a commit that fails still publishes them, alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from realtime.bus import Bus
from realtime.channels import replay_key, thread_channel
from realtime.publish_options import PublishOptions
from runtime.agent import Agent
from runtime.domain import Lease, MessageRole, RunStatus
from runtime.engine.publisher import Publisher
from runtime.engine.worker import Worker
from runtime.providers.scripted import ScriptedModel, text_response
from runtime.service.thread_service import ThreadService
from runtime.storage import SqliteStore
from runtime.storage.store import StepCommit
from tests.conformance.conftest_bus import BACKENDS, open_test_bus, within
from tests.conformance.runtime_harness import ALICE, SCOPE


@pytest.fixture(params=BACKENDS)
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    async with open_test_bus(request.param) as opened:
        yield opened


@dataclass
class Operation:
    """One bus operation of the thread: the chunk types it published, the invalidation
    versions after them, whether it cleared the replay, and the thread's committed version
    when it was sent."""

    chunks: list[str]
    versions: list[int]
    clear: bool
    durable: int


class RecordingBus:
    """The bus, recording each operation on `thread_id` (with the version then committed)."""

    def __init__(self, bus: Bus, store: SqliteStore) -> None:
        self._bus = bus
        self._store = store
        self.thread_id = ""
        self.operations: list[Operation] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def _record(
        self, items: Sequence[bytes], then: Sequence[tuple[str, bytes]], clear: bool
    ) -> None:
        versions = [
            orjson.loads(data)["version"]
            for channel, data in then
            if channel == thread_channel(self.thread_id)
        ]
        if not items and not versions:
            return
        durable = (await self._store.thread_versions([self.thread_id]))[self.thread_id]
        chunks = [orjson.loads(data)["chunk"]["type"] for data in items]
        self.operations.append(Operation(chunks, versions, clear, durable))

    async def publish(
        self, channel: str, data: bytes | Sequence[bytes], options: PublishOptions | None = None
    ) -> None:
        if options is None and isinstance(data, bytes):
            await self._record([], [(channel, data)], False)
        elif options is None:
            await self._record([], [(channel, item) for item in data], False)
        else:
            items = [data] if isinstance(data, bytes) else data
            await self._record(items, options.then, options.clear_replay)
        await self._bus.publish(channel, data, options)

    async def publish_all(
        self, messages: Sequence[tuple[str, bytes]], clear_key: str | None = None
    ) -> None:
        await self._record([], messages, clear_key is not None)
        await self._bus.publish_all(messages, clear_key)


class FailingStepCommit:
    """A store whose first commit of an assistant message fails (before writing anything)."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def commit(self, lease: Lease, commit: StepCommit) -> Any:
        if not self.failed and any(m.role is MessageRole.ASSISTANT for m in commit.append):
            self.failed = True
            raise RuntimeError("the step commit failed")
        return await self._store.commit(lease, commit)


async def _run(bus: Bus, store: Any, recording: RecordingBus) -> tuple[list[dict[str, Any]], Any]:
    """One text run on a new thread: the thread channel's frames and the final snapshot."""
    model = ScriptedModel([text_response("Hello there, friend!", chunks=4)])
    agent = Agent(model=model)
    service = ThreadService(store, Publisher(recording), agent)
    thread_id = (await service.create_thread(ALICE, title="t")).thread.id
    recording.thread_id = thread_id
    frames: list[dict[str, Any]] = []
    async with bus.subscribe(thread_channel(thread_id)) as live:
        worker = Worker(store, recording, agent, lease_ttl=5.0, poll_interval=0.05)  # type: ignore[arg-type]
        await worker.start()
        try:
            await service.send_message(ALICE, thread_id, "hi")

            async def until_ended() -> None:
                async for data in live:
                    frames.append(orjson.loads(data))
                    if frames[-1]["type"] == "invalidate":
                        snapshot = await store.snapshot(thread_id, [SCOPE])
                        if snapshot.thread.version == frames[-1]["version"] and (
                            snapshot.run is not None and snapshot.run.status.is_terminal
                        ):
                            return

            await within(until_ended())
        finally:
            await worker.stop()
    await asyncio.sleep(0.05)
    assert await bus.read_replay(replay_key(thread_id)) == []
    model.assert_consumed()
    return frames, await store.snapshot(thread_id, [SCOPE])


def _kinds(frames: list[dict[str, Any]]) -> list[str]:
    return [f["chunk"]["type"] if f["type"] == "chunk" else "invalidate" for f in frames]


async def test_a_step_commit_publishes_its_last_chunks_with_its_invalidation(
    bus: Bus, tmp_path: Path
) -> None:
    async with SqliteStore(tmp_path / "t.db") as store:
        recording = RecordingBus(bus, store)
        frames, snapshot = await _run(bus, store, recording)
    assert snapshot.run.status is RunStatus.COMPLETED
    # What watchers see: admission, start, the step's chunks, then the step's commit, which
    # (no after_step hook) carries the completion, each chunk once, in seq order.
    kinds = _kinds(frames)
    assert kinds[:2] == ["invalidate", "invalidate"]
    assert kinds[2] == "step-start" and kinds[-2:] == ["step-finish", "invalidate"]
    assert kinds[3:-2] == ["text-delta"] * 4
    chunks = [f for f in frames if f["type"] == "chunk"]
    assert [c["seq"] for c in chunks] == list(range(snapshot.run.next_seq))
    versions = [f["version"] for f in frames if f["type"] == "invalidate"]
    # The admission's invalidation and the worker's first may arrive either way round: two
    # publishers, and the worker's poll can claim the run before the admission's publish
    # returned. The worker's own are in order, and the last is the final version.
    admitted = min(versions)
    worker_versions = [v for v in versions if v != admitted]
    assert versions.count(admitted) == 1 and worker_versions == sorted(worker_versions)
    assert versions[-1] == snapshot.thread.version
    step_version = versions[-1]
    # The step's commit: its last chunks (step-finish at least), its invalidation, the clear,
    # in one operation, sent once the commit was durable.
    (step,) = [op for op in recording.operations if step_version in op.versions]
    assert step.chunks and step.chunks[-1] == "step-finish"
    assert step.versions == [step_version] and step.clear
    assert step.durable >= step_version
    # Every chunk was published once, and every invalidation after its commit.
    published = [kind for op in recording.operations for kind in op.chunks]
    assert published == [k for k in kinds if k != "invalidate"]
    assert all(op.durable >= max(op.versions, default=0) for op in recording.operations)


async def test_a_failed_commit_still_publishes_its_chunks_without_an_invalidation(
    bus: Bus, tmp_path: Path
) -> None:
    async with SqliteStore(tmp_path / "t.db") as opened:
        store = FailingStepCommit(opened)
        recording = RecordingBus(bus, opened)
        frames, snapshot = await _run(bus, store, recording)
    assert store.failed
    assert snapshot.run.status is RunStatus.FAILED
    kinds = _kinds(frames)
    # The failed commit's chunks went out alone; the failure's commit (which holds the step)
    # invalidates once, after them.
    assert kinds[-2:] == ["step-finish", "invalidate"]
    finish = next(op for op in recording.operations if "step-finish" in op.chunks)
    assert finish.versions == [] and not finish.clear
    chunks = [f for f in frames if f["type"] == "chunk"]
    assert [c["seq"] for c in chunks] == list(range(snapshot.run.next_seq))
    assert snapshot.messages[-1].role is MessageRole.ASSISTANT
