"""Thread retention against real processes: the workers' timer deletes idle threads of a
running server, and `threadline retention run` does it once, for cron users."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.e2e import harness

MAX_POLLS = 1200  # a bound on waiting for the timer (0.05 s apart): a hang guard, not a check


def test_the_servers_timer_deletes_an_idle_thread_and_keeps_a_running_one(
    tmp_path: Path,
) -> None:
    env = harness.server_env(
        harness.sqlite_url(tmp_path),
        {
            "THREADLINE_THREAD_RETENTION": "0.5",
            "THREADLINE_THREAD_RETENTION_INTERVAL": "0.2",
            # Slow replies: a run lasts many retention periods.
            "THREADLINE_DEMO_DELAY_MS": "100",
        },
    )
    with harness.start("all", env, log_dir=tmp_path) as server:
        headers = {"Authorization": f"Bearer {server.token('alpha')}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=10.0) as http:
            idle = http.post("/v1/threads", json={"title": "idle"}).json()["thread"]["id"]
            busy = http.post("/v1/threads", json={"title": "busy"}).json()["thread"]["id"]
            text = " ".join(f"w{i}" for i in range(400))
            assert http.post(f"/v1/threads/{busy}/messages", json={"text": text}).is_success
            seen_running = 0
            for _ in range(MAX_POLLS):
                busy_answer = http.get(f"/v1/threads/{busy}")
                assert busy_answer.status_code == 200, "a thread with a live run was deleted"
                run = busy_answer.json()["run"]
                seen_running += run is not None and run["status"] in ("queued", "running")
                if http.get(f"/v1/threads/{idle}").status_code == 404:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"the idle thread was never deleted\n{server.log()[-3000:]}")
            final = http.get(f"/v1/threads/{busy}")
    assert final.status_code == 200 and final.json()["run"]["status"] in ("queued", "running")
    assert seen_running > 0


def test_retention_run_deletes_what_is_older_than_asked(tmp_path: Path) -> None:
    env = harness.server_env(harness.sqlite_url(tmp_path))
    with harness.start("all", env, log_dir=tmp_path) as server:
        headers = {"Authorization": f"Bearer {server.token('alpha')}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=10.0) as http:
            ids = [http.post("/v1/threads", json={}).json()["thread"]["id"] for _ in range(3)]
            kept = harness.run_command(["retention", "run", "--older-than", "1d"], env)
            assert kept.returncode == 0, kept.stderr
            assert "deleted 0 threads" in kept.stdout
            time.sleep(0.01)  # so that they are idle longer than 0.001 s
            swept = harness.run_command(["retention", "run", "--older-than", "0.001"], env)
            assert swept.returncode == 0, swept.stderr
            assert "deleted 3 threads" in swept.stdout
            gone = [http.get(f"/v1/threads/{i}").status_code for i in ids]
    assert gone == [404, 404, 404]
    bad = harness.run_command(["retention", "run", "--older-than", "soon"], env)
    none = harness.run_command(["retention", "run"], env)
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    assert none.returncode == 2 and "THREADLINE_THREAD_RETENTION" in none.stderr
