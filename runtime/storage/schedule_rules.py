"""Schedule decisions without I/O: checking a spec, the next fire time, what a late fire does."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from runtime.errors import InvalidInput
from runtime.storage.hooks_store import MissedFire, ScheduleSpec

# Far enough for a yearly schedule; a cron expression with no time in it (Feb 30) ends there.
_HORIZON = 5 * 366 * 86400.0
MAX_TEXT = 32_000


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"unknown time zone {name!r}", field="timezone") from exc


def next_cron_time(cron: str, timezone: str, after: float) -> float | None:
    """The first time strictly after `after` that `cron` names in `timezone` (cronsim: five
    fields, or six with seconds first; daylight saving handled as cronsim documents)."""
    start = datetime.fromtimestamp(after, tz=UTC).astimezone(_zone(timezone))
    try:
        times = CronSim(cron, start)
        found = next(times)
    except CronSimError as exc:
        raise InvalidInput(f"invalid cron expression: {exc}", field="cron") from exc
    except StopIteration:
        return None
    value = found.timestamp()
    return value if value - after <= _HORIZON else None


def check_spec(spec: ScheduleSpec, now: float) -> float:
    """Refuse a schedule that cannot fire; returns its first fire time."""
    if (spec.cron is None) == (spec.run_at is None):
        raise InvalidInput("a schedule has exactly one of 'cron' and 'run_at'")
    if spec.new_thread == (spec.thread_id is not None):
        raise InvalidInput("a schedule names a 'thread_id' or sets 'new_thread', not both")
    if not spec.text.strip() or len(spec.text) > MAX_TEXT:
        raise InvalidInput(f"'text' must be 1 to {MAX_TEXT} characters", field="text")
    if not 0 <= spec.misfire_grace <= 86400:
        raise InvalidInput("'misfire_grace' must be 0 to 86400 seconds", field="misfire_grace")
    _zone(spec.timezone)
    if spec.run_at is not None:
        return spec.run_at
    assert spec.cron is not None
    first = next_cron_time(spec.cron, spec.timezone, now)
    if first is None:
        raise InvalidInput("the cron expression names no time in the next five years")
    return first


@dataclass(frozen=True)
class FirePlan:
    """What firing a schedule's timer due at `due` does at database time `now`."""

    admit: bool  # start (or queue) one run for `due`
    missed: bool  # later than the grace: the missed-fire policy decided
    next_due: float | None  # the timer's next due time; None: the schedule is done


def plan_fire(
    *,
    cron: str | None,
    timezone: str,
    due: float,
    now: float,
    grace: float,
    missed: MissedFire,
) -> FirePlan:
    late = now - due > grace
    if cron is None:  # a one-off: fires once, late or not, unless the policy skips it
        return FirePlan(admit=not late or missed is MissedFire.RUN_ONCE, missed=late, next_due=None)
    if not late:
        # On time (or within the grace): the next fire follows this one, so fires the grace
        # still covers are caught up one by one.
        return FirePlan(admit=True, missed=False, next_due=next_cron_time(cron, timezone, due))
    # Missed: run once for all of them, or skip them; either way resume with the next fire
    # after now, not with each fire missed.
    return FirePlan(
        admit=missed is MissedFire.RUN_ONCE,
        missed=True,
        next_due=next_cron_time(cron, timezone, now),
    )


__all__ = ["FirePlan", "check_spec", "next_cron_time", "plan_fire"]
