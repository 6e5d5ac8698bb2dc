"""Presence per thread on one gateway: who is subscribed, typing, reviewing; diffs to subscribers.

Every subscribed connection is present in the thread as its principal. Its entry lives in a
`PresenceStore` (Redis shared by every gateway, or in process), refreshed every
`refresh_interval` with an expiry of 1.5 intervals, all of a gateway's in one pipeline; every
half interval each gateway rereads the threads it has subscribers in (a reread that finds the
other gateways' entries and its own members unchanged aggregates and sends nothing). A gateway
that dies stops refreshing, so its members vanish from every other gateway's view within 2
refresh intervals. A change is announced on the thread's
presence channel so other gateways reread at once. Subscribers get the whole set after
`subscribed`, then `presence.join`, `presence.update` and `presence.leave` frames; one person
with several tabs is one member with a connection count.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from realtime.bus import Bus
from realtime.bus_support import cancel_and_wait, cancel_and_wait_all
from realtime.channels import presence_channel
from realtime.presence_store import MemoryPresence, PresenceStore, RedisPresence
from runtime.domain import Principal

log = logging.getLogger(__name__)

Deliver = Callable[[bytes], None]
DEFAULT_REFRESH = 5.0
# One connection's state is written at most this often; updates in between coalesce.
MIN_UPDATE_INTERVAL = 0.2
# A room is reread at most this often however many changes are announced.
MIN_REREAD_INTERVAL = 0.05


def open_presence(redis_url: str | None, *, prefix: str = "threadline:") -> PresenceStore:
    """Redis when the bus is Redis (several gateways share it), else in process."""
    if redis_url:
        return RedisPresence(redis_url, prefix=prefix)
    return MemoryPresence()


def aggregate(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Members by subject from connection entries (a pure decision): several tabs of one
    person are one member with `connections`; typing if any tab types; reviewing: the most
    recently updated tab's action."""
    members: dict[str, dict[str, Any]] = {}
    latest: dict[str, float] = {}
    for member_id in sorted(entries):
        entry = entries[member_id]
        subject = str(entry.get("subject", ""))
        updated = float(entry.get("updated_at", 0))
        member = members.get(subject)
        if member is None:
            member = members[subject] = {
                "subject": subject,
                "role": entry.get("role"),
                "name": entry.get("name") or subject,
                "connections": 0,
                "typing": False,
                "reviewing": None,
            }
            latest[subject] = -1.0
        member["connections"] += 1
        member["typing"] = member["typing"] or bool(entry.get("typing"))
        if entry.get("reviewing") and updated >= latest[subject]:
            member["reviewing"] = entry["reviewing"]
            latest[subject] = updated
    return members


