"""Schedules on a cluster: two workers fire a per-second schedule exactly once per fire time,
and with every worker down the missed-fire policy decides (run once on recovery, or skip)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e import cluster
from tests.services import require_postgres, require_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

FIRST_PHASE = 9.0  # seconds of fires with both workers up
OUTAGE = 5.0  # both workers stopped
LAST_PHASE = 6.0


@pytest.fixture
def running() -> Iterator[cluster.Cluster]:
    require_postgres()
    require_redis()
    with cluster.cluster(["gateway", "worker", "worker"]) as started:
        yield started


def fires(http: httpx.Client, schedule_id: str) -> list[dict[str, Any]]:
    response = http.get(f"/v1/schedules/{schedule_id}/fires", params={"limit": 500})
    assert response.status_code == 200, response.text
    return sorted(response.json()["fires"], key=lambda fire: fire["fire_at"])


def user_messages(http: httpx.Client, thread_id: str) -> int:
    """User messages of the thread once its runs and queue are done (bounded wait)."""
    deadline = time.monotonic() + 30
    snapshot: dict[str, Any] = {}
    while time.monotonic() < deadline:
        snapshot = http.get(f"/v1/threads/{thread_id}", params={"limit": 500}).json()
        run = snapshot["run"]
        if not snapshot["queue"] and (run is None or run["status"] == "completed"):
            return sum(1 for m in snapshot["messages"] if m["role"] == "user")
        time.sleep(0.1)
    raise AssertionError(f"thread {thread_id} never settled: {snapshot['run']}")


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times) if b - a != 1.0]


def test_every_fire_runs_once_and_missed_fires_follow_the_policy(
    running: cluster.Cluster,
) -> None:
    gateway = running.gateways[0]
    token = running.tokens({"alice": ("clock", "user", "alice")})["alice"]
    with httpx.Client(
        base_url=gateway.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as http:
        schedules = {}
        for missed in ("run_once", "skip"):
            thread = http.post("/v1/threads", json={"title": missed}).json()["thread"]["id"]
            made = http.post(
                "/v1/schedules",
                json={
                    "thread_id": thread,
                    "cron": "* * * * * *",
                    "text": f"tick {missed}",
                    "missed": missed,
                    "misfire_grace": 2,
                },
            )
            assert made.status_code == 201, made.text
            schedules[missed] = (made.json()["schedule"]["id"], thread)
        time.sleep(FIRST_PHASE)
        workers = [p for p in running.processes if p.role == "worker"]
        for worker in workers:
            worker.stop()
        stopped_at = time.time()
        time.sleep(OUTAGE)
        running.start(["worker", "worker"])
        restarted_at = time.time()
        time.sleep(LAST_PHASE)
        for schedule_id, _ in schedules.values():
            assert http.post(f"/v1/schedules/{schedule_id}/pause").status_code == 200

        report = {}
        for missed, (schedule_id, thread) in schedules.items():
            fired = fires(http, schedule_id)
            times = [fire["fire_at"] for fire in fired]
            report[missed] = (len(fired), gaps(times))
            assert len(set(times)) == len(times)  # none doubled
            # Before and after the outage, one fire per second, none missed; across it,
            # exactly one jump, as long as the workers were down. The fire before the jump is
            # the first one missed (its due time), fired on recovery: the only late one.
            [jump] = gaps(times)
            assert jump >= OUTAGE - 1, report
            late = [f for f in fired if f["fired_at"] - f["fire_at"] > 2]
            assert len(late) == 1, late
            resumed = late[0]
            assert stopped_at - 3 <= resumed["fire_at"] <= stopped_at + 1
            assert resumed["fired_at"] >= restarted_at - 1
            assert times.index(resumed["fire_at"]) + 1 == times.index(
                next(t for t in times if t - resumed["fire_at"] == jump)
            )
            on_time = [f for f in fired if f is not resumed]
            assert all(f["outcome"] in ("admitted", "queued") for f in on_time), on_time
            runs = [f["run_id"] for f in fired if f["run_id"]]
            assert len(set(runs)) == len(runs)
            if missed == "run_once":
                assert resumed["outcome"] in ("admitted", "queued")
                assert resumed["detail"] == "missed; run once on recovery"
            else:
                assert resumed["outcome"] == "skipped_missed"
            # Exactly one run (one user message) per fire that admitted input.
            admitted = sum(1 for f in fired if f["outcome"] in ("admitted", "queued"))
            assert user_messages(http, thread) == admitted, report
            assert len(fired) >= FIRST_PHASE + LAST_PHASE - 4, report
        print(f"fires per schedule and gaps: {report}")
