"""Messages decoded from their rows, kept for the snapshot reads.

Every commit of a watched thread is followed by snapshot reads (the gateways' deltas, the
refetches the cache does not serve), and each decodes the page's messages again: their parts'
JSON validated into models, a `Message` built per row, though all but the newest are the same
rows as the read before. Here a message is kept by its row, every column's name and value: a
row that changed in any column (parts, visibility, `updated_at`) is another key, so what is
served is what decoding that very row gives. Bounded by entries and by the parts' characters,
least recently used out first; a message larger than a 64th of the bound is never kept. A kept
message's `MessageView` (what a snapshot shows of it) is kept with it, found by the message
object's identity while the message is kept (`view`).

Messages and their parts are frozen models; a snapshot's readers (views, the wire encoding,
the snapshot cache that shares one read between viewers) only read them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from runtime.domain import Message, MessageView
from runtime.storage.sql.rows import Row, message_from_row

MAX_ENTRIES = 8192
MAX_CHARS = 32 * 1024 * 1024


def message_view(message: Message) -> MessageView:
    """What a snapshot shows of `message`."""
    return MessageView(
        id=message.id,
        role=message.role,
        visibility=message.visibility,
        parts=message.parts,
        run_id=message.run_id,
    )


class DecodedMessages:
    """`message(row)` is `message_from_row(row)`, decoded once per distinct row (bounded)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._entries: OrderedDict[tuple[tuple[str, Any], ...], tuple[Message, int]] = OrderedDict()
        # id(message) -> its view, for the messages kept (each kept alive by its entry).
        self._views: dict[int, MessageView] = {}
        self._chars = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def message(self, row: Row) -> Message:
        try:
            key = tuple(row.items())
            found = self._entries.get(key)
        except TypeError:  # an unhashable column value: decoded, never kept
            return message_from_row(row)
        if found is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return found[0]
        self.misses += 1
        message = message_from_row(row)
        size = len(row["parts"])
        if size <= self.max_chars // 64:
            self._entries[key] = (message, size)
            self._views[id(message)] = message_view(message)
            self._chars += size
            while len(self._entries) > self.max_entries or self._chars > self.max_chars:
                _, (dropped, chars) = self._entries.popitem(last=False)
                del self._views[id(dropped)]
                self._chars -= chars
        return message

    def view(self, message: Message) -> MessageView:
        """`message_view(message)`, the one kept when `message` is a message kept here."""
        kept = self._views.get(id(message))
        return kept if kept is not None else message_view(message)


# The process's: rows of every store share it (a row's columns include its ids).
SNAPSHOT_MESSAGES = DecodedMessages()
