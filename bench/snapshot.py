"""Snapshot benchmark: latency of a thread's snapshot at 10, 1 000 and 10 000 messages, whole and
bounded (the last 100 messages, as the server serves it), side by side. Prints; asserts nothing.

    python bench/snapshot.py [--sizes 10,1000,10000] [--repeat 20]

Uses the embedded store (a SQLite file in a temporary directory); messages are inserted in bulk
straight into the file, since only reading them is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.storage import SqliteStore

BOUND = 100  # THREADLINE_SNAPSHOT_MESSAGES default


def fill(path: Path, thread_id: str, count: int) -> None:
    parts = orjson.dumps([{"type": "text", "text": "lorem ipsum dolor sit amet " * 8}]).decode()
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO messages (id, thread_id, position, role, parts, visibility, run_id,"
            " client_request_id, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, 'visible', NULL, NULL, 0, 0)",
            (
                (f"{thread_id}-{n}", thread_id, n, "user" if n % 2 == 0 else "assistant", parts)
                for n in range(count)
            ),
        )


async def measure(sizes: list[int], repeat: int) -> list[tuple[int, float, float, int, int]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="threadline-bench-") as directory:
        path = Path(directory) / "threadline.sqlite3"
        async with SqliteStore(path) as store:
            await store.migrate()
            for count in sizes:
                thread = await store.create_thread("bench", f"{count} messages", {})
                fill(path, thread.id, count)
                timings: dict[str, list[float]] = {"whole": [], "bounded": []}
                size: dict[str, int] = {}
                for _ in range(repeat):
                    for kind, limit in (("whole", None), ("bounded", BOUND)):
                        started = time.perf_counter()
                        snap = await store.snapshot(thread.id, ["bench"], message_limit=limit)
                        wire = orjson.dumps(snap.to_wire())
                        timings[kind].append(time.perf_counter() - started)
                        size[kind] = len(wire)
                rows.append(
                    (
                        count,
                        statistics.median(timings["whole"]) * 1000,
                        statistics.median(timings["bounded"]) * 1000,
                        size["whole"],
                        size["bounded"],
                    )
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,1000,10000")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",") if n]
    rows = asyncio.run(measure(sizes, max(1, args.repeat)))
    print(f"snapshot latency (median of {args.repeat}, read + JSON), SQLite, bound {BOUND}")
    print(
        f"{'messages':>9} | {'whole ms':>9} | {'bounded ms':>10} | {'whole bytes':>11} |"
        f" {'bounded bytes':>13}"
    )
    for count, whole, bounded, whole_bytes, bounded_bytes in rows:
        print(
            f"{count:>9} | {whole:>9.2f} | {bounded:>10.2f} | {whole_bytes:>11} |"
            f" {bounded_bytes:>13}"
        )


if __name__ == "__main__":
    main()
