"""Runs the browser client's pure-logic tests (tests/unit/js/*.test.mjs) with Node's test runner."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JS_TESTS = ROOT / "tests" / "unit" / "js"


def test_js_logic() -> None:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node is required under CI=true to run tests/unit/js")
        pytest.skip("node is not installed")
    result = subprocess.run(
        [node, "--test", str(JS_TESTS.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, (
        f"node --test failed ({result.returncode})\n{result.stdout}\n{result.stderr}"
    )
