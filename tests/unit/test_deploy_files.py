"""Structure of the deployment files (no Docker engine needed): compose, nginx, Dockerfile.
tests/deploy starts them for real."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
THREADLINE_SERVICES = ("migrate", "gateway", "worker")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


@pytest.fixture(scope="module")
def nginx() -> str:
    text = (ROOT / "deploy" / "nginx.conf").read_text()
    # Comments out, so a directive only counts when it is really there.
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def command_of(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return list(command) if isinstance(command, list) else shlex.split(command)


def depends(service: dict[str, Any]) -> dict[str, str]:
    return {name: spec["condition"] for name, spec in service["depends_on"].items()}


def test_every_service_is_there(services: dict[str, Any]) -> None:
    assert set(services) >= {"postgres", "redis", "migrate", "gateway", "worker", "lb"}


def test_backing_services_use_pinned_images_with_health_checks(services: dict[str, Any]) -> None:
    postgres, redis = services["postgres"], services["redis"]
    assert postgres["image"] == "postgres:16"
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert redis["image"] == "redis:7"
    assert redis["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]


def test_threadline_services_run_the_server_image(services: dict[str, Any]) -> None:
    images = {services[name]["image"] for name in THREADLINE_SERVICES}
    assert len(images) == 1, images
    for name in THREADLINE_SERVICES:
        assert services[name]["build"] in (".", {"context": "."})
    assert (ROOT / "Dockerfile").is_file()


def test_threadline_services_point_at_postgres_and_redis(services: dict[str, Any]) -> None:
    known = {f"THREADLINE_{name.upper()}" for name in Settings.model_fields}
    for name in THREADLINE_SERVICES:
        env = services[name]["environment"]
        assert env["THREADLINE_DATABASE_URL"].startswith("postgresql://")
        assert "@postgres:5432/" in env["THREADLINE_DATABASE_URL"]
        assert env["THREADLINE_REDIS_URL"].startswith("redis://redis:6379")
        # No typo'd variable that the server would silently ignore.
        unknown = {k for k in env if k.startswith("THREADLINE_")} - known
        assert not unknown, unknown
        # Gateways of a shared deployment never mint development tokens.
        assert str(env["THREADLINE_DEV_TOKEN"]).lower() == "false"


def test_migrate_runs_once_after_postgres_is_healthy(services: dict[str, Any]) -> None:
    migrate = services["migrate"]
    assert command_of(migrate) == ["threadline", "migrate"]
    assert depends(migrate)["postgres"] == "service_healthy"
    assert migrate.get("restart", "no") == "no"


@pytest.mark.parametrize("name", ["gateway", "worker"])
def test_gateways_and_workers(services: dict[str, Any], name: str) -> None:
    service = services[name]
    command = command_of(service)
    assert command[:2] == ["threadline", "serve"]
    assert command[command.index("--role") + 1] == name
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert command[command.index("--port") + 1] == "8000"
    assert service["deploy"]["replicas"] == 2
    # Replicas cannot share a host port: only the load balancer publishes one.
    assert "ports" not in service
    conditions = depends(service)
    assert conditions["migrate"] == "service_completed_successfully"
    assert conditions["postgres"] == "service_healthy"
    assert conditions["redis"] == "service_healthy"
    check = " ".join(service["healthcheck"]["test"])
    assert "/healthz" in check and ":8000" in check


def test_load_balancer_publishes_port_8000(services: dict[str, Any]) -> None:
    lb = services["lb"]
    assert lb["image"].startswith("nginx:1.27")
    # Port 8000 unless THREADLINE_PUBLISH_PORT says otherwise (tests/deploy uses a free one).
    assert [str(port) for port in lb["ports"]] == ["${THREADLINE_PUBLISH_PORT:-8000}:8000"]
    mounts = [str(volume) for volume in lb["volumes"]]
    assert any(m.startswith("./deploy/nginx.conf:/etc/nginx/nginx.conf") for m in mounts)
    assert depends(lb)["gateway"] == "service_healthy"


def test_load_balancer_error_log_is_redacted(services: dict[str, Any]) -> None:
    # nginx's error log repeats request lines (with ?token=): nginx runs behind a sed filter.
    lb = services["lb"]
    script = lb["entrypoint"][-1]
    mounts = [str(volume) for volume in lb["volumes"]]
    assert f"./deploy/nginx-entrypoint.sh:{script}:ro" in mounts
    text = (ROOT / "deploy" / "nginx-entrypoint.sh").read_text()
    assert re.search(r"sed -u -E 's/\(\[\?&\]token=\)[^/]*/\\1\[redacted\]/g'", text)
    assert re.search(r"^exec nginx -g 'daemon off;' 2>\"\$fifo\"$", text, flags=re.M)


def test_named_volumes_are_declared(compose: dict[str, Any], services: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for service in services.values():
        for volume in service.get("volumes", []):
            source = str(volume).split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in declared, source


def test_nginx_proxies_http_and_websockets_to_the_gateways(nginx: str) -> None:
    assert re.search(r"listen\s+8000\s*;", nginx)
    target = re.search(r"proxy_pass\s+(\S+)\s*;", nginx)
    assert target, "no proxy_pass"
    upstream = target.group(1)
    if upstream.startswith("$"):  # resolved per request through a variable
        assigned = re.search(r"set\s+" + re.escape(upstream) + r"\s+(\S+)\s*;", nginx)
        assert assigned, f"{upstream} is never set"
        upstream = assigned.group(1)
    assert upstream == "http://gateway:8000"
    assert re.search(r"proxy_http_version\s+1\.1\s*;", nginx)
    assert re.search(r"proxy_set_header\s+Upgrade\s+\$http_upgrade\s*;", nginx)
    assert re.search(r"proxy_set_header\s+Connection\s+\$connection_upgrade\s*;", nginx)
    assert re.search(r"map\s+\$http_upgrade\s+\$connection_upgrade", nginx)
    # Idle websockets are kept alive by the server's pings: nginx must wait longer than that.
    for directive in ("proxy_read_timeout", "proxy_send_timeout"):
        timeout = re.search(directive + r"\s+(\d+)s\s*;", nginx)
        assert timeout, directive
        assert int(timeout.group(1)) >= max(600, Settings().ws_ping_interval), directive
    assert re.search(r"proxy_buffering\s+off\s*;", nginx)


def test_nginx_does_not_log_tokens(nginx: str) -> None:
    # `$request` and `$request_uri` include `?token=...` of websocket URLs.
    formats = re.findall(r"log_format[^;]*;", nginx, flags=re.S)
    assert formats and not any(re.search(r"\$request(_uri)?\b", f) for f in formats)
    assert re.search(r"access_log\s+\S+\s+threadline\s*;", nginx)


def test_dockerfile(dockerfile: list[tuple[str, str]]) -> None:
    keywords = [keyword for keyword, _ in dockerfile]
    assert dockerfile[0] == ("FROM", "python:3.11-slim")
    assert any(k == "RUN" and "pip install --no-deps ." in args for k, args in dockerfile)
    # A container never mints (and logs) a development token.
    env = " ".join(args for k, args in dockerfile if k == "ENV")
    assert re.search(r"\bTHREADLINE_DEV_TOKEN=false\b", env)
    assert ("EXPOSE", "8000") in dockerfile
    health = [args for k, args in dockerfile if k == "HEALTHCHECK"]
    assert len(health) == 1 and "/healthz" in health[0]
    users = [args for k, args in dockerfile if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    # The last USER comes before the command, so the server never runs as root.
    last_user = max(index for index, keyword in enumerate(keywords) if keyword == "USER")
    assert last_user < keywords.index("CMD")
    cmd = [args for k, args in dockerfile if k == "CMD"][-1]
    assert "threadline" in cmd and "serve" in cmd


def test_dockerfile_copies_every_package_the_server_imports(
    dockerfile: list[tuple[str, str]],
) -> None:
    """The image installs the packages it copies before `pip install`: each one the server's
    code imports must be among them (a package missing there fails only at the container's
    first start)."""
    ours = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    imported = {
        name.split(".")[0]
        for package in ("runtime", "realtime", "server")
        for path in (ROOT / package).rglob("*.py")
        for name in re.findall(r"^\s*(?:from|import) (\w+)", path.read_text(), re.M)
    } & ours
    install = next(i for i, (k, args) in enumerate(dockerfile) if "pip install --no-deps ." in args)
    copied = {args.split()[0] for k, args in dockerfile[:install] if k == "COPY"}
    assert {"runtime", "realtime", "server", "threadline_wire"} <= imported
    assert imported <= copied, imported - copied


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv"} <= ignored
    assert any("sqlite3" in pattern for pattern in ignored)
    # What the Dockerfile copies must not be ignored.
    needed_paths = ("runtime", "realtime", "server", "threadline_wire", "static", "examples")
    for needed in (*needed_paths, "README.md"):
        assert needed not in ignored


def test_every_base_image_has_a_test_stand_in(services: dict[str, Any]) -> None:
    """tests/deploy builds these only where the public images cannot be pulled."""
    script = (ROOT / "tests" / "deploy" / "ensure-docker.sh").read_text()
    images = {str(s["image"]) for s in services.values() if "build" not in s}
    images.add("python:3.11-slim")
    for image in images:
        name = re.search(r"\[" + re.escape(image) + r"\]=(\w+)", script)
        assert name, image
        assert (ROOT / "tests" / "deploy" / "standins" / f"{name.group(1)}.Dockerfile").is_file()
