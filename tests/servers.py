"""Throwaway PostgreSQL clusters and Redis servers on free loopback ports, for tests and benches."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
# A free port can be taken by someone else between our probe and the server's bind: retry.
PORT_ATTEMPTS = 3
DIR_PREFIXES = ("threadline-pg-", "threadline-redis-")
OWNER_FILE = "owner.pid"


class ServiceUnavailable(RuntimeError):
    """The server's programs are not installed (the caller decides: skip, or fail under CI)."""


class ServiceFailed(RuntimeError):
    """The programs exist but the server did not come up: always an error."""


# --- finding programs --------------------------------------------------------------------


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path)) or (0,)


def postgres_bindir() -> Path:
    """The directory holding `initdb` and `postgres`: PATH first, then Debian's versioned
    /usr/lib/postgresql/<ver>/bin (newest), which is not on PATH."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(os.path.realpath(on_path)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version_key)
    if candidates:
        return Path(candidates[-1]).parent
    raise ServiceUnavailable(
        "PostgreSQL server programs (initdb, postgres) are not installed"
        " (apt-get install postgresql, or set THREADLINE_TEST_POSTGRES_DSN)"
    )


def redis_server_program() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise ServiceUnavailable(
            "redis-server is not installed"
            " (apt-get install redis-server, or set THREADLINE_TEST_REDIS_URL)"
        )
    return found


# --- process plumbing --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_as() -> pwd.struct_passwd | None:
    """PostgreSQL refuses to run as root: as root, run it as `postgres` (Debian's package
    creates that user) or else `nobody`. None: run as ourselves."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ServiceFailed("running as root and neither user `postgres` nor `nobody` exists")


