"""Best-effort publishing of the runtime's chunks, invalidations and run control signals."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from realtime.bus import Bus
from realtime.bus_metrics import (
    PUBLISH_DURATION,
    PUBLISH_ERRORS,
    PUBLISHED,
    DeferredCounts,
    safe_add,
    safe_record,
)
from realtime.channels import replay_key, scope_channel, thread_channel
from realtime.envelopes import (
    encode_chunk,
    encode_invalidate,
    encode_scope_invalidate,
)
from realtime.publish_options import PublishOptions, Replay
from runtime.engine.control import CONTROL_CHANNEL, encode_stop, encode_wakeup
from runtime.engine.reannounce import Reannouncer
from runtime.engine.trace_links import current_traceparent

log = logging.getLogger(__name__)
# `threadline.realtime.published`, summed per loop turn: two adds per streamed chunk otherwise.
_PUBLISHED = DeferredCounts("kind")


DEFAULT_REPLAY_LIMIT = 2000
# Bytes of one thread's replay buffer (encoded chunk envelopes); the oldest go first.
DEFAULT_REPLAY_MAX_BYTES = 1024 * 1024


class Publisher:
    """What the runtime publishes through. Never raises a bus failure to the runtime.

    Storage is the source of truth: a lost chunk or invalidation costs a client a refetch, while
    a raised error would fail a run whose commits already succeeded. Failures are counted and
    logged once per streak (a dead Redis must not log once per streamed chunk).
    Each method returns whether the bus accepted everything.
    """

    def __init__(
        self,
        bus: Bus,
        replay_limit: int = DEFAULT_REPLAY_LIMIT,
        *,
        replay_max_bytes: int = DEFAULT_REPLAY_MAX_BYTES,
        scope_of: Callable[[str], Awaitable[str | None]] | None = None,
        remember_scope: Callable[[str, str], None] | None = None,
    ) -> None:
        if replay_limit < 1:
            raise ValueError("replay_limit must be at least 1")
        if replay_max_bytes < 1:
            raise ValueError("replay_max_bytes must be at least 1")
        self._bus = bus
        # With `scope_of`, every invalidation is also announced on its scope's channel, for the
        # scope-wide action inbox (one more publish per commit, never per chunk).
        self._scope_of = scope_of
        # Where `scope_of` caches (`ScopeCache.remember`): told the scopes callers know anyway.
        self._remember_scope = remember_scope
        self._replay_limit = replay_limit
        self._replay_max_bytes = replay_max_bytes
        self._failing = False
        self._observers: list[Callable[[str, int], None]] = []
        # Invalidations the bus refused, published again until it takes them.
        self._reannounce = Reannouncer(self._republish)

    def known_scope(self, thread_id: str, scope: str) -> None:
        """The caller read or wrote `thread_id` and knows its scope: its announcements need no
        scope read (`ScopeCache.remember`)."""
        if self._remember_scope is not None:
            self._remember_scope(thread_id, scope)

    def observe(self, observer: Callable[[str, int], None]) -> None:
        """Call `observer(thread_id, version)` for every invalidation this publisher sends,
        before sending it: this process knows of its own commits before the bus says so."""
        self._observers.append(observer)

    def _saw(self, thread_id: str, version: int) -> None:
        for observer in self._observers:
            observer(thread_id, version)

    async def chunk(
        self, thread_id: str, run_id: str, seq: int, chunk: dict[str, Any], *, episode: int = 0
    ) -> bool:
        """Keep a live chunk in the thread's replay buffer for late joiners and publish it, in
        one bus operation (one round trip on Redis); ordering across calls holds because each
        call finishes before the runtime publishes the next chunk."""
        data = encode_chunk(thread_id, run_id, seq, episode, chunk)
        operation = self._bus.publish(
            thread_channel(thread_id), data, PublishOptions(replay=self._replay(thread_id))
        )
        return await self._attempt(operation, [("chunk", 1), ("replay", 1)])

    def chunk_data(
        self, thread_id: str, run_id: str, seq: int, chunk: dict[str, Any], episode: int = 0
    ) -> bytes:
        """A live chunk's envelope as published by `chunks`."""
        return encode_chunk(thread_id, run_id, seq, episode, chunk)

    async def chunks(self, thread_id: str, chunks: Sequence[bytes]) -> bool:
        """Keep encoded chunks (`chunk_data`, in seq order) in the thread's replay buffer and
        publish them, each in turn, in one bus operation (one round trip on Redis). Counted
        per chunk, as `chunk` counts them."""
        if not chunks:
            return True
        operation = self._bus.publish(
            thread_channel(thread_id), chunks, PublishOptions(replay=self._replay(thread_id))
        )
        count = len(chunks)
        return await self._attempt(operation, [("chunk", count), ("replay", count)])

    async def invalidate(
        self,
        thread_id: str,
        version: int,
        *,
        stop: str | None = None,
        wakeup: str | None = None,
    ) -> bool:
        """The invalidation (and its scope's announcement), then a `stop(stop)` and a
        `wakeup(wakeup)` signal when given, in that order, as one bus operation (one round
        trip on Redis instead of one per message)."""
        messages, kinds, known = await self._invalidation(thread_id, version)
        if stop is not None:
            messages.append((CONTROL_CHANNEL, encode_stop(stop)))
            kinds.append(("stop", 1))
        if wakeup is not None:
            data = encode_wakeup(wakeup, thread_id, current_traceparent())
            messages.append((CONTROL_CHANNEL, data))
            kinds.append(("wakeup", 1))
        if len(messages) == 1:
            operation = self._bus.publish(*messages[0])
        else:
            operation = self._bus.publish_all(messages)
        sent = await self._attempt(operation, kinds)
        self._settle(thread_id, version, sent)
        return sent and known

    def _settle(self, thread_id: str, version: int, sent: bool) -> None:
        """Whether the invalidation of `thread_id` at `version` went out: owed until it does
        (`Reannouncer`)."""
        if sent:
            self._reannounce.done(thread_id, version)
        else:
            self._reannounce.add(thread_id, version)

    async def _republish(self, pending: dict[str, int]) -> bool:
        """The invalidations owed (thread id -> newest version), in one bus operation."""
        messages: list[tuple[str, bytes]] = []
        kinds: dict[str, int] = {}
        for thread_id, version in pending.items():
            more, counts, _ = await self._invalidation(thread_id, version)
            messages += more
            for kind, count in counts:
                kinds[kind] = kinds.get(kind, 0) + count
        return await self._attempt(self._bus.publish_all(messages), list(kinds.items()))

    async def close(self) -> None:
        """Stop publishing owed invalidations again (the process is stopping)."""
        await self._reannounce.close()

    async def _invalidation(
        self, thread_id: str, version: int
    ) -> tuple[list[tuple[str, bytes]], list[tuple[str, int]], bool]:
        """The thread's invalidation and, where its scope is known, the scope's announcement:
        (channel, message) pairs, their (kind, count) for telemetry, and whether the scope was
        known."""
        self._saw(thread_id, version)
        messages = [(thread_channel(thread_id), encode_invalidate(thread_id, version))]
        kinds = [("invalidate", 1)]
        scope, known = await self._scope(thread_id)
        if scope is not None:
            envelope = encode_scope_invalidate(scope, thread_id, version)
            messages.append((scope_channel(scope), envelope))
            kinds.append(("scope_invalidate", 1))
        return messages, kinds, known

    async def committed(self, thread_id: str, version: int, chunks: Sequence[bytes] = ()) -> bool:
        """After a runtime commit: the chunks it holds that are not published yet (encoded by
        `chunk_data`, in seq order, as `chunks` publishes them), then `invalidate`, then
        `clear_replay` (the commit holds every chunk so far: late joiners get the snapshot, not
        a replay), as one bus operation (one round trip on Redis). Subscribers see what
        `chunks` then `invalidate` then `clear_replay` would show them."""
        messages, kinds, known = await self._invalidation(thread_id, version)
        replay = self._replay(thread_id)
        if chunks:
            options = PublishOptions(replay=replay, then=messages, clear_replay=True)
            operation = self._bus.publish(thread_channel(thread_id), chunks, options)
            count = len(chunks)
            kinds = [("chunk", count), ("replay", count), *kinds]
            # A failure counts as the chunks' and the invalidation's, as two operations would.
            failed = [("chunk", count), ("invalidate", 1)]
        else:
            operation = self._bus.publish_all(messages, replay.key)
            failed = None
        kinds.append(("clear_replay", 1))
        sent = await self._attempt(operation, kinds, failed)
        self._settle(thread_id, version, sent)
        return sent and known

    def _replay(self, thread_id: str) -> Replay:
        return Replay(replay_key(thread_id), self._replay_limit, self._replay_max_bytes)

    async def _scope(self, thread_id: str) -> tuple[str | None, bool]:
        """(the scope to announce an invalidation on, or None; False when it is unknown)."""
        if self._scope_of is None:
            return None, True
        try:
            return await self._scope_of(thread_id), True
        except Exception as exc:  # storage hiccup: the inbox resyncs, the run goes on
            log.warning("scope of thread %s unknown, not announced: %s", thread_id, exc)
            return None, False

    async def clear_replay(self, thread_id: str) -> bool:
        """Called after a step commit: its chunks are in the snapshot from now on."""
        operation = self._bus.clear_replay(replay_key(thread_id))
        return await self._attempt(operation, [("clear_replay", 1)])

    async def wakeup(self, run_id: str | None = None, thread_id: str | None = None) -> bool:
        """Work for workers: run `run_id` (of `thread_id`, when known), or any (None)."""
        traceparent = current_traceparent() if run_id is not None else None
        data = encode_wakeup(run_id, thread_id, traceparent)
        return await self._publish(CONTROL_CHANNEL, "wakeup", data)

    async def stop(self, run_id: str) -> bool:
        return await self._publish(CONTROL_CHANNEL, "stop", encode_stop(run_id))

    async def _publish(self, channel: str, kind: str, data: bytes) -> bool:
        return await self._attempt(self._bus.publish(channel, data), [(kind, 1)])

    async def _attempt(
        self,
        operation: Awaitable[None],
        published: Sequence[tuple[str, int]],
        failed: Sequence[tuple[str, int]] | None = None,
    ) -> bool:
        """`published`: (kind, messages) the operation holds, counted once it succeeded; when it
        fails, `failed` (by default its first kind) is counted as errors."""
        began = time.perf_counter()
        try:
            await operation
        except Exception as exc:
            for kind, count in failed or published[:1]:
                safe_add(PUBLISH_ERRORS, count, {"kind": kind})
            if not self._failing:
                kind = published[0][0]
                log.warning("realtime %s failed (best effort, continuing): %s", kind, exc)
            self._failing = True
            return False
        for kind, count in published:
            _PUBLISHED.add(PUBLISHED, count, kind)
        safe_record(PUBLISH_DURATION, time.perf_counter() - began, {"kind": published[0][0]})
        if self._failing:
            log.info("realtime publishing works again")
            self._failing = False
        return True
