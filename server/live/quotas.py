"""The deployment's quotas: command rate limits and connection caps (websockets and event
streams), one limiter."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Collection
from dataclasses import dataclass

import orjson

from realtime.bus_metrics import safe_add
from realtime.channels import hash_tag
from realtime.counters import Bucket, Counters
from runtime.domain import Principal
from runtime.errors import QuotaExceeded, ScopeRateLimited, TokenRateLimited, TooManyConnections
from runtime.storage.store import AdmissionLimits
from server.settings import Settings
from server.tracing import QUOTA_REFUSALS

# Connection set members expire unless refreshed: a gateway that dies frees its slots after
# this long, without anyone having to clean up after it.
CONNECTION_TTL = 60.0
REFRESH_INTERVAL = CONNECTION_TTL / 3
# Hash tags the connection sets are spread over. A tag per subject would make a gateway's
# periodic refresh one script call per subject on a Redis Cluster (a call names keys of one
# slot); a fixed set of tags bounds it at this many calls per gateway, however many subjects.
CONNECTION_TAGS = 64
# Seconds a client should wait after `queue_full` or `scope_runs_exceeded`: a run's length is
# unknown, this is a polite hint, not a promise.
ADMISSION_RETRY_AFTER = 5.0


def admission_limits(settings: Settings) -> AdmissionLimits:
    """The bounds the store checks inside the admission transaction."""
    return AdmissionLimits(
        queue_max_items=settings.queue_max_items,
        queue_max_bytes=settings.queue_max_bytes,
        scope_max_active_runs=settings.scope_max_active_runs,
        retry_after=ADMISSION_RETRY_AFTER,
    )


def subject_key(principal: Principal) -> str:
    """Who a subject cap counts: the subject *within its token's scopes*. Subjects are names a
    scope's issuer chooses, so `shared` of scope a and `shared` of scope b are different
    callers and never share a cap. A digest of both, unambiguous whatever the names hold."""
    named = orjson.dumps([sorted(principal.scopes), principal.subject])
    return hashlib.sha256(named).hexdigest()[:32]


def connection_keys(principal: Principal, token_id: str) -> tuple[str, str]:
    """The token's and the subject's connection sets. Both carry one hash tag, so the join
    checks and adds to them in one script, which a Redis Cluster only runs on keys of one
    slot: a token has one subject, so its tag is the subject's (one of `CONNECTION_TAGS`)."""
    subject = subject_key(principal)
    tag = hash_tag(f"conn{int(subject[:8], 16) % CONNECTION_TAGS}")
    return (f"ws:token:{tag}:{token_id}", f"ws:subject:{tag}:{subject}")


@dataclass(frozen=True)
class ConnectionSlot:
    """One connection's (a websocket's or an event stream's) place in its token's and subject's
    connection sets."""

    keys: tuple[str, ...]
    member: str


class Limiter:
    """Decides whether a command or a connection is within the deployment's quotas.

    Commands draw from two token buckets, the token's and each of its scopes'; a refusal
    names the bucket that was empty (`token_rate_limited`, `scope_rate_limited`) and how long
    to wait. Buckets and connection sets are `Counters`: shared through Redis when configured.
    """

    def __init__(self, settings: Settings, counters: Counters) -> None:
        self.settings = settings
        self.counters = counters

    async def command(self, principal: Principal, token_id: str) -> None:
        """Charge one command to the caller's token and scopes, all of them or, refused,
        none; `TokenRateLimited` or `ScopeRateLimited` (the first empty bucket) when over."""
        s = self.settings
        scopes = sorted(principal.scopes)
        buckets: list[Bucket] = [(f"rate:token:{token_id}", s.token_rate, s.token_burst)]
        buckets += [(f"rate:scope:{scope}", s.scope_rate, s.scope_burst) for scope in scopes]
        index, wait = await self.counters.take_all(buckets)
        if index < 0:
            return
        refusal: type[QuotaExceeded] = TokenRateLimited
        what, rate, burst = "too many commands with this token", s.token_rate, s.token_burst
        if index > 0:
            refusal, what = ScopeRateLimited, f"too many commands in scope {scopes[index - 1]!r}"
            rate, burst = s.scope_rate, s.scope_burst
        raise refusal(f"{what} (at most {rate:g}/s, bursts of {burst})", retry_after=wait)

    async def connect(self, principal: Principal, token_id: str) -> ConnectionSlot:
        """Take a connection slot for the token and the subject; TooManyConnections when either is
        full (a websocket is closed with 4429, an event stream answered 429)."""
        s = self.settings
        keys = connection_keys(principal, token_id)
        caps = (s.ws_max_connections_per_token, s.ws_max_connections_per_subject)
        slot = ConnectionSlot(keys, uuid.uuid4().hex)
        full = await self.counters.join(keys, caps, slot.member, CONNECTION_TTL)
        if full >= 0:
            what = ("token", "subject")[full]
            safe_add(QUOTA_REFUSALS, 1, {"code": TooManyConnections.code})
            raise TooManyConnections(
                f"this {what} already has {caps[full]} open connections"
                " (websockets and event streams together)",
                retry_after=REFRESH_INTERVAL,
                limit=caps[full],
            )
        return slot

    async def keep(self, slot: ConnectionSlot) -> None:
        await self.counters.refresh(slot.keys, slot.member, CONNECTION_TTL)

    async def keep_many(self, slots: Collection[ConnectionSlot]) -> None:
        """`keep` every slot of `slots` together (one gateway's connections, each period)."""
        await self.counters.refresh_many([(s.keys, s.member) for s in slots], CONNECTION_TTL)

    async def disconnect(self, slot: ConnectionSlot) -> None:
        await self.counters.leave(slot.keys, slot.member)


__all__ = [
    "CONNECTION_TAGS",
    "CONNECTION_TTL",
    "ConnectionSlot",
    "Limiter",
    "admission_limits",
    "connection_keys",
    "subject_key",
]
