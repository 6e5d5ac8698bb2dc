"""Thread retention: how long an idle thread is kept, how often the job looks, durations parsed."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

# One transaction deletes at most this many threads; a full batch makes the job go again at once.
RETENTION_BATCH = 500

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str | float) -> float:
    """Seconds of a duration: a number of seconds, or units summed, `30d`, `1h30m`, `90s`.
    `ValueError` for anything else, zero or less included."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        spec = text.strip().lower()
        try:
            seconds = float(spec)
        except ValueError:
            parts = _DURATION.findall(spec)
            if not parts or "".join(n + u for n, u in parts) != spec:
                raise ValueError(f"not a duration: {text!r} (e.g. 30d, 12h, 1h30m, 3600)") from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not seconds > 0:
        raise ValueError(f"a duration must be positive, not {text!r}")
    return seconds


class RetentionPolicy(BaseModel):
    """Threads idle (not updated) longer than `idle_for` seconds are deleted, the job looking
    every `interval` seconds. Idle: no queued, running or waiting run (so no queued input and
    no pending action either), no active schedule and no unexpired lease."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    idle_for: float = Field(gt=0)
    interval: float = Field(default=3600.0, gt=0)

    @property
    def ref(self) -> str:
        """The policy as its timer's `ref`: every worker fires what the row says, so one
        timer serves the deployment whatever process started it."""
        return f"{self.idle_for!r}/{self.interval!r}"

    @classmethod
    def of_ref(cls, ref: str) -> RetentionPolicy:
        idle_for, _, interval = ref.partition("/")
        return cls(idle_for=float(idle_for), interval=float(interval))


__all__ = ["RETENTION_BATCH", "RetentionPolicy", "parse_duration"]
