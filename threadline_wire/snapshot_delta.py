"""Snapshot deltas: what turns one wire snapshot of a thread into a newer one, declared once.

A gateway sends a delta inside an `invalidate` frame to the connections that subscribed with
`"deltas": true` (docs/protocol.md, "Snapshot deltas"); a client holding exactly the delta's
`from` version applies it and holds the snapshot a fresh `GET /v1/threads/{id}` would answer
it at the frame's `version`, without the refetch. The committed snapshot stays the truth: a
delta is computed from two such snapshots as one viewer sees them, so it can only carry what
that viewer's snapshot shows.

A delta (all keys but `from` optional; an absent one means "unchanged"):

- `from`: the version of the snapshot it applies to;
- `thread`: the fields of `thread` that changed, with their new values;
- `messages`: the new message list as a list of pieces, each either `[start, end]` (the base's
  messages `start … end-1`, unchanged) or a message object (new or changed);
- `set`: other top-level keys (`run`, `queue`, `pending_actions`, `permissions`, `page`, …)
  replaced whole;
- `unset`: top-level keys the new snapshot no longer has.
"""

from __future__ import annotations

from typing import Any

# Top-level keys with a delta of their own; every other key is replaced whole when it changed.
_THREAD = "thread"
_MESSAGES = "messages"


class DeltaMismatch(ValueError):
    """The delta does not apply to this snapshot (another base, or a malformed delta)."""


def diff(base: dict[str, Any], new: dict[str, Any], base_version: int) -> dict[str, Any]:
    """The delta from `base` (a wire snapshot at `base_version`) to `new`."""
    delta: dict[str, Any] = {"from": base_version}
    replaced: dict[str, Any] = {}
    for key, value in new.items():
        if key in base and base[key] == value:
            continue
        if key == _THREAD and isinstance(value, dict) and isinstance(base.get(key), dict):
            fields = _thread_fields(base[key], value)
            if fields is not None:
                delta[_THREAD] = fields
                continue
        if key == _MESSAGES and isinstance(value, list) and isinstance(base.get(key), list):
            delta[_MESSAGES] = _message_pieces(base[key], value)
            continue
        replaced[key] = value
    if replaced:
        delta["set"] = replaced
    gone = [key for key in base if key not in new]
    if gone:
        delta["unset"] = gone
    return delta


def apply(base: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """`base` with `delta` applied, as a new dict (`base` is not changed); raises
    `DeltaMismatch` when a piece names messages `base` does not have."""
    new = dict(base)
    fields = delta.get(_THREAD)
    if fields is not None:
        thread = base.get(_THREAD)
        if not isinstance(thread, dict) or not isinstance(fields, dict):
            raise DeltaMismatch("no thread to patch")
        new[_THREAD] = {**thread, **fields}
    pieces = delta.get(_MESSAGES)
    if pieces is not None:
        messages = base.get(_MESSAGES)
        if not isinstance(messages, list) or not isinstance(pieces, list):
            raise DeltaMismatch("no messages to patch")
        new[_MESSAGES] = _rebuild(messages, pieces)
    replaced = delta.get("set") or {}
    if not isinstance(replaced, dict):
        raise DeltaMismatch("set must be an object")
    new.update(replaced)
    for key in delta.get("unset") or ():
        new.pop(key, None)
    return new


def _thread_fields(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """The changed fields of the thread row, or None when its keys changed (replace it whole)."""
    if base.keys() != new.keys():
        return None
    return {key: value for key, value in new.items() if base[key] != value}


def _message_pieces(base: list[Any], new: list[Any]) -> list[Any]:
    """`new` as runs of unchanged base messages (`[start, end]`) and new or changed ones."""
    index = {_message_id(m): n for n, m in enumerate(base) if _message_id(m) is not None}
    pieces: list[Any] = []
    for message in new:
        at = index.get(_message_id(message))
        if at is None or base[at] != message:
            pieces.append(message)
            continue
        last = pieces[-1] if pieces else None
        if isinstance(last, list) and last[1] == at:
            last[1] = at + 1
        else:
            pieces.append([at, at + 1])
    return pieces


def _rebuild(base: list[Any], pieces: list[Any]) -> list[Any]:
    messages: list[Any] = []
    for piece in pieces:
        if isinstance(piece, dict):
            messages.append(piece)
            continue
        if (
            not isinstance(piece, list)
            or len(piece) != 2
            or not all(type(n) is int for n in piece)
            or not 0 <= piece[0] < piece[1] <= len(base)
        ):
            raise DeltaMismatch(f"bad message range {piece!r} over {len(base)} messages")
        messages.extend(base[piece[0] : piece[1]])
    return messages


def _message_id(message: Any) -> str | None:
    if isinstance(message, dict):
        found = message.get("id")
        return found if isinstance(found, str) else None
    return None


__all__ = ["DeltaMismatch", "apply", "diff"]
