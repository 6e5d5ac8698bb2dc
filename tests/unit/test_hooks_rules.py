"""Schedule fire plans, the outbound address guard and the delivery retry rules, without I/O."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from runtime.hooks.delivery import (
    DeliveryPolicy,
    outcome_label,
    outcome_of,
    post,
    retry_after_seconds,
    sign,
)
from runtime.hooks.hooks_service import new_secret
from runtime.hooks.outbound import RefusedUrl, parse_networks, refusal, resolve
from runtime.storage.hooks_store import ClaimedDelivery, Delivery, DeliveryState, MissedFire
from runtime.storage.schedule_rules import next_cron_time, plan_fire

EVERY_SECOND = "* * * * * *"


def test_an_on_time_fire_is_followed_by_the_next_one_after_it() -> None:
    plan = plan_fire(
        cron=EVERY_SECOND, timezone="UTC", due=100.0, now=100.4, grace=2, missed=MissedFire.SKIP
    )
    assert plan.admit and not plan.missed and plan.next_due == 101.0
    # Within the grace, fires are caught up one by one.
    plan = plan_fire(
        cron=EVERY_SECOND, timezone="UTC", due=100.0, now=101.5, grace=2, missed=MissedFire.SKIP
    )
    assert plan.admit and plan.next_due == 101.0


@pytest.mark.parametrize(
    ("missed", "admit"), [(MissedFire.RUN_ONCE, True), (MissedFire.SKIP, False)]
)
def test_missed_fires_collapse_and_resume_after_now(missed: MissedFire, admit: bool) -> None:
    plan = plan_fire(
        cron=EVERY_SECOND, timezone="UTC", due=100.0, now=110.5, grace=2, missed=missed
    )
    assert plan.missed and plan.admit is admit and plan.next_due == 111.0
    one_off = plan_fire(cron=None, timezone="UTC", due=100.0, now=110.5, grace=2, missed=missed)
    assert one_off.admit is admit and one_off.next_due is None


def test_cron_times_follow_the_time_zone_across_daylight_saving() -> None:
    # 09:00 in Paris is 08:00 UTC in winter, 07:00 UTC in summer (DST began 2026-03-29).
    before = datetime(2026, 3, 27, 12, tzinfo=UTC).timestamp()
    first = next_cron_time("0 9 * * *", "Europe/Paris", before)
    assert first is not None
    second = next_cron_time("0 9 * * *", "Europe/Paris", first)
    assert second is not None
    assert datetime.fromtimestamp(first, UTC).hour == 8
    assert datetime.fromtimestamp(second, UTC).hour == 7


ALLOW_LOOPBACK = parse_networks("127.0.0.0/8, ::1")


@pytest.mark.parametrize(
    ("address", "allow", "refused"),
    [
        ("127.0.0.1", (), True),
        ("127.0.0.1", ALLOW_LOOPBACK, False),
        ("::1", (), True),
        ("::ffff:127.0.0.1", (), True),
        ("10.1.2.3", (), True),
        ("192.168.0.10", ALLOW_LOOPBACK, True),
        ("169.254.169.254", (), True),
        ("169.254.169.254", parse_networks("169.254.0.0/16"), True),  # a range never opens it
        ("169.254.169.254", parse_networks("169.254.169.254/32"), False),
        ("fd00:ec2::254", (), True),
        ("0.0.0.0", (), True),
        ("93.184.215.14", (), False),
    ],
)
def test_the_address_guard(address: str, allow: tuple[object, ...], refused: bool) -> None:
    reason = refusal(ipaddress.ip_address(address), allow)  # type: ignore[arg-type]
    assert (reason is not None) is refused, reason


async def test_urls_are_resolved_and_every_address_checked() -> None:
    for url in ("http://localhost:9/", "http://127.0.0.1/", "http://[::1]/", "gopher://x/"):
        with pytest.raises(RefusedUrl):
            await resolve(url, ())
    target = await resolve("http://127.0.0.1:8080/hook", ALLOW_LOOPBACK)
    assert str(target.address) == "127.0.0.1" and target.port == 8080


def _claimed(
    attempts: int = 0, occurred_at: float = 1000.0, url: str = "http://x/"
) -> ClaimedDelivery:
    delivery = Delivery(
        id="msg_1",
        subscription_id="wh_1",
        scope="s",
        event_type="run.completed",
        thread_id="th_1",
        run_id="run_1",
        action_id=None,
        message_id=None,
        detail=None,
        occurred_at=occurred_at,
        state=DeliveryState.PENDING,
        attempts=attempts,
        next_attempt_at=occurred_at,
        last_status=None,
        last_error=None,
        delivered_at=None,
    )
    return ClaimedDelivery(delivery=delivery, url=url, secret=new_secret(), token=1)


def test_backoff_is_exponential_jittered_and_retry_after_wins() -> None:
    policy = DeliveryPolicy(initial_backoff=1.0, max_backoff=8.0)
    for attempt, base in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)):
        waits = {policy.backoff(attempt, None) for _ in range(20)}
        assert all(base / 2 <= w <= base for w in waits) and len(waits) > 1
    assert policy.backoff(1, 30.0) == 30.0
    assert policy.backoff(1, 10**6) == policy.max_retry_after
    assert retry_after_seconds("7", 0.0) == 7.0
    assert retry_after_seconds("Thu, 01 Jan 1970 00:01:40 GMT", 40.0) == 60.0
    assert retry_after_seconds("soon", 0.0) is None


def test_outcomes_retry_until_the_age_runs_out_then_park() -> None:
    policy = DeliveryPolicy(initial_backoff=1.0, max_backoff=4.0, max_age=60.0)
    ok = outcome_of(_claimed(), policy, (204, None, None, 5.0), now=1001.0)
    assert ok.delivered and ok.retry_in is None
    failed = outcome_of(_claimed(), policy, (500, None, None, 5.0), now=1001.0)
    assert not failed.delivered and failed.retry_in is not None
    too_old = outcome_of(_claimed(attempts=9), policy, (500, None, None, 5.0), now=1059.0)
    assert not too_old.delivered and too_old.retry_in is None  # dead-lettered
    refused = outcome_of(_claimed(), policy, (None, "refused: loopback", None, 0.0), now=1001.0)
    assert refused.retry_in is None


def test_the_metrics_label_of_an_attempt_is_its_outcome() -> None:
    policy = DeliveryPolicy(initial_backoff=1.0, max_backoff=4.0, max_age=60.0)
    ok = outcome_of(_claimed(), policy, (204, None, None, 5.0), now=1001.0)
    failed = outcome_of(_claimed(), policy, (500, None, None, 5.0), now=1001.0)
    too_old = outcome_of(_claimed(attempts=9), policy, (500, None, None, 5.0), now=1059.0)
    refused = outcome_of(_claimed(), policy, (None, "refused: loopback", None, 0.0), now=1001.0)
    labels = [outcome_label(o) for o in (ok, failed, too_old, refused)]
    assert labels == ["delivered", "retried", "dead", "dead"]
    # Not logged: another worker took the claim over and posts the delivery again.
    assert {outcome_label(o, logged=False) for o in (ok, failed)} == {"taken_over"}


def test_signatures_verify_with_the_standard_webhooks_package() -> None:
    secret = new_secret()
    body = '{"type":"run.completed"}'
    headers = sign(secret, "msg_1", datetime.now(UTC), body)
    assert Webhook(secret).verify(body, headers) == {"type": "run.completed"}
    with pytest.raises(Exception, match="signature"):
        Webhook(new_secret()).verify(body, headers)


async def test_a_refused_url_is_never_posted() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"posted to {request.url}")

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        for url in ("http://127.0.0.1:9/", "http://169.254.169.254/latest/meta-data/"):
            status, error, _, _ = await post(client, _claimed(url=url), DeliveryPolicy())
            assert status is None and error is not None and error.startswith("refused")
