"""README's two set-up commands on a fresh machine: a new container with only Python 3.11 and make.

The container starts from the `python:3.11-slim` image (the real one, or its Debian stand-in built
by ensure-docker.sh where no registry answers), gets the repository's files and `make` (the two
prerequisites README.md states), then runs `make run` until `/healthz` answers and `make test`
with `CI=true` on a selection that needs PostgreSQL, Redis, Chromium, node and the npm client
libraries (Node 20, which Debian bookworm does not ship): everything else
those commands need they must install and start themselves.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.deploy.stack import ROOT, docker

IMAGE = "python:3.11-slim"
# What a new contributor's machine lacks and `make test` installs (apt) is downloaded here.
SETUP_TIMEOUT = 900.0
RUN_TIMEOUT = 900.0
TEST_TIMEOUT = 1500.0
# Needs each service the suite owns (tests/servers.py) and each installed program.
SELECTION = " ".join(
    [
        "tests/unit/test_test_servers.py",
        "tests/conformance/test_store.py",
        "tests/conformance/test_bus.py",
        "tests/unit/test_js_logic.py",
        "tests/e2e/test_aisdk.py",  # npm ci'd client libraries on Node 20 (Debian ships 18)
        "tests/browser/test_thread_ui.py",
    ]
)


def repository_tar() -> bytes:
    """The repository's files (tracked, and new ones not ignored) as a tar stream."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    present = b"\0".join(name for name in listed if name and (ROOT / name.decode()).is_file())
    return subprocess.run(
        ["tar", "--null", "-T", "-", "-c", "-f", "-"],
        cwd=ROOT,
        input=present,
        capture_output=True,
        check=True,
    ).stdout


def run_in(
    container: str, script: str, timeout: float, *, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    flags = [arg for key, value in (env or {}).items() for arg in ("-e", f"{key}={value}")]
    return subprocess.run(
        ["docker", "exec", *flags, container, "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tail(done: subprocess.CompletedProcess[str]) -> str:
    return f"rc={done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


@pytest.fixture
def fresh_container(docker_ready: None) -> object:
    name = f"threadline-fresh-{uuid.uuid4().hex[:8]}"
    # Chromium needs more shared memory than Docker's 64 MB default.
    docker("run", "-d", "--name", name, "--shm-size=1g", IMAGE, "sleep", "7200")
    try:
        docker("exec", name, "mkdir", "-p", "/src")
        subprocess.run(
            ["docker", "cp", "-", f"{name}:/src"],
            input=repository_tar(),
            capture_output=True,
            check=True,
            timeout=120,
        )
        yield name
    finally:
        # Removing its writable layer (a venv, node_modules, apt installs) is slow on a busy disk.
        docker("rm", "-f", name, check=False, timeout=600)


def test_readme_commands_on_a_fresh_machine(fresh_container: str) -> None:
    name = fresh_container
    started = time.monotonic()
    # The README's prerequisites: Python 3.11+ (the image has it) and make.
    done = run_in(
        name,
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -qq make >/dev/null",
        SETUP_TIMEOUT,
    )
    assert done.returncode == 0, tail(done)
    assert run_in(name, "python3 --version && make --version", 60).returncode == 0

    # 1. `make run`: the server on the embedded default answers /healthz.
    run_in(name, "cd /src && (make run >/tmp/run.log 2>&1 &)", 60)
    probe = (
        '/src/.venv/bin/python -c "import urllib.request as u; '
        "print(u.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status)\""
    )
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        if run_in(name, probe, 30).stdout.strip() == "200":
            break
        time.sleep(3)
    else:
        log = tail(run_in(name, "cat /tmp/run.log", 30))
        pytest.fail("make run never answered /healthz:\n" + log)
    log = run_in(name, "cat /tmp/run.log", 30).stdout
    assert "http://127.0.0.1:8000/#token=" in log, log[-2000:]
    ran = time.monotonic() - started
    run_in(name, "pkill -f 'threadline serve' || true", 30)

    # 2. `make test` with CI=true: installs PostgreSQL, Redis, Chromium and node, then runs.
    done = run_in(
        name,
        f"cd /src && make test PYTEST_ARGS='-q -p no:cacheprovider {SELECTION}'",
        TEST_TIMEOUT,
        env={"CI": "true"},
    )
    assert done.returncode == 0, tail(done)
    summary = [line for line in done.stdout.splitlines() if " passed" in line]
    assert summary and "failed" not in summary[-1] and "skipped" not in summary[-1], tail(done)
    print(
        f"fresh machine: make run healthy after {ran:.0f}s; make test: {summary[-1]} "
        f"({time.monotonic() - started - ran:.0f}s)"
    )


def test_selection_exists() -> None:
    """The selection above names files that exist (a rename must update it, not skip it)."""
    for path in SELECTION.split():
        assert (Path(ROOT) / path).is_file(), path
