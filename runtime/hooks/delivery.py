"""The webhook delivery worker: claims due outbox rows, posts them signed, logs every attempt."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
import orjson
from standardwebhooks.webhooks import Webhook

from runtime import instruments
from runtime.hooks.outbound import Network, RefusedUrl, resolve
from runtime.storage.hooks_store import AttemptOutcome, ClaimedDelivery, HooksStore
from runtime.storage.sql.rows import new_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeliveryPolicy:
    """Retries: exponential backoff from `initial_backoff` doubling to `max_backoff`, jittered
    over its upper half; a longer `Retry-After` wins (up to `max_retry_after`); a delivery
    that would still be retried `max_age` seconds after its event (or its redelivery) is
    dead-lettered instead."""

    timeout: float = 10.0
    initial_backoff: float = 1.0
    max_backoff: float = 300.0
    max_age: float = 24 * 3600.0
    max_response_bytes: int = 64 * 1024
    max_retry_after: float = 3600.0
    allow: tuple[Network, ...] = ()
    concurrency: int = 8

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        base = min(self.max_backoff, self.initial_backoff * 2 ** max(attempt - 1, 0))
        wait = random.uniform(base / 2, base)  # jitter: retries of one outage spread out
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_retry_after))
        return wait


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """`Retry-After` as seconds or an HTTP date (RFC 9110); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError):
        return None


def sign(secret: str, delivery_id: str, timestamp: datetime, body: str) -> dict[str, str]:
    """The Standard Webhooks headers, signed by the `standardwebhooks` package."""
    signature = Webhook(secret).sign(delivery_id, timestamp, body)
    return {
        "webhook-id": delivery_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
        "user-agent": "threadline-webhooks",
    }


async def post(
    client: httpx.AsyncClient, claimed: ClaimedDelivery, policy: DeliveryPolicy
) -> tuple[int | None, str | None, float | None, float]:
    """One attempt: (status, error, retry_after, latency in ms). The address posted to is the
    one checked; redirects are never followed; at most `max_response_bytes` are read."""
    started = time.monotonic()
    delivery = claimed.delivery
    body = orjson.dumps(delivery.payload()).decode()
    try:
        target = await resolve(claimed.url, policy.allow)
    except RefusedUrl as exc:
        return None, f"refused: {exc.message}", None, 0.0
    parts = httpx.URL(claimed.url)
    url = parts.copy_with(host=str(target.address))
    headers = sign(claimed.secret, delivery.id, datetime.now(UTC), body)
    headers["host"] = parts.netloc.decode()
    status: int | None = None
    error: str | None = None
    retry_after: float | None = None
    try:
        async with client.stream(
            "POST",
            url,
            content=body.encode(),
            headers=headers,
            extensions={"sni_hostname": target.host},
        ) as response:
            status = response.status_code
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read > policy.max_response_bytes:
                    break  # the status is the answer; the rest is not read
            retry_after = retry_after_seconds(response.headers.get("retry-after"), time.time())
            if 300 <= status < 400:
                error = "redirects are not followed"
    except httpx.TimeoutException:
        error = "timed out"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    return status, error, retry_after, (time.monotonic() - started) * 1000


def outcome_of(
    claimed: ClaimedDelivery,
    policy: DeliveryPolicy,
    result: tuple[int | None, str | None, float | None, float],
    now: float,
) -> AttemptOutcome:
    status, error, retry_after, latency = result
    delivered = status is not None and 200 <= status < 300
    retry_in: float | None = None
    refused = error is not None and error.startswith("refused")
    if not delivered and not refused:
        delivery = claimed.delivery
        wait = policy.backoff(delivery.attempts + 1, retry_after)
        start = delivery.retry_from if delivery.retry_from is not None else delivery.occurred_at
        if now + wait - start <= policy.max_age:
            retry_in = wait
    return AttemptOutcome(
        status_code=status,
        latency_ms=latency,
        error=error,
        delivered=delivered,
        retry_in=retry_in,
    )


def outcome_label(outcome: AttemptOutcome, logged: bool = True) -> str:
    """The `outcome` label of an attempt's metrics: delivered, retried, dead, or taken_over
    (not `logged`: the claim was lost, another worker posts the delivery again)."""
    if not logged:
        return "taken_over"
    if outcome.delivered:
        return "delivered"
    return "retried" if outcome.retry_in is not None else "dead"


def count_attempt(outcome: AttemptOutcome, logged: bool) -> None:
    """Record one attempt in the webhook metrics; never raises (telemetry never changes a
    delivery)."""
    labels = {"outcome": outcome_label(outcome, logged)}
    instruments.safe_add(instruments.WEBHOOK_ATTEMPTS, 1, labels)
    instruments.safe_record(instruments.WEBHOOK_ATTEMPT_DURATION, outcome.latency_ms / 1000, labels)


class DeliveryWorker:
    """Runs in every worker process; deliveries are leased, so any number may run. A worker
    killed mid-post leaves its lease to expire: the delivery is posted again, same id."""

    def __init__(
        self,
        store: HooksStore,
        policy: DeliveryPolicy,
        *,
        poll_interval: float = 0.5,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.poll_interval = poll_interval
        self.owner = owner or new_id("deliverer")
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> DeliveryWorker:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.policy.timeout),
            follow_redirects=False,
            trust_env=False,  # never through a proxy the environment names: it would skip the check
        )
        self._task = asyncio.create_task(self._loop(), name="webhook-delivery")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.aclose()

    async def _loop(self) -> None:
        while True:
            try:
                busy = await self.deliver_due()
            except Exception:
                log.warning("webhook delivery round failed", exc_info=True)
                busy = False
            if not busy:
                await asyncio.sleep(self.poll_interval)

    async def deliver_due(self) -> bool:
        """One round: claim and post up to `concurrency` deliveries; whether any was due."""
        assert self._client is not None
        # The lease outlives the longest attempt (timeout plus resolving and recording).
        claims = await self.store.claim_deliveries(
            self.owner, self.policy.timeout * 2 + 1.0, self.policy.concurrency
        )
        await asyncio.gather(*(self._deliver(claimed) for claimed in claims))
        return bool(claims)

    async def _deliver(self, claimed: ClaimedDelivery) -> None:
        assert self._client is not None
        result = await post(self._client, claimed, self.policy)
        outcome = outcome_of(claimed, self.policy, result, time.time())
        logged = await self.store.record_attempt(claimed, self.owner, outcome)
        count_attempt(outcome, logged)
        if not logged:
            log.info(
                "delivery %s was taken over before its attempt was logged", claimed.delivery.id
            )


__all__ = [
    "DeliveryPolicy",
    "DeliveryWorker",
    "count_attempt",
    "outcome_label",
    "outcome_of",
    "post",
    "retry_after_seconds",
    "sign",
]
