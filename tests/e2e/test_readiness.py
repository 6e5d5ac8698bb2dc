"""`/readyz` of a real server: ready, then not while a migration is missing or Redis hangs."""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import httpx

from tests.e2e import harness
from tests.servers import RedisServer

WAIT = 20.0  # a guard: the bus notices a dead Redis within its health-check interval


def wait_readyz(url: str, status: int) -> httpx.Response:
    deadline = time.monotonic() + WAIT
    response = httpx.get(f"{url}/readyz", timeout=10)
    while response.status_code != status and time.monotonic() < deadline:
        time.sleep(0.2)
        response = httpx.get(f"{url}/readyz", timeout=10)
    return response


def test_readyz_names_a_missing_migration(tmp_path: Path) -> None:
    with harness.start(log_dir=tmp_path) as server:
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        assert ready.json() == {"status": "ready", "role": "all"}
        database = sqlite3.connect(tmp_path / "threadline.sqlite3")
        with database:
            (last,) = database.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
            database.execute("DELETE FROM schema_migrations WHERE version = ?", (last,))
        missing = httpx.get(f"{server.url}/readyz", timeout=10)
        assert missing.status_code == 503
        assert missing.json()["status"] == "unavailable"
        assert last in missing.json()["reasons"]["storage"]
        assert "bus" not in missing.json()["reasons"]
        # /healthz is liveness only: the process is alive either way.
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        database.close()


def test_readyz_is_503_while_redis_is_down_and_200_when_it_is_back(tmp_path: Path) -> None:
    redis = RedisServer().start()
    try:
        env = harness.server_env(
            harness.sqlite_url(tmp_path),
            {"THREADLINE_REDIS_URL": redis.address, "THREADLINE_POLL_INTERVAL": "0.2"},
        )
        with harness.start(env=env, log_dir=tmp_path) as server:
            assert wait_readyz(server.url, 200).status_code == 200
            process = redis._process
            assert process is not None
            process.send_signal(signal.SIGSTOP)  # a hung Redis: connected, never answering
            try:
                down = wait_readyz(server.url, 503)
            finally:
                process.send_signal(signal.SIGCONT)
            assert down.status_code == 503, down.text
            assert set(down.json()["reasons"]) == {"bus"}
            back = wait_readyz(server.url, 200)
            assert back.status_code == 200, back.text
    finally:
        redis.stop()
