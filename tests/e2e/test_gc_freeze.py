"""`threadline serve` freezes start-up's objects once its app has started (server/gc_tuning.py)."""

from __future__ import annotations

from pathlib import Path

from tests.e2e import harness


def test_served_process_collects_and_freezes_once_started(tmp_path: Path) -> None:
    path = tmp_path / "gc.log"
    env = harness.server_env(harness.sqlite_url(tmp_path), {"THREADLINE_GC_LOG": str(path)})
    with harness.start("all", env=env, log_dir=tmp_path):
        # Healthy means the lifespan has started: its full collection before the freeze is
        # logged, as one line of `<monotonic s> <generation> <pause ns>`.
        lines = path.read_text(encoding="utf-8").splitlines()
    first = lines[0].split()
    assert len(first) == 3 and first[1] == "2" and int(first[2]) > 0, lines
