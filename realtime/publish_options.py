"""What `Bus.publish` takes besides a channel and data, and the checks every backend shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from realtime.bus_support import check_message, check_replay_bounds


@dataclass(frozen=True, slots=True)
class Replay:
    """The bounded replay buffer a publish keeps its messages in, for late joiners: each message
    is appended (newest kept: at most `limit` entries and, with `max_bytes`, at most that many
    bytes together, the entry just appended always kept) before it is published, so a late
    joiner that subscribes and then reads the buffer misses nothing."""

    key: str
    limit: int
    max_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class PublishOptions:
    """`replay`: keep each message in that buffer too. `then`: `(channel, data)` messages
    published after them, in order. `clear_replay`: then empty `replay`'s buffer (a commit that
    holds every chunk so far: late joiners get the snapshot, not a replay)."""

    replay: Replay | None = None
    then: Sequence[tuple[str, bytes]] = ()
    clear_replay: bool = False


PLAIN = PublishOptions()


@dataclass(frozen=True, slots=True)
class PublishBatch:
    """One checked `Bus.publish` call: what every backend then sends its own way."""

    channel: str
    items: tuple[bytes, ...]
    replay: Replay | None
    then: Sequence[tuple[str, bytes]]
    # The replay key to empty at the end, or None.
    clear_key: str | None

    @property
    def single(self) -> bool:
        """One message and nothing after it (backends have a shorter path for that)."""
        return len(self.items) == 1 and not self.then and self.clear_key is None


def publish_batch(
    channel: str, data: bytes | Sequence[bytes], options: PublishOptions | None
) -> PublishBatch | None:
    """Check every message and bound before anything is sent (a refused call publishes
    nothing, on every backend alike); None when there is nothing to send."""
    options = options or PLAIN
    items = (data,) if isinstance(data, bytes) else tuple(data)
    for item in items:
        check_message(item)
    for _, message in options.then:
        check_message(message)
    replay = options.replay
    if replay is not None:
        check_replay_bounds(replay.limit, replay.max_bytes)
    elif options.clear_replay:
        raise ValueError("clear_replay needs a replay buffer to clear")
    if not items and not options.then and not options.clear_replay:
        return None
    clear_key = replay.key if replay is not None and options.clear_replay else None
    return PublishBatch(channel, items, replay, options.then, clear_key)


class StepwiseBus(Protocol):
    """A bus with no batch of its own: one call per message (`publish_stepwise`)."""

    async def publish_entry(self, channel: str, data: bytes, replay: Replay | None) -> None:
        """One checked message: appended to `replay` first when given, then published."""
        ...

    async def publish_all(
        self, messages: Sequence[tuple[str, bytes]], clear_key: str | None = None
    ) -> None: ...


async def publish_stepwise(bus: StepwiseBus, batch: PublishBatch) -> None:
    """`Bus.publish` as one `publish_entry` per message, then one `publish_all` of `then` and
    the clear: subscribers and the buffer end where the batched backends leave them."""
    for data in batch.items:
        await bus.publish_entry(batch.channel, data, batch.replay)
    if batch.then or batch.clear_key is not None:
        await bus.publish_all(batch.then, batch.clear_key)
