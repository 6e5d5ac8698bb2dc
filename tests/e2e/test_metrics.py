"""A real Prometheus scrapes a gateway and a worker (its own metrics port) during an e2e run:
run counters, the connection gauge, and the worker's webhook deliveries to a real receiver."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from runtime.hooks.hooks_service import new_secret
from tests.e2e import cluster, harness
from tests.e2e.prometheus_server import Prometheus, prometheus, scrape
from tests.e2e.webhook_receiver import Receiver
from tests.services import require_postgres, require_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

RUNS = 3
SECRET = new_secret()
# The worker may post to the loopback receiver, and looks for due deliveries often.
WEBHOOKS = {
    "THREADLINE_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",
    "THREADLINE_WEBHOOK_POLL_INTERVAL": "0.1",
}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    started = Receiver(SECRET)
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def scraped(receiver: Receiver) -> Iterator[tuple[cluster.Cluster, Prometheus, int]]:
    require_postgres()
    require_redis()
    worker_metrics = harness.free_port()
    with cluster.cluster([], extra=WEBHOOKS) as running:
        (gateway,) = running.start(["gateway"])
        running.start(["worker"], extra={"THREADLINE_METRICS_PORT": str(worker_metrics)})
        targets = [
            (f"127.0.0.1:{gateway.port}", "gateway"),
            (f"127.0.0.1:{worker_metrics}", "worker"),
        ]
        with prometheus(targets) as prom:
            yield running, prom, worker_metrics


def test_the_worker_serves_metrics_on_its_own_port_only(
    scraped: tuple[cluster.Cluster, Prometheus, int],
) -> None:
    running, _, worker_metrics = scraped
    worker = next(p for p in running.processes if p.role == "worker")
    assert httpx.get(f"http://127.0.0.1:{worker_metrics}/metrics").status_code == 200
    assert httpx.get(f"{worker.url}/metrics").status_code == 404


async def test_prometheus_sees_the_run_counters_and_the_connection_gauge(
    scraped: tuple[cluster.Cluster, Prometheus, int], receiver: Receiver
) -> None:
    running, prom, _ = scraped
    gateway = running.gateways[0]
    tokens = running.tokens(
        {"alice": ("metrics", "user", "alice"), "svc": ("metrics", "backend", "svc")}
    )
    headers = {"Authorization": f"Bearer {tokens['alice']}"}
    up = await asyncio.to_thread(prom.wait_value, 'sum(up{job="threadline"})', 2.0)
    assert up == 2.0, prom.log()

    async with (
        connect(gateway.ws_url, additional_headers=headers),
        connect(gateway.ws_url, additional_headers=headers),
        httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=10) as http,
    ):
        # Odd-numbered requests fail (500), even ones are delivered: whatever the order of
        # the attempts, the third delivery is the sixth request, after three retried ones.
        receiver.behaviours["/metrics-hook"] = lambda n: 500 if n % 2 else 204
        subscribed = await http.post(
            "/v1/webhooks",
            json={
                "url": receiver.url("/metrics-hook"),
                "secret": SECRET,
                "events": ["run.completed"],
            },
            headers={"Authorization": f"Bearer {tokens['svc']}"},
        )
        assert subscribed.status_code == 201, subscribed.text
        for n in range(RUNS):
            thread = (await http.post("/v1/threads", json={})).json()["thread"]
            sent = await http.post(f"/v1/threads/{thread['id']}/messages", json={"text": f"hi {n}"})
            assert sent.status_code == 202, sent.text
        completed = await asyncio.to_thread(
            prom.wait_value,
            'sum(threadline_runs_total{role="worker", event="completed"})',
            float(RUNS),
        )
        assert completed == RUNS, running.logs()
        sockets = await asyncio.to_thread(
            prom.wait_value, 'threadline_ws_connections{role="gateway"}', 2.0
        )
        assert sockets == 2.0
        # Only the worker runs episodes; the gateway admitted them.
        started = prom.value('sum(threadline_runs_total{role="worker", event="started"})')
        assert started == RUNS
        assert prom.value('sum(threadline_runs_total{role="gateway"})') is None
        count = prom.value('sum(threadline_run_duration_seconds_count{role="worker"})')
        assert count == RUNS
        # One run.completed per run.
        delivered = await asyncio.to_thread(
            prom.wait_value,
            'threadline_webhook_attempts_total{role="worker", outcome="delivered"}',
            float(RUNS),
        )
        assert delivered == RUNS, running.logs()
        retried = 'threadline_webhook_attempts_total{role="worker", outcome="retried"}'
        assert prom.value(retried) == RUNS
        latencies = 'sum(threadline_webhook_attempt_duration_seconds_count{role="worker"})'
        assert prom.value(latencies) == 2 * RUNS
        assert len(receiver.of("/metrics-hook")) == 2 * RUNS
    closed = await asyncio.to_thread(
        prom.wait_value, 'threadline_ws_connections{role="gateway"}', 0.0
    )
    assert closed == 0.0
    # Low cardinality: no series carries a thread or run id.
    names = prom.query('{job="threadline", __name__=~"threadline_.*"}')
    assert names
    assert not [s for s in names if {"thread_id", "run_id"} & set(s["metric"])]


def _until(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_queue_depth_active_leases_and_refusals(tmp_path: Path) -> None:
    """A gateway with no worker yet: a queued run and queued input behind it are the queue
    depth, input past the queue's limit a `queue_full` refusal. Then a worker (its own metrics
    port) takes the run: one active lease while it streams, no queued run left."""
    env = harness.server_env(
        harness.sqlite_url(tmp_path),
        # About 16 s of streaming for the reply below: long enough to be seen running.
        {"THREADLINE_QUEUE_MAX_ITEMS": "1", "THREADLINE_DEMO_DELAY_MS": "80"},
    )
    with harness.start("gateway", env, log_dir=tmp_path) as gateway:
        token = gateway.token("depth")
        metrics = f"{gateway.url}/metrics"
        with httpx.Client(
            base_url=gateway.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
        ) as http:
            thread = http.post("/v1/threads", json={}).json()["thread"]["id"]
            answers = [
                http.post(f"/v1/threads/{thread}/messages", json={"text": text})
                for text in ("drain " * 170, "second", "third")
            ]
        assert [a.status_code for a in answers[:2]] == [202, 202], answers[1].text
        assert answers[2].json()["error"]["code"] == "queue_full", answers[2].text
        depth = scrape(metrics, "threadline_queue_depth")
        assert depth == {frozenset({("kind", "run")}): 1.0, frozenset({("kind", "item")}): 1.0}
        refusals = scrape(metrics, "threadline_quota_refusals_total")
        assert refusals == {frozenset({("code", "queue_full")}): 1.0}

        port = harness.free_port()
        worker_env = {**env, "THREADLINE_METRICS_PORT": str(port)}
        with harness.start("worker", worker_env, log_dir=tmp_path):
            leases = f"http://127.0.0.1:{port}/metrics"
            _until(
                "the worker's lease",
                lambda: scrape(leases, "threadline_worker_active_leases") == {frozenset(): 1.0},
            )
            queued = scrape(metrics, "threadline_queue_depth")
            assert queued[frozenset({("kind", "run")})] == 0.0
            assert queued[frozenset({("kind", "item")})] == 1.0
