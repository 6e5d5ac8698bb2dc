"""Snapshot deltas (threadline_wire.snapshot_delta): `apply(base, diff(base, new))` is `new`
for every kind of change a commit makes, pieces reuse the base's unchanged messages, and a
delta never applies to a snapshot it was not made for."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from threadline_wire.snapshot_delta import DeltaMismatch, apply, diff


def message(n: int, text: str | None = None, visibility: str = "visible") -> dict[str, Any]:
    return {
        "id": f"msg_{n}",
        "role": "user" if n % 2 else "assistant",
        "visibility": visibility,
        "run_id": None,
        "parts": [{"type": "text", "text": text if text is not None else f"text {n}"}],
    }


def snapshot(version: int, messages: list[dict[str, Any]], **rest: Any) -> dict[str, Any]:
    return {
        "thread": {"id": "thr_1", "title": "t", "version": version, "metadata": {}},
        "messages": messages,
        "page": {"limit": 100, "before": None},
        "pending_actions": [],
        "run": None,
        "queue": [],
        "permissions": {"regenerate": False, "visibility": [m["id"] for m in messages]},
        **rest,
    }


def normal(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def roundtrip(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    delta = diff(base, new, base["thread"]["version"])
    # A delta travels as JSON: what is applied is what was decoded.
    decoded: dict[str, Any] = orjson.loads(orjson.dumps(delta))
    assert normal(apply(base, decoded)) == normal(new)
    return decoded


BASE = snapshot(5, [message(n) for n in range(1, 7)])


def test_rename_is_the_changed_thread_fields_only() -> None:
    new = snapshot(6, BASE["messages"])
    new["thread"]["title"] = "renamed"
    delta = roundtrip(BASE, new)
    assert delta == {"from": 5, "thread": {"title": "renamed", "version": 6}}


def test_appended_messages_reuse_the_base_as_one_range() -> None:
    messages = [*BASE["messages"], message(7), message(8)]
    delta = roundtrip(BASE, snapshot(6, messages))
    assert delta["messages"] == [[0, 6], message(7), message(8)]


def test_hidden_message_is_sent_whole_the_others_as_ranges() -> None:
    messages = list(BASE["messages"])
    messages[2] = message(3, text="", visibility="hidden")
    delta = roundtrip(BASE, snapshot(6, messages))
    assert delta["messages"] == [[0, 2], messages[2], [3, 6]]


def test_regenerate_drops_the_tail_and_appends() -> None:
    messages = [*BASE["messages"][:4], message(9)]
    delta = roundtrip(BASE, snapshot(6, messages))
    assert delta["messages"] == [[0, 4], message(9)]


def test_window_slides_older_messages_in_front() -> None:
    # A bounded window after a deletion shows an older message the base did not have.
    messages = [message(0), *BASE["messages"][:3]]
    delta = roundtrip(BASE, snapshot(6, messages))
    assert delta["messages"] == [message(0), [0, 3]]


def test_run_queue_and_removed_keys_are_replaced() -> None:
    base = {**BASE, "extra": 1}
    new = snapshot(6, BASE["messages"], run={"id": "run_1", "status": "running", "next_seq": 3})
    delta = roundtrip(base, new)
    assert delta["set"] == {"run": new["run"]} and delta["unset"] == ["extra"]


def test_thread_with_a_new_key_is_replaced_whole() -> None:
    new = snapshot(6, BASE["messages"])
    new["thread"]["archived"] = True
    delta = roundtrip(BASE, new)
    assert delta["set"]["thread"] == new["thread"] and "thread" not in {
        k for k in delta if k != "set"
    }


def test_random_edits_round_trip() -> None:
    rng = random.Random(35)
    for _ in range(300):  # bounded
        base = snapshot(1, [message(n) for n in range(rng.randint(0, 12))])
        messages = [m for m in base["messages"] if rng.random() > 0.2]
        for n, m in enumerate(messages):
            if rng.random() < 0.2:
                messages[n] = message(int(m["id"][4:]), text="edited")
        messages += [message(100 + n) for n in range(rng.randint(0, 3))]
        if rng.random() < 0.3:
            messages.insert(0, message(-1))
        roundtrip(base, snapshot(2, messages))


def test_a_range_outside_the_base_is_refused() -> None:
    short = snapshot(5, BASE["messages"][:2])
    delta = diff(BASE, snapshot(6, [*BASE["messages"], message(7)]), 5)
    with pytest.raises(DeltaMismatch):
        apply(short, delta)
    with pytest.raises(DeltaMismatch):
        apply(BASE, {"from": 5, "messages": [[0, "x"]]})


VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "deltas" / "deltas.json"


def test_shared_vectors_are_what_diff_makes_and_apply_undoes() -> None:
    # The TypeScript client applies the same file (clients/typescript/test/delta.test.mjs).
    cases = orjson.loads(VECTORS.read_bytes())["cases"]
    assert len(cases) >= 7
    for case in cases:
        base, new = case["base"], case["new"]
        assert diff(base, new, base["thread"]["version"]) == case["delta"], case["name"]
        assert normal(apply(base, case["delta"])) == normal(new), case["name"]
