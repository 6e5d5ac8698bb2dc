"""The inbox's pure decision: which frames say how a thread's pending actions changed."""

from __future__ import annotations

from server.live.inbox import inbox_frames


def test_new_actions_are_pending_and_vanished_ones_resolved() -> None:
    before = {"a": {"id": "a"}, "b": {"id": "b"}}
    after = {"b": {"id": "b"}, "c": {"id": "c"}}
    frames = inbox_frames("acme", "thr", 7, before, after)
    assert frames == [
        {
            "type": "action.pending",
            "scope": "acme",
            "thread_id": "thr",
            "version": 7,
            "action": {"id": "c"},
        },
        {
            "type": "action.resolved",
            "scope": "acme",
            "thread_id": "thr",
            "version": 7,
            "action_id": "a",
        },
    ]


def test_no_change_says_nothing() -> None:
    same = {"a": {"id": "a"}}
    assert inbox_frames("acme", "thr", 3, same, dict(same)) == []
    assert inbox_frames("acme", "thr", 3, {}, {}) == []
