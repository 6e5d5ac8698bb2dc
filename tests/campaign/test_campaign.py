"""The campaign in CI: short runs at fixed seeds must show no violation; the checker itself is
checked against histories that break each rule."""

from __future__ import annotations

from typing import Any

import pytest

from tests.campaign.checker import Checker, Committed
from tests.campaign.history import History
from tests.campaign.runner import Config, campaign, plans

SEEDS = (11, 12)
MINUTES = 0.6


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("seed", SEEDS)
async def test_short_campaign_has_no_violation(seed: int) -> None:
    result = await campaign(Config(seed, MINUTES))
    print("\n" + result.report())
    assert result.history.fault_counts(), "the nemesis struck nothing"
    assert sum(1 for op in result.history.ops if op.outcome == "ok") > 20
    assert result.violations == []


def test_a_seed_replays_the_same_schedule() -> None:
    first, again, other = plans(Config(5, 2)), plans(Config(5, 2)), plans(Config(6, 2))
    assert first[2] == again[2] and first[1] == again[1]
    assert first[2] != other[2]


def _user(thread: str, text: str) -> dict[str, Any]:
    return {"thread_id": thread, "role": "user", "run_id": None, "parts": [_t(text)]}


def _t(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _check(history: History, committed: Committed) -> list[str]:
    return Checker(history, committed, seed=0).run()


def test_checker_flags_a_send_committed_twice() -> None:
    history = History()
    History.complete(history.invoke("c0", "send", "t", marker="m-c0-1"), "ok", 202)
    once = Committed([_user("t", "note m-c0-1"), _user("t", "note m-c0-10")], [], [])
    assert _check(history, once) == []
    twice = Committed([_user("t", "note m-c0-1"), _user("t", "note m-c0-1")], [], [])
    assert "acknowledged send" in _check(history, twice)[0]
    lost = Committed([], [], [])
    assert "acknowledged send" in _check(history, lost)[0]


def test_checker_flags_a_cancelled_send_that_was_committed() -> None:
    history = History()
    send = history.invoke("c0", "send", "t", marker="m-c0-1")
    History.complete(send, "ok", 202, {"thread_id": "t", "queued_item_id": "q1"})
    cancel = history.invoke("c1", "cancel", "t", item_id="q1")
    History.complete(cancel, "ok", 200)
    assert _check(history, Committed([], [], [])) == []
    found = _check(history, Committed([_user("t", "note m-c0-1")], [], []))
    assert "cancelled send" in found[0]
    History.complete(cancel, "fail", 409)  # the item ran first: the send must be there
    assert "acknowledged send" in _check(history, Committed([], [], []))[0]
    History.complete(cancel, "unknown")  # either, but once
    assert _check(history, Committed([_user("t", "note m-c0-1")], [], [])) == []
    assert _check(history, Committed([], [], [])) == []


def test_checker_flags_a_resolver_that_got_200_but_lost() -> None:
    history = History()
    for subject, outcome in (("alice", "ok"), ("bob", "fail")):
        op = history.invoke("c0", "resume", "t", action_id="a1", run_id="r", subject=subject)
        History.complete(op, outcome, 200 if outcome == "ok" else 409)  # type: ignore[arg-type]
    part = {"type": "tool-call", "state": "output-available", "waiting": {"action_id": "a1"}}
    message = {"thread_id": "t", "role": "assistant", "run_id": "r", "parts": [part]}
    part["waiting"] = {"action_id": "a1", "resolution": {"subject": "alice"}}
    assert _check(history, Committed([message], [], [])) == []
    part["waiting"] = {"action_id": "a1", "resolution": {"subject": "bob"}}
    assert "action resolver" in _check(history, Committed([message], [], []))[0]
    part["waiting"] = {"action_id": "a1", "resolution": {"subject": "alice"}}
    stop = history.invoke("c1", "stop", "t", run_id="r")
    History.complete(stop, "ok", 202)
    stop.end = history.ops[0].start - 1  # acknowledged before the resumes were sent
    assert "resume after stop" in _check(history, Committed([message], [], []))[0]
    part["waiting"] = {"action_id": "a1", "resolution": None}  # stopped: cancelled, unresolved
    found = _check(history, Committed([message], [], []))
    assert any("action resolver" in v for v in found)


def test_checker_flags_two_replies_unsettled_runs_and_versions() -> None:
    reply = {"thread_id": "t", "role": "assistant", "run_id": "r", "parts": [_t("You said: x")]}
    runs = [{"id": "r", "thread_id": "t", "status": "running"}]
    found = _check(History(), Committed([reply, reply], runs, []))
    assert any("two replies" in v for v in found) and any("unsettled run" in v for v in found)
    history = History()
    history.frames["c0/ws0"] = [{"type": "invalidate", "version": v} for v in (3, 5, 5)]
    assert "versions" in _check(history, Committed([], [], []))[0]
    checker = Checker(History(), Committed([], [], []), seed=0)
    checker.finals["c0/ws0"] = ({"thread": {"version": 4}}, {"thread": {"version": 5}})
    assert "convergence" in checker.run()[0]