def _die_with_us(signal_name: str) -> list[str]:
    """A prefix that makes the server die with the thread that starts it, so a test run killed
    outright leaves no server behind. Only from the main thread: the kernel signals when the
    creating *thread* ends, and helper threads end early."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return []
    return [setpriv, f"--pdeathsig={signal_name}", "--"]


def _make_dir(prefix: str, user: pwd.struct_passwd | None) -> Path:
    """A private directory for one server, marked with our pid so a later run can sweep it if
    we die without cleaning up. Under /tmp when switching user: TMPDIR may not be traversable
    for that user."""
    sweep_stale_dirs()
    base = "/tmp" if user is not None and os.path.isdir("/tmp") else None
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    (directory / OWNER_FILE).write_text(str(os.getpid()))
    if user is not None:
        os.chown(directory, user.pw_uid, user.pw_gid)
    return directory


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_dirs() -> None:
    """Remove server directories whose owning process is gone (a run that was killed)."""
    base = tempfile.gettempdir()
    for root in {base, "/tmp"}:
        for prefix in DIR_PREFIXES:
            for path in glob.glob(os.path.join(root, prefix + "*")):
                owner = Path(path) / OWNER_FILE
                with contextlib.suppress(OSError, ValueError):
                    if not _pid_alive(int(owner.read_text())):
                        shutil.rmtree(path, ignore_errors=True)


def _stop_process(process: subprocess.Popen[bytes], sig: int) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT)


def _log_tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-3000:]
    return ""


# --- PostgreSQL --------------------------------------------------------------------------


class PostgresServer:
    """One throwaway cluster: initdb into a temp dir, trust auth, a free port on 127.0.0.1,
    its unix socket in the same dir. Durability against a crash of the machine is off (fsync,
    full-page writes): no test survives one. A crash of Postgres itself must lose nothing it
    acknowledged, since the campaign crashes it (`restart(immediate=True)`) and checks that every
    acknowledged write is kept: so `synchronous_commit` stays on (a commit is written to the
    OS before it is acknowledged; unflushed, which a process crash does not lose). With it off,
    a crash dropped the last ~200 ms of acknowledged commits (issue 34's "lost sends").
    `stop()` shuts it down and removes the directory."""

    def __init__(self) -> None:
        self.bindir = postgres_bindir()
        self.user = _run_as()
        self.directory = _make_dir("threadline-pg-", self.user)
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """The admin DSN: superuser `postgres`, database `postgres`."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _spawn(self, args: list[str], **options: object) -> subprocess.Popen[bytes]:
        ids: dict[str, object] = {}
        if self.user is not None:
            ids = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        return subprocess.Popen(args, cwd=self.directory, **ids, **options)  # type: ignore[call-overload, no-any-return]

    def start(self) -> PostgresServer:
        try:
            self._initdb()
            for _attempt in range(PORT_ATTEMPTS):
                self.port = free_port()
                if self._launch():
                    return self
            raise ServiceFailed(f"PostgreSQL did not start:\n{_log_tail(self.log)}")
        except BaseException:
            self.stop()
            raise

    def _initdb(self) -> None:
        initdb = self._spawn(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        output, _ = initdb.communicate(timeout=120)
        if initdb.returncode != 0:
            raise ServiceFailed(f"initdb failed ({initdb.returncode}):\n{output.decode()[-3000:]}")

    def _launch(self) -> bool:
        """Start the postmaster on self.port; False when it exited (e.g. the port was taken)."""
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.directory),
            "fsync": "off",
            # Not "off": a crash restart would drop acknowledged commits (class docstring).
            "synchronous_commit": "on",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
        }
        args = [
            *_die_with_us("SIGQUIT"),
            str(self.bindir / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
        ]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        with open(self.log, "ab") as log:
            self._process = self._spawn(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False
            if self._ready():
                return True
            time.sleep(0.05)
        raise ServiceFailed(f"PostgreSQL not ready after {START_TIMEOUT:.0f} s")

    def restart(self, immediate: bool) -> None:
        """Postgres goes down and comes back on its port, data kept: a fast shutdown (open
        sessions ended, a checkpoint) or, `immediate`, a crash (crash recovery on start)."""
        if self._process is not None:
            _stop_process(self._process, signal.SIGQUIT if immediate else signal.SIGINT)
            self._process = None
        for _attempt in range(PORT_ATTEMPTS):  # the port may linger a moment
            if self._launch():
                return
            time.sleep(0.2)
        raise ServiceFailed(f"PostgreSQL did not come back:\n{_log_tail(self.log)}")

    def _ready(self) -> bool:
        # postmaster.pid's last line says "ready" once connections are accepted.
        with contextlib.suppress(OSError):
            lines = (self.data / "postmaster.pid").read_text().splitlines()
            return len(lines) >= 8 and lines[7].strip() == "ready"
        return False

    def stop(self) -> None:
        if self._process is not None:
            # SIGINT is the fast shutdown: open sessions are ended, not waited for.
            _stop_process(self._process, signal.SIGINT)
            self._process = None
        shutil.rmtree(self.directory, ignore_errors=True)


# --- Redis -------------------------------------------------------------------------------


class RedisServer:
    """One throwaway redis-server on a free loopback port, no persistence; `stop()` ends it
    and removes its directory."""

    def __init__(self) -> None:
        self.program = redis_server_program()
        self.directory = _make_dir("threadline-redis-", None)
        self.log = self.directory / "server.log"
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        try:
            for _attempt in range(PORT_ATTEMPTS):
                self.port = free_port()
                if self._launch():
                    return self
            raise ServiceFailed(f"redis-server did not start:\n{_log_tail(self.log)}")
        except BaseException:
            self.stop()
            raise

    def _launch(self) -> bool:
        args = [
            *_die_with_us("SIGTERM"),
            self.program,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
            "--daemonize",
            "no",
            "--maxclients",
            "2000",
        ]
        with open(self.log, "ab") as log:
            self._process = subprocess.Popen(
                args,
                cwd=self.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False
            if self._pings():
                return True
            time.sleep(0.05)
        raise ServiceFailed(f"redis-server not ready after {START_TIMEOUT:.0f} s")

    def _pings(self) -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as conn,
        ):
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
        return False

    def stop(self) -> None:
        if self._process is not None:
            _stop_process(self._process, signal.SIGTERM)
            self._process = None
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def own_postgres_server() -> Iterator[str]:
    """A throwaway cluster for the block; yields its admin DSN."""
    server = PostgresServer().start()
    try:
        yield server.address
    finally:
        server.stop()


@contextlib.contextmanager
def own_redis_server() -> Iterator[str]:
    """A throwaway redis-server for the block; yields its URL."""
    server = RedisServer().start()
    try:
        yield server.address
    finally:
        server.stop()


# --- Redis Cluster -----------------------------------------------------------------------


class RedisClusterServer:
    """A throwaway Redis Cluster: `masters` masters with one replica each, every node a
    redis-server on a free loopback port, slots split evenly by `redis-cli --cluster create`.
    A short node timeout lets a replica take over within about a second of its master dying
    (the failover tests). `stop()` ends every node and removes the directory."""

    NODE_TIMEOUT_MS = 1000

    def __init__(self, masters: int = 3) -> None:
        self.program = redis_server_program()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise ServiceUnavailable("redis-cli is not installed (apt-get install redis-tools)")
        self.cli = cli
        self.masters = masters
        self.directory = _make_dir("threadline-redis-", None)
        self.ports: list[int] = []
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def address(self) -> str:
        """The cluster URL the bus understands: every node as a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self) -> RedisClusterServer:
        try:
            for _ in range(self.masters * 2):
                self.ports.append(self._launch_node())
            nodes = [f"127.0.0.1:{port}" for port in self.ports]
            create = subprocess.run(
                [
                    self.cli,
                    "--cluster",
                    "create",
                    *nodes,
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                capture_output=True,
                timeout=START_TIMEOUT,
                check=False,
            )
            if create.returncode != 0:
                output = create.stdout[-3000:].decode(errors="replace")
                raise ServiceFailed(f"redis-cli --cluster create failed:\n{output}")
            self.wait_ready()
            return self
        except BaseException:
            self.stop()
            raise

    def _node_args(self, port: int) -> list[str]:
        return [
            *_die_with_us("SIGTERM"),
            self.program,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory / str(port)),
            "--daemonize",
            "no",
            "--maxclients",
            "2000",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.NODE_TIMEOUT_MS),
            # A replica may take over however far behind it is: nothing here persists.
            "--cluster-replica-validity-factor",
            "0",
        ]

    @staticmethod
    def _free_node_port() -> int:
        """A free port whose cluster bus port (port + 10000, at most 65535) is free too."""
        for _attempt in range(200):
            port = free_port()
            if port > 55535:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port
        raise ServiceFailed("no free port pair (port, port + 10000) for a cluster node")

    def _launch_node(self) -> int:
        for _attempt in range(PORT_ATTEMPTS):
            port = self._free_node_port()
            node_dir = self.directory / str(port)
            node_dir.mkdir()
            args = self._node_args(port)
            with open(node_dir / "server.log", "ab") as log:
                process = subprocess.Popen(
                    args,
                    cwd=node_dir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline and process.poll() is None:
                if self.command(port, "PING").startswith("PONG"):
                    self._processes[port] = process
                    return port
                time.sleep(0.05)
            _stop_process(process, signal.SIGKILL)
        raise ServiceFailed(
            f"a Redis Cluster node did not start:\n{_log_tail(node_dir / 'server.log')}"
        )

    def command(self, port: int, *args: str) -> str:
        """One command through redis-cli to the node on `port`; its output ('' on failure)."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            done = subprocess.run(
                [self.cli, "-p", str(port), *args], capture_output=True, timeout=5, check=False
            )
            return done.stdout.decode(errors="replace")
        return ""

    def live_ports(self) -> list[int]:
        return [port for port, process in self._processes.items() if process.poll() is None]

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until every live node says the cluster is ok and there are `masters` live masters."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ports = self.live_ports()
            if (
                all("cluster_state:ok" in self.command(p, "CLUSTER", "INFO") for p in ports)
                and len(self.master_ports()) == self.masters
                and self._replicas_linked()
            ):
                return
            time.sleep(0.05)
        raise ServiceFailed(f"Redis Cluster not ok after {timeout:.0f} s")

    def _replicas_linked(self) -> bool:
        """Every live replica is in sync with its master (a failover needs one)."""
        for port in self.live_ports():
            info = self.command(port, "INFO", "replication")
            if "role:slave" in info and "master_link_status:up" not in info:
                return False
        return True

    def master_ports(self) -> list[int]:
        """Live nodes that see themselves as master of some slots."""
        masters = []
        for port in self.live_ports():
            for line in self.command(port, "CLUSTER", "NODES").splitlines():
                fields = line.split()
                if len(fields) > 8 and "myself" in fields[2] and "master" in fields[2]:
                    masters.append(port)
        return masters

    def master_of(self, slot: int) -> int:
        """The port of the live master serving `slot` (from CLUSTER NODES)."""
        for port in self.master_ports():
            for line in self.command(port, "CLUSTER", "NODES").splitlines():
                fields = line.split()
                if len(fields) > 8 and "myself" in fields[2]:
                    for span in fields[8:]:
                        start, _, end = span.partition("-")
                        if start.isdigit() and int(start) <= slot <= int(end or start):
                            return port
        raise ServiceFailed(f"no live master serves slot {slot}")

    def replica_ports(self) -> list[int]:
        return [port for port in self.live_ports() if port not in self.master_ports()]

    def kill(self, port: int) -> None:
        """Kill one node outright (SIGKILL): a crashed master, for its replica to replace."""
        _stop_process(self._processes[port], signal.SIGKILL)

    def restart(self, port: int) -> None:
        """Start a killed node again on its port; it rejoins (as a replica of its successor)."""
        node_dir = self.directory / str(port)
        args = self._node_args(port)
        with open(node_dir / "server.log", "ab") as log:
            self._processes[port] = subprocess.Popen(
                args, cwd=node_dir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def stop(self) -> None:
        for process in self._processes.values():
            _stop_process(process, signal.SIGTERM)
        self._processes.clear()
        shutil.rmtree(self.directory, ignore_errors=True)
