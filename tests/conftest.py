"""Shared fixtures: services are required under CI=true (fail, never skip)."""

from __future__ import annotations

import os

# The demo agent streams without delay in tests.
os.environ.setdefault("THREADLINE_DEMO_DELAY_MS", "0")

pytest_plugins = ["tests.conformance.runtime_fixtures"]
