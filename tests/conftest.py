"""Shared fixtures: the run's own Postgres and Redis (required under CI=true: fail, never skip)."""

from __future__ import annotations

import os

import pytest

from tests.services import stop_own_services

# The demo agent streams without delay in tests.
os.environ.setdefault("THREADLINE_DEMO_DELAY_MS", "0")

pytest_plugins = ["tests.conformance.runtime_fixtures"]


def pytest_unconfigure(config: pytest.Config) -> None:
    """The throwaway servers started on first use (tests/services.py) end with the run."""
    stop_own_services()
