"""mypy over realtime/, runtime/ and server/ with the configuration in pyproject.toml (strict)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_passes() -> None:
    # mypy comes with the test extras; without it this fails ("No module named mypy").
    # The incremental cache (.mypy_cache/) makes a rerun take seconds; a cold run takes minutes
    # on a busy machine, hence the generous timeout.
    result = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout
