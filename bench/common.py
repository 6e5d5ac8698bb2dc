"""Helpers shared by the benchmarks: percentiles and a Postgres database of their own."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.asynccontextmanager
async def own_database(admin_dsn: str) -> AsyncIterator[str]:
    """Create a database through `admin_dsn`, yield its DSN, drop it (and only it) after."""
    import asyncpg

    name = f"threadline_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield admin_dsn.rsplit("/", 1)[0] + "/" + name
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
