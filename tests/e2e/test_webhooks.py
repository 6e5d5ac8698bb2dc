"""Webhooks end to end: signed deliveries to a real receiver through failures and an outage, a
sender SIGKILLed mid-delivery, the addresses and redirects that are refused, and the attempts'
metrics by outcome (the dead letter here; delivered and retried in test_metrics.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.hooks.hooks_service import new_secret
from tests.e2e import harness
from tests.e2e.prometheus_server import scrape
from tests.e2e.webhook_receiver import Receiver

SECRET = new_secret()
FAST_RETRIES = {
    "THREADLINE_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",
    "THREADLINE_WEBHOOK_INITIAL_BACKOFF": "0.3",
    "THREADLINE_WEBHOOK_MAX_BACKOFF": "1.5",
    "THREADLINE_WEBHOOK_TIMEOUT": "2",
    "THREADLINE_WEBHOOK_POLL_INTERVAL": "0.1",
    "THREADLINE_WEBHOOK_MAX_AGE": "120",
}


@dataclass
class Deployment:
    gateway: harness.ServerHandle
    worker: harness.ServerHandle
    env: dict[str, str]
    log_dir: Path
    svc: httpx.Client
    user: httpx.Client

    def restart_worker(self) -> None:
        self.worker = harness.start("worker", self.env, log_dir=self.log_dir)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A gateway and a worker sharing one SQLite file, allowed to post to loopback."""
    directory = tmp_path_factory.mktemp("webhooks")
    env = harness.server_env(harness.sqlite_url(directory), FAST_RETRIES)
    gateway = harness.start("gateway", env, log_dir=directory)
    worker = harness.start("worker", env, log_dir=directory)
    svc_token = gateway.token("hooks", "backend", "svc")
    user_token = gateway.token("hooks", "user", "alice")
    clients = [
        httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {t}"}, timeout=10)
        for t in (svc_token, user_token)
    ]
    running = Deployment(gateway, worker, env, directory, *clients)
    try:
        yield running
    finally:
        for client in clients:
            client.close()
        running.worker.stop()
        gateway.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver(SECRET)
    started.start()
    try:
        yield started
    finally:
        started.stop()


def subscribe(svc: httpx.Client, url: str, **body: Any) -> str:
    made = svc.post("/v1/webhooks", json={"url": url, "secret": SECRET, **body})
    assert made.status_code == 201, made.text
    assert made.json()["webhook"]["secret"] == SECRET
    assert "secret" not in svc.get("/v1/webhooks").text
    return str(made.json()["webhook"]["id"])


def deliveries(svc: httpx.Client, webhook_id: str) -> list[dict[str, Any]]:
    answer = svc.get(f"/v1/webhooks/{webhook_id}/deliveries", params={"limit": 500})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["deliveries"])


def attempts(svc: httpx.Client, delivery_id: str) -> list[dict[str, Any]]:
    answer = svc.get(f"/v1/deliveries/{delivery_id}/attempts")
    assert answer.status_code == 200, answer.text
    return list(answer.json()["attempts"])


