"""The server process's garbage collector: frozen after start-up, optionally logged.

A gateway holds thousands of long-lived connection objects; every full collection walks all
of them and every object left from imports and start-up. `tune_gc` (called once the app's
lifespan has started, by `threadline serve` only) moves everything alive then into the
permanent generation (`gc.freeze`) so no later collection walks it again, sets the gen-0
threshold if one is configured, and, when `THREADLINE_GC_LOG` names a file, appends one line
per collection: `<monotonic seconds> <generation> <pause ns>` (bench/idle.py reads it).
"""

from __future__ import annotations

import gc
import time
from typing import IO, Any

from server.settings import Settings


class GcLog:
    """A gc.callbacks entry that times each collection and writes it as one line."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.started = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter_ns()
            return
        paused = time.perf_counter_ns() - self.started
        self.out.write(f"{time.monotonic():.6f} {info['generation']} {paused}\n")

    def close(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
        self.out.close()


def tune_gc(settings: Settings) -> GcLog | None:
    """Set the gen-0 threshold, start the log if one is asked, freeze what start-up left."""
    if settings.gc_threshold is not None:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(settings.gc_threshold, gen1, gen2)
    log = None
    if settings.gc_log is not None:
        log = GcLog(open(settings.gc_log, "a", buffering=1, encoding="utf-8"))  # noqa: SIM115
        gc.callbacks.append(log)
    if settings.gc_freeze:
        gc.collect()  # start-up's garbage is freed, not frozen (the log's first line)
        gc.freeze()
    return log


def parse_gc_log(text: str, start: float, end: float) -> dict[int, tuple[int, int]]:
    """Collections per generation in [start, end) of a gc log: (count, nanoseconds paused)."""
    seen: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue  # a line still being written
        at, generation, paused = float(parts[0]), int(parts[1]), int(parts[2])
        if start <= at < end:
            count, total = seen.get(generation, (0, 0))
            seen[generation] = (count + 1, total + paused)
    return seen
