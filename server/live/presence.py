"""Presence per thread on one gateway: who is subscribed, typing, reviewing; diffs to subscribers.

Every subscribed connection is present in the thread as its principal. A gateway keeps, per
thread, one value in a `PresenceStore` (Redis shared by every gateway, or in process) holding
all of its members there, written (and announced on the thread's presence channel, so other
gateways reread at once) when they change, at most every `MIN_WRITE_INTERVAL` per thread. Every
half `refresh_interval` the gateway beats (its values count only while its beat, expiring after
1.5 intervals, lasts) and checks the beats of the other gateways whose members it shows: one
round trip per gateway per half interval, whatever its connections and threads. A gateway that
dies stops beating, so its members vanish from every other gateway's view within 2 refresh
intervals. A change of this gateway's own members (a join, an update, a leave) is aggregated
with the other gateways' values as last read, without a store read; another gateway's
announcement is what makes the room's next reread read the store. Every `FULL_PASS` seconds a
gateway rewrites its values and rereads every room (one pipeline each way), which also keeps the
store's keys from expiring. Subscribers get the whole set after `subscribed`, then
`presence.join`, `presence.update` and `presence.leave` frames; one person with several tabs is
one member with a connection count.
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
# A thread's value (this gateway's members there) is written at most this often; changes in
# between coalesce.
MIN_WRITE_INTERVAL = 0.05
# Every this many seconds a gateway rewrites all of its values and rereads every room: what
# repairs a lost write or announcement, and keeps the store's keys (a minute's expiry) alive.
FULL_PASS = 20.0
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


@dataclass(eq=False, slots=True)
class Member:
    """One present connection in one thread."""

    id: str
    thread_id: str
    principal: Principal
    deliver: Deliver
    typing: bool = False
    reviewing: str | None = None
    updated_at: float = field(default_factory=time.time)
    # The entry, built once per change.
    shown: dict[str, Any] | None = field(default=None, repr=False)

    def entry(self) -> dict[str, Any]:
        if self.shown is None:
            self.shown = {
                "subject": self.principal.subject,
                "role": str(self.principal.role),
                "name": self.principal.name,
                "typing": self.typing,
                "reviewing": self.reviewing,
                "updated_at": self.updated_at,
            }
        return self.shown

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
    # The version of this gateway's members (moved by every join, leave and update), the
    # version last written to the store, and the task writing it (one write for a burst).
    local_version: int = 0
    written: int = 0
    writer: asyncio.Task[None] | None = None
    value: bytes = b"{}"  # this gateway's members, serialised for `value_version`
    value_version: int = 0
    # What the last applied read found (other gateways' values) and the local version it was
    # aggregated with: a reread that finds both unchanged aggregates and sends nothing.
    remote_seen: dict[str, bytes] | None = None
    # Whether other gateways' values may have changed since that read (an announcement, a
    # failed full pass): only then does a reread read the store; a change of this gateway's
    # own members is aggregated with the values last read.
    remote_stale: bool = True
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
        # What this gateway publishes when its members of a thread changed ("reread it").
        self._announcement = orjson.dumps({"type": "presence.changed", "gateway": self._gateway})
        self._ids = itertools.count()
        self._reads = itertools.count()  # store reads in the order they were started
        self._rooms: dict[str, _Room] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self.frames_sent = 0
        # Rereads of rooms, and those that found nothing changed; liveness checks of other
        # gateways (for tests and benches).
        self.rereads = 0
        self.rereads_skipped = 0
        self.checks = 0

    async def __aenter__(self) -> PresenceHub:
        await self._store.open()
        with contextlib.suppress(Exception):  # the loop beats again in half an interval
            await self._store.beat(self._gateway, self.ttl)  # before any value is written
        self._loop_task = asyncio.create_task(self._refresh_forever(), name="presence-refresh")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._loop_task is not None:
            await cancel_and_wait(self._loop_task)
        rooms, self._rooms = list(self._rooms.values()), {}
        for room in rooms:
            await self._stop(room)
        with contextlib.suppress(Exception):
            await self._store.write_many([(r.thread_id, self._gateway, None) for r in rooms])
        await self._store.close()

    # --- connections -----------------------------------------------------------------------

    async def join(self, thread_id: str, principal: Principal, deliver: Deliver) -> Member:
        """Make a connection present; it gets the set at once (a `presence` frame).

        The set it gets is the room's last read one (read now only for a room new to this
        gateway); its own entry and whatever changed since arrive as `presence.join`/`update`
        frames with the room's next (coalesced) reread, like every other member's. So a burst
        of N joins costs a few store reads and writes, not one read of N entries per join.
        """
        member = Member(f"{self._gateway}-{next(self._ids)}", thread_id, principal, deliver)
        room = await self._room(thread_id)
        async with room.lock:
            if not room.primed:
                await self._read_remote(room)
                room.primed = True
            room.members[member.id] = member
            frame = {
                "type": "presence",
                "thread_id": thread_id,
                "members": list(room.sent.values()),
            }
            self._send(member, orjson.dumps(frame))
        self._changed(room)
        return member

    async def leave(self, member: Member) -> None:
        room = self._rooms.get(member.thread_id)
        if room is None or room.members.pop(member.id, None) is None:
            return
        self._changed(room)

    def update(self, member: Member, changes: dict[str, Any]) -> None:
        """Apply a `presence.update`; written now, or coalesced (MIN_WRITE_INTERVAL)."""
        member.change(changes)
        room = self._rooms.get(member.thread_id)
        if room is not None and room.members.get(member.id) is member:
            self._changed(room)

    def _changed(self, room: _Room) -> None:
        """This gateway's members of `room` changed: tell its own (the next reread takes
        them from the members, not the store), and write and announce them."""
        room.local_version += 1
        room.dirty.set()
        if room.writer is None or room.writer.done():
            room.writer = asyncio.create_task(self._write(room), name="presence-write")

    def _value(self, room: _Room) -> bytes:
        if room.value_version != room.local_version:
            room.value = orjson.dumps({m.id: m.entry() for m in room.members.values()})
            room.value_version = room.local_version
        return room.value

    async def _write(self, room: _Room) -> None:
        """Write this gateway's members of `room` until the store has the latest; a room
        left empty is then forgotten (its value deleted first, so nothing outlives it)."""
        while self._rooms.get(room.thread_id) is room:
            if room.written == room.local_version:
                if room.members:
                    return
                self._rooms.pop(room.thread_id, None)
                await cancel_and_wait_all(room.tasks)
                return
            version = room.local_version
            value = self._value(room) if room.members else None
            try:
                await self._store.write_many([(room.thread_id, self._gateway, value)])
            except Exception as exc:  # the next full pass writes it again
                log.warning("presence write of %s failed: %s", room.thread_id, exc)
            room.written = version
            await self._announce(room.thread_id)
            await asyncio.sleep(MIN_WRITE_INTERVAL)

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
                async for data in subscription:
                    if data != self._announcement:  # this gateway's own: nothing to reread
                        room.remote_stale = True
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
                    if room.remote_stale or room.remote_seen is None:
                        await self._read_remote(room)
                    else:  # only this gateway's members changed: no store read
                        self._apply(room, room.remote_seen, room.applied)
            except Exception as exc:
                log.warning("presence reread of %s failed: %s", room.thread_id, exc)
            await asyncio.sleep(MIN_REREAD_INTERVAL)

    async def _read_remote(self, room: _Room) -> None:
        """Reread the room; an announcement arriving meanwhile marks it stale again, and a
        failed read leaves it stale."""
        room.remote_stale = False
        try:
            await self._reread(room)
        except BaseException:
            room.remote_stale = True
            raise

    async def _reread(self, room: _Room) -> None:
        # This gateway's own value is taken from its members below, not read.
        read = next(self._reads)
        found = await self._store.read_many([room.thread_id], skip=self._gateway)
        self._apply(room, found.get(room.thread_id, {}), read)

    async def _reread_all(self) -> None:
        """Every room in one store read (one round trip per gateway, not one per thread);
        the rooms it could not read are reread one by one."""
        rooms = list(self._rooms.values())
        read = next(self._reads)
        try:
            found = await self._store.read_many([r.thread_id for r in rooms], self._gateway)
        except Exception as exc:
            log.warning("presence reread of %d threads failed: %s", len(rooms), exc)
            found = {}
        for room in rooms:
            if room.thread_id not in found:
                room.remote_stale = True
                room.dirty.set()
            elif self._rooms.get(room.thread_id) is room:
                async with room.lock:
                    self._apply(room, found[room.thread_id], read)

    async def _check_gateways(self) -> None:
        """Drop the members of the gateways whose beat expired from every room showing them
        (one liveness read for all rooms; no room is read)."""
        rooms = [r for r in self._rooms.values() if r.remote_seen]
        seen = sorted({g for room in rooms for g in room.remote_seen or {}})
        if not seen:
            return
        self.checks += 1
        try:
            live = await self._store.alive(seen)
        except Exception as exc:
            log.warning("presence liveness check of %d gateways failed: %s", len(seen), exc)
            return
        if len(live) == len(seen):
            return
        read = next(self._reads)
        for room in rooms:
            remote = room.remote_seen or {}
            if remote.keys() <= live or self._rooms.get(room.thread_id) is not room:
                continue
            async with room.lock:
                self._apply(room, {g: v for g, v in remote.items() if g in live}, read)

    def _apply(self, room: _Room, remote: dict[str, bytes], read: int) -> None:
        """Members from other gateways' values `remote` (read as the `read`-th read) and
        this gateway's own; the frames turning what subscribers were sent into them."""
        if read < room.applied:
            return  # a later read of the room was applied already
        room.applied = read
        self.rereads += 1
        if remote == room.remote_seen and room.local_seen == room.local_version:
            self.rereads_skipped += 1
            return  # the same values aggregate to the same members: no frame to send
        room.remote_seen, room.local_seen = remote, room.local_version
        entries: dict[str, dict[str, Any]] = {}
        for value in remote.values():
            with contextlib.suppress(orjson.JSONDecodeError):
                members = orjson.loads(value)
                if isinstance(members, dict):
                    entries.update((k, e) for k, e in members.items() if isinstance(e, dict))
        # This gateway's own connections are present while they are open, whatever the store
        # says (it may not have their value yet, or have lost it).
        entries.update({m.id: m.entry() for m in room.members.values()})
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
            await self._bus.publish(presence_channel(thread_id), self._announcement)
        except Exception as exc:
            log.warning("presence announcement of %s failed: %s", thread_id, exc)

    async def _rewrite_all(self, announce: bool) -> None:
        """Write every room's value again (serialised when it changed, not per pass)."""
        rooms = [r for r in self._rooms.values() if r.members]
        try:
            await self._store.write_many(
                [(r.thread_id, self._gateway, self._value(r)) for r in rooms]
            )
        except Exception as exc:
            log.warning("presence rewrite of %d threads failed: %s", len(rooms), exc)
            return
        for room in rooms if announce else ():
            await self._announce(room.thread_id)

    async def _refresh_forever(self) -> None:
        """Every half interval: beat, and check the other gateways' beats; every FULL_PASS,
        rewrite this gateway's values and reread every room."""
        half = self.refresh_interval / 2
        every = max(1, round(FULL_PASS / half))
        for tick in itertools.count(1):
            await asyncio.sleep(half)
            try:
                lapsed = not await self._store.beat(self._gateway, self.ttl)
            except Exception as exc:
                log.warning("presence beat failed: %s", exc)
                continue
            if lapsed:
                # Others may have dropped (and deleted) this gateway's values meanwhile: they
                # are told to reread them.
                await self._rewrite_all(announce=True)
            elif tick % every == 0:
                await self._rewrite_all(announce=False)  # others reread in their own pass
            if tick % every == 0 and self._rooms:
                await self._reread_all()
            else:
                await self._check_gateways()
