"""Presence's pure decisions: members from connection entries, frames from member sets."""

from __future__ import annotations

from typing import Any

from server.live.presence import aggregate, presence_frames


def entry(subject: str, **fields: Any) -> dict[str, Any]:
    return {
        "subject": subject,
        "role": "user",
        "name": subject,
        "typing": False,
        "reviewing": None,
        "updated_at": 1.0,
        "expires_at": 9e9,
        **fields,
    }


def test_tabs_of_one_person_are_one_member_with_merged_state() -> None:
    members = aggregate(
        {
            "g1-1": entry("alice", typing=True, reviewing="act_old", updated_at=1.0),
            "g2-7": entry("alice", reviewing="act_new", updated_at=2.0),
            "g1-2": entry("bob"),
        }
    )
    assert set(members) == {"alice", "bob"}
    assert members["alice"]["connections"] == 2
    assert members["alice"]["typing"] is True
    assert members["alice"]["reviewing"] == "act_new"  # the most recently updated tab's
    assert members["bob"] == {
        "subject": "bob",
        "role": "user",
        "name": "bob",
        "connections": 1,
        "typing": False,
        "reviewing": None,
    }


def test_frames_say_join_update_and_leave_and_nothing_when_equal() -> None:
    before = aggregate({"a": entry("alice"), "b": entry("bob")})
    after = aggregate({"a": entry("alice", typing=True), "c": entry("carol")})
    frames = presence_frames("thr", before, after)
    assert [(f["type"], f.get("subject") or f["member"]["subject"]) for f in frames] == [
        ("presence.update", "alice"),
        ("presence.join", "carol"),
        ("presence.leave", "bob"),
    ]
    assert presence_frames("thr", after, dict(after)) == []
