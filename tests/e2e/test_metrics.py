"""A real Prometheus scrapes a gateway and a worker (its own metrics port) during an e2e run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.e2e import cluster, harness
from tests.e2e.prometheus_server import Prometheus, prometheus
from tests.services import require_postgres, require_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

RUNS = 3


@pytest.fixture(scope="module")
def scraped() -> Iterator[tuple[cluster.Cluster, Prometheus, int]]:
    require_postgres()
    require_redis()
    worker_metrics = harness.free_port()
    with cluster.cluster([]) as running:
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
    scraped: tuple[cluster.Cluster, Prometheus, int],
) -> None:
    running, prom, _ = scraped
    gateway = running.gateways[0]
    tokens = running.tokens({"alice": ("metrics", "user", "alice")})
    headers = {"Authorization": f"Bearer {tokens['alice']}"}
    up = await asyncio.to_thread(prom.wait_value, 'sum(up{job="threadline"})', 2.0)
    assert up == 2.0, prom.log()

    async with (
        connect(gateway.ws_url, additional_headers=headers),
        connect(gateway.ws_url, additional_headers=headers),
        httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=10) as http,
    ):
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
    closed = await asyncio.to_thread(
        prom.wait_value, 'threadline_ws_connections{role="gateway"}', 0.0
    )
    assert closed == 0.0
    # Low cardinality: no series carries a thread or run id.
    names = prom.query('{job="threadline", __name__=~"threadline_.*"}')
    assert names
    assert not [s for s in names if {"thread_id", "run_id"} & set(s["metric"])]