def wait_for(what: str, check: Any, timeout: float = 40.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def run_events(deployment: Deployment) -> str:
    """A run that completes, and one that waits for approval then completes: six events."""
    user = deployment.user
    thread = user.post("/v1/threads", json={}).json()["thread"]["id"]
    assert user.post(f"/v1/threads/{thread}/messages", json={"text": "hello"}).status_code == 202

    def idle() -> bool:
        run = user.get(f"/v1/threads/{thread}").json()["run"]
        return run is not None and run["status"] in ("completed", "waiting")

    wait_for("the first run", idle)
    sent = user.post(f"/v1/threads/{thread}/messages", json={"text": "email bob@example.com"})
    assert sent.status_code == 202

    def pending() -> list[dict[str, Any]]:
        return list(user.get(f"/v1/threads/{thread}").json()["pending_actions"])

    [action] = wait_for("the approval", pending)
    resumed = user.post(
        f"/v1/threads/{thread}/actions/{action['id']}/resume", json={"payload": {"approved": True}}
    )
    assert resumed.status_code == 200, resumed.text
    return str(thread)


def test_failures_and_an_outage_end_in_delivery_with_every_retry_logged(
    deployment: Deployment, receiver: Receiver
) -> None:
    receiver.behaviours["/hook"] = lambda n: 500 if n <= 3 else 204
    webhook = subscribe(deployment.svc, receiver.url("/hook"))
    thread = run_events(deployment)
    wait_for("three refused attempts", lambda: len(receiver.of("/hook")) >= 3)
    receiver.stop()  # down for 10 s: attempts meanwhile fail to connect
    time.sleep(10)
    receiver.start()

    def all_delivered() -> list[dict[str, Any]] | None:
        found = deliveries(deployment.svc, webhook)
        done = len(found) == 6 and all(d["state"] == "delivered" for d in found)
        return found if done else None

    found = wait_for("every event delivered", all_delivered)
    assert sorted(d["event_type"] for d in found) == sorted(
        ["run.started", "run.completed"] * 2 + ["action.created", "action.resolved"]
    )
    got = receiver.of("/hook")
    assert got and all(r.verified for r in got), [r for r in got if not r.verified]
    delivered_ids = {r.webhook_id for r in got}
    assert delivered_ids == {d["id"] for d in found}  # every event, each by its stable id
    for delivery in found:
        bodies = [r.body for r in got if r.webhook_id == delivery["id"]]
        assert all(body == delivery["payload"] for body in bodies)  # the same bytes each time
        assert delivery["payload"]["data"]["thread_id"] == thread
    log = [a for d in found for a in attempts(deployment.svc, d["id"])]
    statuses = [a["status_code"] for a in log]
    assert statuses.count(500) == 3, statuses
    refused = [a for a in log if a["status_code"] is None]
    assert refused and all(a["error"] for a in refused), "no attempt saw the outage"
    assert all(a["latency_ms"] is not None for a in log)
    print(f"{len(found)} events, {len(log)} attempts: {statuses}")


def test_retry_after_is_honoured(deployment: Deployment, receiver: Receiver) -> None:
    receiver.behaviours["/later"] = lambda n: (503, {"retry-after": "3"}) if n == 1 else 204
    subscribe(deployment.svc, receiver.url("/later"), events=["run.completed"])
    user = deployment.user
    thread = user.post("/v1/threads", json={}).json()["thread"]["id"]
    user.post(f"/v1/threads/{thread}/messages", json={"text": "hi"})
    first, second = wait_for(
        "a retry", lambda: receiver.of("/later")[:2] if len(receiver.of("/later")) >= 2 else None
    )
    assert first.webhook_id == second.webhook_id
    assert second.at - first.at >= 2.9  # not the 0.3 s backoff: the receiver's 3 s


def test_redirects_and_refused_addresses(deployment: Deployment, receiver: Receiver) -> None:
    metadata = "http://169.254.169.254/latest/meta-data/"
    receiver.behaviours["/moved"] = lambda n: (307, {"location": metadata})
    webhook = subscribe(deployment.svc, receiver.url("/moved"), events=["run.completed"])
    user = deployment.user
    thread = user.post("/v1/threads", json={}).json()["thread"]["id"]
    user.post(f"/v1/threads/{thread}/messages", json={"text": "hi"})

    def attempted() -> list[dict[str, Any]]:
        found = deliveries(deployment.svc, webhook)
        return attempts(deployment.svc, found[0]["id"]) if found else []

    [first, *_] = wait_for("an attempt", attempted)
    assert first["status_code"] == 307 and first["error"] == "redirects are not followed"
    for url in (metadata, "http://[::ffff:169.254.169.254]/", "http://10.0.0.1/", "ftp://x/"):
        refused = deployment.svc.post("/v1/webhooks", json={"url": url})
        assert refused.status_code == 422, (url, refused.text)
        assert refused.json()["error"]["code"] == "invalid_input"


def test_loopback_is_refused_without_the_allow_list(tmp_path: Path) -> None:
    with harness.start("all", log_dir=tmp_path) as server:
        token = server.token("hooks", "backend", "svc")
        headers = {"Authorization": f"Bearer {token}"}
        for url in ("http://127.0.0.1:9/hook", "http://localhost:9/hook", "http://[::1]:9/"):
            refused = httpx.post(f"{server.url}/v1/webhooks", json={"url": url}, headers=headers)
            assert refused.status_code == 422, (url, refused.text)
        user = server.token("hooks", "user", "alice")
        forbidden = httpx.post(
            f"{server.url}/v1/webhooks",
            json={"url": "http://93.184.215.14/"},
            headers={"Authorization": f"Bearer {user}"},
        )
        assert forbidden.status_code == 403, forbidden.text


def test_a_sender_killed_mid_delivery_is_followed_by_the_same_webhook_id(
    deployment: Deployment, receiver: Receiver
) -> None:
    webhook = subscribe(deployment.svc, receiver.url("/hold"), events=["run.completed"])
    user = deployment.user
    thread = user.post("/v1/threads", json={}).json()["thread"]["id"]
    user.post(f"/v1/threads/{thread}/messages", json={"text": "hi"})
    wait_for("the held request", lambda: receiver.of("/hold"))
    deployment.worker.process.kill()  # SIGKILL while the request is in flight
    deployment.worker.stop()
    deployment.restart_worker()
    [held, again] = wait_for(
        "the redelivery", lambda: receiver.of("/hold") if len(receiver.of("/hold")) >= 2 else None
    )
    assert held.webhook_id == again.webhook_id and held.verified and again.verified
    [delivery] = wait_for(
        "delivered",
        lambda: [d for d in deliveries(deployment.svc, webhook) if d["state"] == "delivered"],
    )
    assert delivery["id"] == held.webhook_id


def webhook_attempts(server: harness.ServerHandle) -> dict[str, float]:
    """The server's `threadline_webhook_attempts_total` by outcome, read from its /metrics."""
    samples = scrape(f"{server.url}/metrics", "threadline_webhook_attempts_total")
    return {dict(labels)["outcome"]: value for labels, value in samples.items()}


def test_a_dead_lettered_delivery_is_counted_as_dead(tmp_path: Path, receiver: Receiver) -> None:
    """Attempts that fail past the maximum age end in the dead letter: /metrics counts each
    attempt by its outcome, as the attempt log has them."""
    receiver.behaviours["/down"] = lambda n: 500
    env = harness.server_env(
        harness.sqlite_url(tmp_path), {**FAST_RETRIES, "THREADLINE_WEBHOOK_MAX_AGE": "1"}
    )
    with harness.start("all", env, log_dir=tmp_path) as server:
        svc = httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {server.token('hooks', 'backend', 'svc')}"},
            timeout=10,
        )
        user = server.token("hooks", "user", "alice")
        with svc:
            webhook = subscribe(svc, receiver.url("/down"), events=["run.completed"])
            thread = svc.post("/v1/threads", json={}).json()["thread"]["id"]
            sent = httpx.post(
                f"{server.url}/v1/threads/{thread}/messages",
                json={"text": "hi"},
                headers={"Authorization": f"Bearer {user}"},
            )
            assert sent.status_code == 202, sent.text
            [dead] = wait_for(
                "the dead letter",
                lambda: [d for d in deliveries(svc, webhook) if d["state"] == "dead"],
            )
            log = attempts(svc, dead["id"])
            counts = webhook_attempts(server)
    assert log and all(a["status_code"] == 500 for a in log)
    assert counts.get("dead") == 1, counts
    assert counts.get("retried", 0) == len(log) - 1, (counts, log)
    assert counts.get("delivered", 0) == 0
