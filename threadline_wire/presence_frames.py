"""Who is in a thread, as `presence` frames carry it (built by `server.live.presence`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from threadline_wire.frames import ServerFrame


class PresenceMember(BaseModel):
    """One subject present in a thread, its connections aggregated: `typing` if any of them
    types, `reviewing` the action id the most recently updated one looks at."""

    model_config = ConfigDict(extra="allow", frozen=True)

    subject: str
    role: str | None = None
    name: str = ""
    connections: int = 0
    typing: bool = False
    reviewing: str | None = None


class PresenceSet(ServerFrame):
    """The whole set, sent after every (re)subscription."""

    type: Literal["presence"] = "presence"
    thread_id: str
    members: list[PresenceMember] = []


class PresenceJoined(ServerFrame):
    type: Literal["presence.join"] = "presence.join"
    thread_id: str
    member: PresenceMember


class PresenceUpdated(ServerFrame):
    type: Literal["presence.update"] = "presence.update"
    thread_id: str
    member: PresenceMember


class PresenceLeft(ServerFrame):
    type: Literal["presence.leave"] = "presence.leave"
    thread_id: str
    subject: str


__all__ = ["PresenceJoined", "PresenceLeft", "PresenceMember", "PresenceSet", "PresenceUpdated"]
