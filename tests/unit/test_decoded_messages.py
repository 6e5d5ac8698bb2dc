"""Messages decoded from rows for snapshot reads: one decode per distinct row, any changed
column a new decode, bounded by entries and characters."""

from __future__ import annotations

from typing import Any

import orjson

from runtime.storage.sql.decoded_messages import DecodedMessages, message_view
from runtime.storage.sql.rows import message_from_row


def row(text: str = "hello", **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "msg_1",
        "thread_id": "th_1",
        "position": 0,
        "role": "user",
        "parts": orjson.dumps([{"type": "text", "text": text}]).decode(),
        "visibility": "visible",
        "run_id": None,
        "client_request_id": None,
        "created_at": 1.5,
        "updated_at": 1.5,
    }
    return {**base, **changes}


def test_a_row_read_again_is_decoded_once_and_equals_a_fresh_decode() -> None:
    decoded = DecodedMessages()
    first = decoded.message(row())
    again = decoded.message(row())  # equal values, new objects: as a new read gives them
    assert again is first
    assert first == message_from_row(row())
    assert (decoded.hits, decoded.misses) == (1, 1)


def test_any_changed_column_is_decoded_again() -> None:
    decoded = DecodedMessages()
    original = decoded.message(row())
    for changed in (
        row("hello, edited"),
        row(visibility="hidden"),
        row(updated_at=2.5),
        row(position=1),
    ):
        message = decoded.message(changed)
        assert message is not original
        assert message == message_from_row(changed)
    assert decoded.misses == 5 and decoded.hits == 0


def test_bounded_by_entries_and_characters() -> None:
    by_entries = DecodedMessages(max_entries=3)
    for n in range(10):
        by_entries.message(row(id=f"msg_{n}"))
    assert len(by_entries) == 3
    by_entries.message(row(id="msg_9"))
    assert by_entries.hits == 1  # the newest are kept
    by_entries.message(row(id="msg_0"))
    assert by_entries.misses == 11  # the oldest went

    size = len(row("x" * 50)["parts"])  # each message's parts, in characters
    by_chars = DecodedMessages(max_chars=64 * size)  # a 64th of it: one message, just kept
    for n in range(100):
        by_chars.message(row("x" * 50, id=f"msg_{n}"))
    assert len(by_chars) == 64  # as many as the characters hold, the newest
    by_chars.message(row("x" * 50, id="msg_99"))
    by_chars.message(row("x" * 50, id="msg_36"))
    assert by_chars.hits == 2


def test_a_large_message_or_an_unhashable_row_is_decoded_and_never_kept() -> None:
    decoded = DecodedMessages(max_chars=64 * 100)
    large = row("y" * 200)
    assert decoded.message(large) == message_from_row(large)
    assert len(decoded) == 0
    odd = {**row(), "extra": ["a list"]}
    assert decoded.message(odd).id == "msg_1"
    assert len(decoded) == 0


def test_a_kept_messages_view_is_kept_with_it_and_any_other_is_projected() -> None:
    decoded = DecodedMessages(max_entries=1)
    first = decoded.message(row())
    view = decoded.view(first)
    assert view == message_view(first)
    assert decoded.view(decoded.message(row())) is view  # read again: the same view
    decoded.message(row(id="msg_2"))  # pushes the first out
    assert decoded.view(first) is not view and decoded.view(first) == view
    unkept = message_from_row(row("never kept"))
    assert decoded.view(unkept) == message_view(unkept)
