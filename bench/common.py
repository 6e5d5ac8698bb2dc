"""Helpers shared by the benchmarks: percentiles and a Postgres database of their own."""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.services import own_postgres_database


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def own_database(admin_dsn: str) -> AbstractAsyncContextManager[str]:
    """A database created through `admin_dsn` for this run, dropped (and only it) after."""
    return own_postgres_database(admin_dsn, prefix="threadline_bench_")
