"""The campaign in CI: short runs at fixed seeds must show no violation; the checker itself is
checked against histories that break each rule."""

from __future__ import annotations

from typing import Any

import pytest

from tests.campaign.checker import Checker, Committed
from tests.campaign.history import History, Stream
from tests.campaign.runner import Config, campaign, plans

# Fixed seeds: the same operations and faults on every submission (about a minute each).
RUNS = ((11, "single"), (12, "single"), (13, "cluster"))
MINUTES = 0.5


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize(("seed", "kind"), RUNS)
async def test_short_campaign_has_no_violation(seed: int, kind: str) -> None:
    """Under load (this runs beside the whole suite) answers come late: a late answer is an
    unknown outcome, a run still moving at the settle's cap or a session still fetching is
    reported as unknown; none of these is a violation."""
    result = await campaign(Config(seed, MINUTES, kind))
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


def _stream(transport: str, events: list[dict[str, Any]], **state: Any) -> Stream:
    stream = Stream("c0/s0", transport, "t", start=100.0, end=101.0, status=200)
    stream.events = events
    for key, value in state.items():
        setattr(stream, key, value)
    return stream


def test_checker_flags_ai_sdk_streams_that_break_framing_or_the_committed_text() -> None:
    reply = {"id": "a", "thread_id": "t", "role": "assistant", "run_id": "r", "parts": [_t("hi!")]}
    committed = Committed([reply], [{"id": "r", "thread_id": "t", "status": "completed"}], [])
    deltas = [{"type": "text-delta", "id": "x", "delta": d} for d in ("hi", "!")]
    good = [
        {"type": "start", "messageId": "r"},
        {"type": "text-start", "id": "x"},
        *deltas,
        {"type": "text-end", "id": "x"},
        {"type": "finish", "finishReason": "stop"},
    ]
    history = History()
    history.streams.append(_stream("ai-sdk", good, done=True, closed=True))
    assert _check(history, committed) == []
    twice = [*good[:3], deltas[0], *good[3:]]  # a stale worker's delta shown again
    history.streams[0] = _stream("ai-sdk", twice, done=True, closed=True)
    assert "stream text" in _check(history, committed)[0]
    history.fault("kill", "worker2")  # ... unless a fault struck while it streamed
    history.faults[0].start = 100.5
    assert _check(history, committed) == []
    history.streams[0] = _stream("ai-sdk", [*good, good[2]], done=True, closed=True)
    assert any("framing" in v for v in _check(history, committed))
    outside = [good[0], deltas[0], *good[1:]]
    history.streams[0] = _stream("ai-sdk", outside, done=True, closed=True)
    assert any("outside its text" in v for v in _check(history, committed))


def test_checker_flags_ag_ui_streams_that_break_framing_or_converge_elsewhere() -> None:
    user = {"id": "u", "thread_id": "t", "role": "user", "run_id": None, "parts": [_t("q")]}
    reply = {"id": "a", "thread_id": "t", "role": "assistant", "run_id": "r", "parts": [_t("hi")]}
    committed = Committed([user, reply], [{"id": "r", "thread_id": "t", "status": "completed"}], [])
    shown = [{"id": "u", "role": "user", "content": "q"}, {"id": "a", "role": "assistant"}]
    shown[1]["content"] = "hi"
    closing: dict[str, Any] = {"type": "MESSAGES_SNAPSHOT", "messages": shown}
    events: list[dict[str, Any]] = [
        {"type": "RUN_STARTED", "runId": "r"},
        closing,
        {"type": "RUN_FINISHED"},
    ]
    history = History()
    history.streams.append(_stream("ag-ui", events, closed=True))
    assert _check(history, committed) == []
    stale: dict[str, Any] = {
        "type": "MESSAGES_SNAPSHOT",
        "messages": [shown[0], {**shown[1], "content": "h"}],
    }
    history.streams[0] = _stream("ag-ui", [events[0], stale, events[2]], closed=True)
    assert "stream convergence" in _check(history, committed)[0]
    history.streams[0] = _stream("ag-ui", events[:2], closed=True)
    assert "without RUN_FINISHED" in _check(history, committed)[0]
    history.streams[0] = _stream("ag-ui", [*events, closing], closed=True)
    assert "after the run's end" in _check(history, committed)[0]


def test_a_run_still_moving_at_the_settles_cap_is_unknown_not_a_violation() -> None:
    runs = [{"id": "r", "thread_id": "t", "status": "running"}]
    stuck = Checker(History(), Committed([], runs, []), seed=0)
    assert any("unsettled run" in v for v in stuck.run()) and stuck.unknown == []
    loaded = Checker(History(), Committed([], runs, []), seed=0, still_moving=True)
    assert loaded.run() == []
    assert "unsettled run" in loaded.unknown[0]
