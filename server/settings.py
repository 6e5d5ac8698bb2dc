"""Server configuration read from THREADLINE_* environment variables."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.approval_overrides import parse_policies
from runtime.approvals import ApprovalPolicy
from runtime.mcp.config import MCPServer
from runtime.service.permissions import PermissionPolicy, Who
from runtime.storage.retention import RetentionPolicy, parse_duration
from server.oidc import BrowserSignIn, OIDCIssuer

# `30d`, `12h`, `1h30m` or seconds (runtime.storage.retention.parse_duration).
Duration = Annotated[float, BeforeValidator(parse_duration)]
ServerRole = Literal["all", "gateway", "worker"]
# uvicorn's loop setting: auto takes uvloop when it is installed (a dependency), else asyncio's.
EventLoop = Literal["auto", "asyncio", "uvloop"]


class Settings(BaseSettings):
    """Everything defaults to the embedded setup: SQLite file, in-process bus, demo agent."""

    model_config = SettingsConfigDict(env_prefix="THREADLINE_", extra="ignore")

    database_url: str = "sqlite:///./threadline.sqlite3"
    # None selects the in-process bus, which only works when gateway and worker share a process.
    redis_url: str | None = None
    # How long a starting process waits for an unreachable Redis before giving up.
    bus_connect_timeout: float = Field(default=30.0, ge=0)
    agent: str = "runtime.demo:demo_agent"
    # The authorization hook (docs/authorization.md): `module:callable`, asked before every
    # command of every transport. None: today's scope and permission rules alone.
    authorize: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    role: ServerRole = "all"
    # uvloop roughly halves the CPU of each Postgres and Redis round trip (docs/operations.md).
    event_loop: EventLoop = "auto"

    lease_ttl: float = Field(default=15.0, gt=0)
    poll_interval: float = Field(default=1.0, gt=0)
    max_concurrent_runs: int = Field(default=16, ge=1)
    # Bytes of one thread's replay buffer (the in-flight step's chunks for late joiners).
    replay_max_bytes: int = Field(default=1024 * 1024, ge=64 * 1024)

    # Larger websocket frames close the connection with 1009 (docs/protocol.md).
    ws_max_frame_bytes: int = Field(default=64 * 1024, ge=1024)
    # A connection whose unsent frames stay above this bound for ws_slow_consumer_grace seconds
    # (or exceed twice it at once) is closed as a slow consumer (4408); a socket still open
    # ws_close_grace seconds after its close frame is aborted (docs/protocol.md, "Close codes").
    ws_outbox_max_bytes: int = Field(default=1024 * 1024, ge=4096)
    ws_slow_consumer_grace: float = Field(default=5.0, gt=0)
    ws_close_grace: float = Field(default=2.0, gt=0)
    # Protocol-level pings (uvicorn); a peer missing a pong for ws_ping_timeout is dropped.
    ws_ping_interval: float = Field(default=20.0, gt=0)
    ws_ping_timeout: float = Field(default=20.0, gt=0)
    # permessage-deflate: off by default, measured (docs/operations.md, "Compression").
    ws_per_message_deflate: bool = False
    # Presence entries are refreshed this often (seconds); a dead gateway's members vanish
    # from the other gateways within twice this (docs/protocol.md, "Presence").
    presence_refresh: float = Field(default=5.0, ge=0.2)
    http_max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    # --- the garbage collector of `threadline serve` (docs/operations.md, "Garbage
    # collector"): what start-up left alive is frozen out of every later collection; the
    # gen-0 threshold (None: Python's 700); a file to log each collection to (bench/idle.py).
    gc_freeze: bool = True
    gc_threshold: int | None = Field(default=50_000, ge=1)
    gc_log: str | None = None
    # --- connections (docs/operations.md, "Connections and timeouts"): a request's line and
    # headers must be complete this many seconds after the connection opened or the previous
    # response ended; an idle keep-alive connection is closed after http_keep_alive_timeout;
    # beyond max_connections open connections (HTTP and websockets) new requests and upgrades
    # get 503 (lowered to what `ulimit -n` holds).
    http_header_timeout: float = Field(default=10.0, gt=0)
    # A request's body must be complete this long after its headers (a slow body is closed).
    http_body_timeout: float = Field(default=60.0, gt=0)
    http_keep_alive_timeout: float = Field(default=5.0, gt=0)
    max_connections: int = Field(default=10_000, ge=1)

    # --- quotas (docs/operations.md, "Limits"); every default is meant for a public deployment
    # Items waiting in one thread's queue, and the UTF-8 size of their texts together.
    queue_max_items: int = Field(default=50, ge=1)
    queue_max_bytes: int = Field(default=256 * 1024, ge=1024)
    # Queued or running runs of one scope at once; a new run over it is refused.
    scope_max_active_runs: int = Field(default=32, ge=1)
    # Token buckets for commands (writes): sustained rate per second and burst size.
    token_rate: float = Field(default=10.0, gt=0)
    token_burst: int = Field(default=60, ge=1)
    scope_rate: float = Field(default=50.0, gt=0)
    scope_burst: int = Field(default=300, ge=1)
    # Open websockets per token and per subject (across every gateway when Redis is set).
    ws_max_connections_per_token: int = Field(default=32, ge=1)
    ws_max_connections_per_subject: int = Field(default=64, ge=1)
    ws_max_subscriptions: int = Field(default=256, ge=1)
    # Bounded snapshots: the last N messages (older ones page with ?before=), and queued texts
    # cut to a preview of this many characters (the full text: GET …/queue/{item_id}).
    snapshot_messages: int = Field(default=100, ge=1, le=500)
    # Snapshots a gateway keeps of the threads its websockets watch, so a commit watched by
    # many tabs costs one storage read per gateway (server/live/snapshot_cache.py); 0: off.
    snapshot_cache: int = Field(default=1024, ge=0)
    # The largest `invalidate` frame carrying a snapshot delta a gateway sends to connections
    # that subscribed with `"deltas": true` (server/live/snapshot_deltas.py); a larger change
    # goes out as the plain invalidation. 0: no deltas (every client refetches).
    snapshot_delta_max_bytes: int = Field(default=16384, ge=0)
    # Seconds a gateway keeps a `tl_` token's principal (server/auth_cache.py), so a busy token
    # costs no storage read per request; revocations forget it at once on every gateway that
    # hears the broadcast (one that cannot, e.g. no Redis to the CLI: up to this long). 0: off.
    auth_cache_ttl: float = Field(default=1.0, ge=0)
    queue_preview_chars: int = Field(default=500, ge=16)
    # Websocket upgrades whose Origin header is not in this list are refused (HTTP 403).
    # Empty (the default): no check. JSON list, e.g. '["https://chat.example.com"]'.
    ws_allowed_origins: list[str] = Field(default_factory=list)
    # Namespace of this deployment in Redis: every channel, presence hash, replay buffer and
    # control message is named under it, so deployments sharing a Redis (or a Redis Cluster)
    # never see each other's (docs/operations.md, "Several deployments on one Redis"). No
    # braces: the `{thread}` hash tag after it is what a Redis Cluster shards by.
    redis_prefix: str = Field(default="threadline:", min_length=1, pattern=r"^[^{}\s]+$")
    # Namespace of the quota counters; unset, `<redis_prefix>limits:`.
    limits_prefix: str | None = Field(default=None, min_length=1, pattern=r"^[^{}\s]+$")
    # Browser origins allowed to call the HTTP and event-stream routes (CORS; preflight
    # answered). Empty (the default): no CORS headers at all. An origin listed here is also
    # allowed to open websockets when THREADLINE_WS_ALLOWED_ORIGINS checks origins.
    cors_allowed_origins: list[str] = Field(default_factory=list)

    # --- who may take destructive actions (runtime.service.permissions.Who): scope, author,
    # trusted, admin. `scope` everywhere keeps the behaviour of earlier versions; see
    # docs/operations.md.
    permission_regenerate: Who = Who.SCOPE
    permission_visibility: Who = Who.SCOPE
    permission_stop: Who = Who.SCOPE
    permission_cancel_queued: Who = Who.SCOPE

    # MCP servers whose tools every run of this deployment's agent gets, besides the agent's
    # own `mcp_servers`: a JSON list of {"type": "stdio", "name", "command", "args"} and
    # {"type": "http", "name", "url", "secret_headers"} objects (docs/operations.md, "MCP
    # servers"). Secrets are references (env:NAME, file:/path), never values.
    mcp_servers: list[MCPServer] = Field(default_factory=list)
    # Approval policies of this deployment (docs/operations.md, "Approval policies"): a JSON
    # object, or the path of a file holding one, of tool name -> policy; each replaces the
    # policy declared with that tool. Checked here (syntax, fields) and against the agent's
    # tools when the server starts.
    approval_policies: str | None = None

    # --- OIDC issuers whose JWTs are accepted beside `tl_` tokens (docs/operations.md, "OIDC"):
    # a JSON list of {"issuer", "audience", "scopes_claim" | "scope", ...} objects.
    oidc_issuers: list[OIDCIssuer] = Field(default_factory=list)
    # Clock skew allowed on `exp`, `nbf` and `iat` (seconds).
    oidc_leeway: float = Field(default=30.0, ge=0, le=300)
    # Issuer keys are refetched after this long, and on an unknown `kid` at most this often.
    oidc_jwks_max_age: float = Field(default=600.0, gt=0)
    oidc_jwks_min_refresh: float = Field(default=30.0, ge=0)
    # The browser client signs in at this issuer (one of `oidc_issuers`) when set: a JSON
    # {"issuer", "client_id", "scopes"?, "params"?} object; unset, it takes a `tl_` token.
    oidc_browser: BrowserSignIn | None = None

    dev_scope: str = "demo"
    # `threadline serve` mints a development token and prints a browser URL carrying it.
    dev_token: bool = True
    log_level: str = "info"
    # Schedules and webhooks (docs/operations.md, "Schedules" and "Webhooks").
    timer_poll_interval: float = Field(default=0.25, gt=0)
    # How long a worker holds a due timer (a schedule's fire, an approval deadline) before
    # another worker may take it over; a fire takes one transaction, so seconds are plenty.
    timer_lease_ttl: float = Field(default=30.0, gt=0)
    schedules_per_scope: int = Field(default=100, ge=1)
    webhooks_per_scope: int = Field(default=20, ge=1)
    # Networks webhooks may reach although private, loopback or link-local (comma-separated
    # CIDRs, e.g. `127.0.0.0/8,::1/128`); empty: public addresses only.
    webhook_allow_networks: str = ""
    webhook_timeout: float = Field(default=10.0, gt=0, le=120)
    webhook_initial_backoff: float = Field(default=1.0, gt=0)
    webhook_max_backoff: float = Field(default=300.0, gt=0)
    webhook_max_age: float = Field(default=24 * 3600.0, gt=0)
    webhook_max_response_bytes: int = Field(default=64 * 1024, ge=1024)
    webhook_poll_interval: float = Field(default=0.5, gt=0)
    # Threads idle longer than this are deleted (docs/operations.md, "Thread retention"),
    # looked for every thread_retention_interval by one worker of the deployment. None: kept.
    thread_retention: Duration | None = None
    thread_retention_interval: Duration = 3600.0

    # --- operations (docs/operations.md, "Metrics", "Logs", "Shutdown")
    # Prometheus exposition at /metrics; with metrics_port set, on that port only.
    metrics_enabled: bool = True
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    # `text` (one line per event) or `json` (one JSON object per line) for app and uvicorn.
    log_format: Literal["text", "json"] = "text"
    # Seconds open streams and websockets get after SIGTERM before they are closed.
    shutdown_grace: float = Field(default=5.0, ge=0, le=300)

    @field_validator("approval_policies")
    @classmethod
    def _policies_parse(cls, value: str | None) -> str | None:
        if value is not None:
            parse_policies(value)
        return value

    @property
    def policy_overrides(self) -> dict[str, ApprovalPolicy]:
        return {} if self.approval_policies is None else parse_policies(self.approval_policies)

    @model_validator(mode="after")
    def _cors_origins_may_open_websockets(self) -> Settings:
        # One browser app, one answer: an origin allowed over HTTP is never refused on the
        # websocket. An empty websocket list checks nothing, and stays so.
        if self.ws_allowed_origins:
            extra = [o for o in self.cors_allowed_origins if o not in self.ws_allowed_origins]
            self.ws_allowed_origins = [*self.ws_allowed_origins, *extra]
        return self

    @model_validator(mode="after")
    def _browser_issuer_is_trusted(self) -> Settings:
        # A sign-in whose tokens the server would refuse is a configuration mistake.
        trusted = {issuer.issuer for issuer in self.oidc_issuers}
        if self.oidc_browser is not None and self.oidc_browser.issuer not in trusted:
            raise ValueError("THREADLINE_OIDC_BROWSER names an issuer not in OIDC_ISSUERS")
        return self

    @property
    def retention(self) -> RetentionPolicy | None:
        if self.thread_retention is None:
            return None
        return RetentionPolicy(
            idle_for=self.thread_retention, interval=self.thread_retention_interval
        )

    @property
    def permissions(self) -> PermissionPolicy:
        return PermissionPolicy(
            regenerate=self.permission_regenerate,
            visibility=self.permission_visibility,
            stop=self.permission_stop,
            cancel_queued=self.permission_cancel_queued,
        )

    @property
    def counters_prefix(self) -> str:
        """Where the quota counters live in Redis: their own prefix, else under the bus's."""
        return self.limits_prefix or f"{self.redis_prefix}limits:"

    @property
    def runs_gateway(self) -> bool:
        return self.role in ("all", "gateway")

    @property
    def runs_worker(self) -> bool:
        return self.role in ("all", "worker")