def _shown(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What of an entry `aggregate` reads (not its expiry, which every refresh moves)."""
    return tuple(
        entry.get(k) for k in ("subject", "role", "name", "typing", "reviewing", "updated_at")
    )


def presence_frames(
    thread_id: str, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Frames turning the member set `before` into `after` (a pure decision)."""
    frames: list[dict[str, Any]] = []
    for subject, member in after.items():
        if subject not in before:
            frames.append({"type": "presence.join", "thread_id": thread_id, "member": member})
        elif before[subject] != member:
            frames.append({"type": "presence.update", "thread_id": thread_id, "member": member})
    frames += [
        {"type": "presence.leave", "thread_id": thread_id, "subject": subject}
        for subject in before
        if subject not in after
    ]
    return frames


@dataclass(eq=False)
class Member:
    """One present connection in one thread."""

    id: str
    thread_id: str
    principal: Principal
    deliver: Deliver
    typing: bool = False
    reviewing: str | None = None
    updated_at: float = field(default_factory=time.time)
    last_write: float = 0.0
    flush: asyncio.Task[None] | None = None
    # The entry without its expiry, built once per change: every refresh writes every
    # member's entry, and only the expiry moves.
    shown: dict[str, Any] | None = field(default=None, repr=False)

    def entry(self, ttl: float, now: float | None = None) -> dict[str, Any]:
        if self.shown is None:
            self.shown = {
                "subject": self.principal.subject,
                "role": str(self.principal.role),
                "name": self.principal.name,
                "typing": self.typing,
                "reviewing": self.reviewing,
                "updated_at": self.updated_at,
            }
        return {**self.shown, "expires_at": (time.time() if now is None else now) + ttl}

    def change(self, changes: dict[str, Any]) -> None:
        """Apply a `presence.update`'s changes (the entry is built anew)."""
        if "typing" in changes and changes["typing"] is not None:
            self.typing = bool(changes["typing"])
        if "reviewing" in changes:
            self.reviewing = changes["reviewing"]
        self.updated_at = time.time()
        self.shown = None


@dataclass(eq=False)
class _Room:
    thread_id: str
    members: dict[str, Member] = field(default_factory=dict)
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    dirty: asyncio.Event = field(default_factory=asyncio.Event)
    primed: bool = False  # `sent` was read from the store at least once
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Joined members whose entries are not written yet, and the task writing them (batched:
    # a burst of joins is a few store writes and announcements, not one of each per join).
    joining: list[Member] = field(default_factory=list)
    writer: asyncio.Task[None] | None = None
    # What the last reread aggregated: other gateways' entries (without their expiry, which
    # every refresh moves) and the version of this gateway's members. A reread that finds
    # both unchanged has nothing to tell anyone and skips the aggregation, which is
    # proportional to the room's connections.
    remote_seen: dict[str, tuple[Any, ...]] | None = None
    local_version: int = 0
    local_seen: int = -1
    applied: int = -1  # the sequence number of the last read applied


class PresenceHub:
    """One per gateway process; see the module docstring for the timing guarantees."""

    def __init__(
        self, bus: Bus, store: PresenceStore, *, refresh_interval: float = DEFAULT_REFRESH
    ) -> None:
        self._bus = bus
        self._store = store
        self.refresh_interval = refresh_interval
        self.ttl = refresh_interval * 1.5
        self._gateway = uuid.uuid4().hex[:12]
        self._ids = itertools.count()
        self._reads = itertools.count()  # store reads in the order they were started
        self._rooms: dict[str, _Room] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self.frames_sent = 0
        # Rereads of rooms, and those that found nothing changed (for tests and benches).
        self.rereads = 0
        self.rereads_skipped = 0

    async def __aenter__(self) -> PresenceHub:
        await self._store.open()
        self._loop_task = asyncio.create_task(self._refresh_forever(), name="presence-refresh")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._loop_task is not None:
            await cancel_and_wait(self._loop_task)
        rooms, self._rooms = list(self._rooms.values()), {}
        for room in rooms:
            for member in list(room.members.values()):
                with contextlib.suppress(Exception):
                    await self._store.remove(room.thread_id, member.id)
            await self._stop(room)
        await self._store.close()

    # --- connections -----------------------------------------------------------------------

    async def join(self, thread_id: str, principal: Principal, deliver: Deliver) -> Member:
        """Make a connection present; it gets the set at once (a `presence` frame).

        The set it gets is the room's last read one (read now only for a room new to this
        gateway); its own entry and whatever changed since arrive as `presence.join`/`update`
        frames with the room's next (coalesced) reread, like every other member's. So a burst
        of N joins costs a few store reads, not one read of N entries per join (quadratic).
        """
        member = Member(f"{self._gateway}-{next(self._ids)}", thread_id, principal, deliver)
        room = await self._room(thread_id)
        member.last_write = time.monotonic()
        async with room.lock:
            if not room.primed:
                await self._reread(room)
                room.primed = True
            room.members[member.id] = member
            room.local_version += 1
            frame = {
                "type": "presence",
                "thread_id": thread_id,
                "members": list(room.sent.values()),
            }
            self._send(member, orjson.dumps(frame))
        room.dirty.set()  # this gateway's own members are seen here without the store
        room.joining.append(member)
        if room.writer is None or room.writer.done():
            room.writer = asyncio.create_task(self._write_joins(room), name="presence-joins")
        return member

    async def _write_joins(self, room: _Room) -> None:
        """Write the entries of every member joined meanwhile in one batch; announce once."""
        while room.joining:
            joined, room.joining = room.joining, []
            entries = [
                (room.thread_id, m.id, m.entry(self.ttl))
                for m in joined
                if m.id in room.members  # left before its entry was written: nothing to undo
            ]
            try:
                await self._store.put_many(entries)
            except Exception as exc:  # the periodic refresh writes them again
                log.warning("presence join of %d members failed: %s", len(entries), exc)
            await self._announce(room.thread_id)

    async def leave(self, member: Member) -> None:
        room = self._rooms.get(member.thread_id)
        if member.flush is not None:
            member.flush.cancel()
        if room is None or room.members.pop(member.id, None) is None:
            return
        room.local_version += 1
        writer = room.writer
        if writer is not None and not writer.done() and member not in room.joining:
            # Its entry may be being written right now: remove it after that write.
            await asyncio.wait({writer})
        try:
            await self._store.remove(member.thread_id, member.id)
            await self._announce(member.thread_id)
        except Exception as exc:
            log.warning("presence leave of %s failed (it expires): %s", member.id, exc)
        if not room.members:
            self._rooms.pop(member.thread_id, None)
            await self._stop(room)
        else:
            room.dirty.set()

    def update(self, member: Member, changes: dict[str, Any]) -> None:
        """Apply a `presence.update`; written now, or coalesced until the rate bound allows."""
        member.change(changes)
        room = self._rooms.get(member.thread_id)
        if room is not None:
            room.local_version += 1
        if member.flush is None:
            member.flush = asyncio.create_task(self._flush(member), name=f"presence-{member.id}")

    async def _flush(self, member: Member) -> None:
        try:
            wait = member.last_write + MIN_UPDATE_INTERVAL - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            member.flush = None  # changes from now on schedule the next write
            member.last_write = time.monotonic()
            await self._store.put(member.thread_id, member.id, member.entry(self.ttl))
            await self._announce(member.thread_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            member.flush = None
            log.warning("presence update of %s failed: %s", member.id, exc)

    # --- rooms -----------------------------------------------------------------------------

    async def _room(self, thread_id: str) -> _Room:
        room = self._rooms.get(thread_id)
        if room is None:
            room = self._rooms[thread_id] = _Room(thread_id)
            room.tasks = [
                asyncio.create_task(self._listen(room), name=f"presence-sub-{thread_id}"),
                asyncio.create_task(self._rereads(room), name=f"presence-reread-{thread_id}"),
            ]
        async with asyncio.timeout(10):
            await room.ready.wait()
        return room

    async def _stop(self, room: _Room) -> None:
        await cancel_and_wait_all((*room.tasks, room.writer))

    async def _listen(self, room: _Room) -> None:
        try:
            async with self._bus.subscribe(presence_channel(room.thread_id)) as subscription:
                room.ready.set()
                async for _ in subscription:
                    room.dirty.set()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("presence subscription of %s failed", room.thread_id)
            room.ready.set()  # the periodic reread still converges

    async def _rereads(self, room: _Room) -> None:
        while True:
            await room.dirty.wait()
            room.dirty.clear()
            try:
                async with room.lock:
                    await self._reread(room)
            except Exception as exc:
                log.warning("presence reread of %s failed: %s", room.thread_id, exc)
            await asyncio.sleep(MIN_REREAD_INTERVAL)

    async def _reread(self, room: _Room) -> None:
        # This gateway's own entries are taken from its members below, not parsed.
        read = next(self._reads)
        self._apply(room, await self._store.read(room.thread_id, skip=self._gateway + "-"), read)

    async def _reread_all(self) -> None:
        """Every room in one store read (one round trip per gateway, not one per thread);
        the rooms it could not read are reread one by one."""
        rooms = list(self._rooms.values())
        read = next(self._reads)
        try:
            found = await self._store.read_many([r.thread_id for r in rooms], self._gateway + "-")
        except Exception as exc:
            log.warning("presence reread of %d threads failed: %s", len(rooms), exc)
            found = {}
        for room in rooms:
            if room.thread_id not in found:
                room.dirty.set()
            elif self._rooms.get(room.thread_id) is room:
                async with room.lock:
                    self._apply(room, found[room.thread_id], read)

    def _apply(self, room: _Room, entries: dict[str, dict[str, Any]], read: int) -> None:
        """Members from other gateways' `entries` (read as the `read`-th read) and this
        gateway's own; the frames turning what subscribers were sent into them."""
        if read < room.applied:
            return  # a later read of the room was applied already
        room.applied = read
        self.rereads += 1
        remote = {member_id: _shown(entry) for member_id, entry in entries.items()}
        if remote == room.remote_seen and room.local_seen == room.local_version:
            self.rereads_skipped += 1
            return  # the same entries aggregate to the same members: no frame to send
        room.remote_seen, room.local_seen = remote, room.local_version
        # This gateway's own connections are present while they are open, whatever the store
        # says: on a busy gateway a refresh can come after the entries' expiry, and they must
        # not flap here (a leave, then a join again, to every member: with 600 connections
        # joining, the bench counted 1.66 M presence frames that way, 0.52 M without).
        entries.update({m.id: m.entry(self.ttl) for m in room.members.values()})
        current = aggregate(entries)
        frames = presence_frames(room.thread_id, room.sent, current)
        room.sent = current
        for frame in frames:
            data = orjson.dumps(frame)
            for member in list(room.members.values()):
                self._send(member, data)

    def _send(self, member: Member, data: bytes) -> None:
        try:
            member.deliver(data)
            self.frames_sent += 1
        except Exception:
            log.exception("presence delivery failed")

    async def _announce(self, thread_id: str) -> None:
        try:
            await self._bus.publish(presence_channel(thread_id), b'{"type":"presence.changed"}')
        except Exception as exc:
            log.warning("presence announcement of %s failed: %s", thread_id, exc)

    async def _refresh_forever(self) -> None:
        """Refresh our entries every interval; reread every room every half interval."""
        last_refresh = time.monotonic()
        while True:
            await asyncio.sleep(self.refresh_interval / 2)
            if time.monotonic() - last_refresh >= self.refresh_interval * 0.95:
                last_refresh, now = time.monotonic(), time.time()
                entries = [
                    (room.thread_id, member.id, member.entry(self.ttl, now))
                    for room in list(self._rooms.values())
                    for member in list(room.members.values())
                ]
                try:
                    await self._store.put_many(entries)
                except Exception as exc:
                    log.warning("presence refresh failed: %s", exc)
            if self._rooms:
                await self._reread_all()
