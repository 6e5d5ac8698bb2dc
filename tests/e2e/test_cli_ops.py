"""The operator's commands: --version, migrate's report, config (masked), settings refused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e import harness

PROBLEM_PREFIX = "threadline: invalid setting "


def cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*harness.COMMAND, *args],
        env={**env, "PYTHONPATH": str(harness.ROOT)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=harness.COMMAND_TIMEOUT,
        check=False,
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return harness.server_env(harness.sqlite_url(tmp_path))


def test_version(env: dict[str, str], tmp_path: Path) -> None:
    from importlib.metadata import version

    done = cli(["--version"], env, tmp_path)
    assert done.returncode == 0
    assert done.stdout.strip() == f"threadline, version {version('threadline')}"


def test_migrate_prints_what_it_applied_then_up_to_date(
    env: dict[str, str], tmp_path: Path
) -> None:
    first = cli(["migrate"], env, tmp_path)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    applied = [line.removeprefix("applied ") for line in lines[:-1]]
    assert applied and applied[0] == "0001_init"
    assert all(line.startswith("applied 0") for line in lines[:-1])
    assert lines[-1] == f"applied {len(applied)} migrations"
    assert "up to date" not in first.stdout
    again = cli(["migrate"], env, tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["storage is up to date"]


@pytest.mark.parametrize("command", [["serve"], ["migrate"], ["config"]])
def test_bad_values_exit_2_with_one_line_each(
    command: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    bad = {**env, "THREADLINE_PORT": "eighty", "THREADLINE_LEASE_TTL": "-1"}
    done = cli(command, bad, tmp_path)
    assert done.returncode == 2
    problems = [line for line in done.stderr.splitlines() if line.startswith(PROBLEM_PREFIX)]
    assert sorted(problems) == [
        f"{PROBLEM_PREFIX}THREADLINE_LEASE_TTL=-1: Input should be greater than 0",
        f"{PROBLEM_PREFIX}THREADLINE_PORT=eighty: Input should be a valid integer, unable to"
        " parse string as an integer",
    ]
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_misspelt_variable_is_warned_with_the_nearest_name(
    env: dict[str, str], tmp_path: Path
) -> None:
    done = cli(["config"], {**env, "THREADLINE_DATABSE_URL": "sqlite:///x"}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "threadline: warning: unknown setting THREADLINE_DATABSE_URL is ignored;"
        " did you mean THREADLINE_DATABASE_URL?"
    ]
    # Variables of the client, the demo agent and the test suite are not settings' mistakes.
    quiet = cli(["config"], {**env, "THREADLINE_TEST_X": "1", "THREADLINE_TOKEN": "t"}, tmp_path)
    assert quiet.stderr == ""


def test_config_reads_dotenv_and_masks_secrets(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "THREADLINE_DATABASE_URL=postgresql://app:hunter2@db.internal:5432/threadline\n"
        "THREADLINE_REDIS_URL=redis://:r3dispass@cache:6379/0\n"
        "THREADLINE_MAX_CONCURRENT_RUNS=7\n"
        "THREADLINE_QUEUE_MAX_ITEMS=9\n"
    )
    # The environment wins over the file.
    del env["THREADLINE_DATABASE_URL"]
    done = cli(["config"], {**env, "THREADLINE_QUEUE_MAX_ITEMS": "11"}, tmp_path)
    assert done.returncode == 0, done.stderr
    shown = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert shown["THREADLINE_DATABASE_URL"] == "postgresql://app:***@db.internal:5432/threadline"
    assert shown["THREADLINE_REDIS_URL"] == "redis://:***@cache:6379/0"
    assert shown["THREADLINE_MAX_CONCURRENT_RUNS"] == "7"
    assert shown["THREADLINE_QUEUE_MAX_ITEMS"] == "11"
    assert shown["THREADLINE_ROLE"] == "all"
    assert "hunter2" not in done.stdout and "r3dispass" not in done.stdout
    assert set(shown) == {f"THREADLINE_{n.upper()}" for n in _fields()}


def _fields() -> list[str]:
    from server.settings import Settings

    return list(Settings.model_fields)


def test_env_file_variable_names_another_file(env: dict[str, str], tmp_path: Path) -> None:
    other = tmp_path / "prod.env"
    other.write_text("THREADLINE_ROLE=worker\n")
    done = cli(["config"], {**env, "THREADLINE_ENV_FILE": os.fspath(other)}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "THREADLINE_ROLE=worker" in done.stdout.splitlines()


def test_approval_policies_are_checked_before_the_server_starts(
    env: dict[str, str], tmp_path: Path
) -> None:
    unknown = cli(["serve"], {**env, "THREADLINE_APPROVAL_POLICIES": '{"wire": {}}'}, tmp_path)
    assert unknown.returncode == 2
    [line] = unknown.stderr.splitlines()
    assert line.startswith(f"{PROBLEM_PREFIX}THREADLINE_APPROVAL_POLICIES names wire,")
    assert "its approval tools: send_email" in line
    bad = cli(["serve"], {**env, "THREADLINE_APPROVAL_POLICIES": '{"x": {"quorum": 0}}'}, tmp_path)
    assert bad.returncode == 2
    assert "x.quorum: Input should be greater than or equal to 1" in bad.stderr
    assert "Traceback" not in bad.stderr + unknown.stderr
