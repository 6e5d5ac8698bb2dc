"""Deployment tests: Docker made available once per session (tests/deploy/ensure-docker.sh)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.deploy.stack import ENSURE_DOCKER

# Installing packages, debootstrapping and building the stand-in images on a fresh machine.
ENSURE_TIMEOUT = 1800.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "deploy: starts the docker-compose stack (needs Docker)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/deploy carries the `deploy` mark (select or deselect with -m)."""
    for item in items:
        if "tests/deploy/" in item.nodeid:
            item.add_marker(pytest.mark.deploy)


@pytest.fixture(scope="session")
def docker_ready() -> None:
    """Docker, docker-compose and the base images, or a skip (a failure under CI=true)."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            ["bash", str(ENSURE_DOCKER)],
            capture_output=True,
            text=True,
            timeout=ENSURE_TIMEOUT,
            check=False,
        )
        ok, detail = done.returncode == 0, done.stderr[-3000:]
    except subprocess.TimeoutExpired:
        ok, detail = False, f"{ENSURE_DOCKER.name} took over {ENSURE_TIMEOUT}s"
    if not ok:
        reason = f"Docker could not be made available ({ENSURE_DOCKER.name}):\n{detail}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    print(f"ensure-docker.sh: {time.monotonic() - started:.1f}s")
